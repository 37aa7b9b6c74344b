// fast_layout_test.cc: the fast kernel's mma operand maps (kernels/verify/fast_layout.h) on the
// host: values written where the kernel writes them, read into fragments where the kernel reads
// them, multiplied as mma.sync m16n8k8 multiplies its fragments (mma_tf32.cuh's layout), and
// stored where the kernel stores the accumulators, give W = X S^T: every key of every pair and
// step taken exactly once, every row and column where it belongs, no word written twice. Values
// are small integers, so the sums are exact and the check is equality.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/verify/fast_layout.h"

namespace fl = kda::kernels::fast_layout;

namespace {

struct Elem {
  int row, col;
};
// m16n8k8 .row.col fragments (g = lane / 4, tig = lane % 4).
Elem a_elem(int lane, int reg) {  // A 16 x 8: (row, k slot)
  const int g = lane / 4, tig = lane % 4;
  return {g + 8 * (reg & 1), tig + 4 * (reg >> 1)};
}
Elem b_elem(int lane, int reg) {  // B 8 x 8: (k slot, column)
  return {lane % 4 + 4 * reg, lane / 4};
}
Elem c_elem(int lane, int reg) {  // C 16 x 8: (row, column)
  return {lane / 4 + 8 * (reg >> 1), 2 * (lane % 4) + (reg & 1)};
}

using Mat = std::vector<std::vector<double>>;
Mat random_mat(int rows, int cols, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-8, 8);
  Mat m(static_cast<size_t>(rows), std::vector<double>(static_cast<size_t>(cols)));
  for (auto& r : m) {
    for (double& x : r) {
      x = d(rng);
    }
  }
  return m;
}
double dot(const std::vector<double>& x, const std::vector<double>& y) {
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    s += x[i] * y[i];
  }
  return s;
}

/// The state stage: S [BV][K] at swz; every index distinct and inside the array.
template <int K>
std::vector<double> stage_of(const Mat& S) {
  const int rows = static_cast<int>(S.size());
  std::vector<double> st(static_cast<size_t>(rows) * K, NAN);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < K; ++k) {
      const int at = fl::swz<K>(r, k);
      REQUIRE(at >= 0);
      REQUIRE(at < rows * K);
      REQUIRE(std::isnan(st[static_cast<size_t>(at)]));
      st[static_cast<size_t>(at)] = S[r][k];
    }
  }
  return st;
}

template <int R, int C>
void fill_nan(double (&m)[R][C]) {
  for (auto& row : m) {
    for (double& x : row) {
      x = NAN;
    }
  }
}
template <int R, int C>
void require_full(const double (&m)[R][C]) {
  for (const auto& row : m) {
    for (const double x : row) {
      REQUIRE_FALSE(std::isnan(x));
    }
  }
}

// C (16 x 8) += A (16 x 8) B (8 x 8) once every element of A and B is set (none left NaN).
void mma(double (&C)[16][8], const double (&A)[16][8], const double (&B)[8][8]) {
  require_full(A);
  require_full(B);
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 8; ++n) {
      for (int s = 0; s < 8; ++s) {
        C[r][n] += A[r][s] * B[s][n];
      }
    }
  }
}

// One k-step's fragments, gathered lane by lane.
struct Frags {
  double A[16][8], B[8][8];
};
/// C += the product of every pair j and step's fragments, each gathered by
/// gather(j, step, lane, frags) for lanes 0..31 (a lane sets the elements it holds).
template <int K, typename Gather>
void accumulate(double (&C)[16][8], const Gather& gather) {
  for (int j = 0; j < K / 16; ++j) {
    for (int step = 0; step < 2; ++step) {
      Frags f;
      fill_nan(f.A);
      fill_nan(f.B);
      for (int lane = 0; lane < 32; ++lane) {
        gather(j, step, lane, f);
      }
      mma(C, f.A, f.B);
    }
  }
}

/// The wide form: row tiles of 8 keys + 8 queries as A (fragment order), state tiles as B.
template <int K, int BV>
void check_wide(int tiles, std::mt19937& rng) {
  const Mat S = random_mat(BV, K, rng);
  const std::vector<double> st = stage_of<K>(S);
  for (int part = 0; part < 2; ++part) {
    const Mat X = random_mat(16 * tiles, K, rng);  // row 16 m + r: row r of row tile m
    std::vector<double> op(static_cast<size_t>(tiles) * fl::kWideTileWords<K>, NAN);
    for (int m = 0; m < tiles; ++m) {
      for (int r = 0; r < 16; ++r) {
        for (int k = 0; k < K; ++k) {
          const size_t at =
              static_cast<size_t>(m) * fl::kWideTileWords<K> + fl::wide_word<K>(part, r, k);
          REQUIRE(at < op.size());
          REQUIRE(std::isnan(op[at]));
          op[at] = X[16 * m + r][k];
        }
      }
    }
    for (int m = 0; m < tiles; ++m) {
      for (int nt = 0; nt < BV / 8; ++nt) {
        double C[16][8] = {};
        accumulate<K>(C, [&](int j, int step, int lane, Frags& f) {
          const int g = lane / 4, tig = lane % 4;
          for (int reg = 0; reg < 4; ++reg) {
            const Elem e = a_elem(lane, reg);
            f.A[e.row][e.col] = op[static_cast<size_t>(m) * fl::kWideTileWords<K> +
                                   fl::wide_a_word<K>(part, j, step, lane) + reg];
          }
          const int chunk = fl::swz<K>(nt * 8 + g, 16 * j + 4 * tig);
          for (int reg = 0; reg < 2; ++reg) {
            const Elem e = b_elem(lane, reg);
            f.B[e.row][e.col] = st[static_cast<size_t>(chunk + 2 * step + reg)];
            // The slot's key is the header's map, for A and B alike.
            REQUIRE(fl::slot_key(j, step, e.row) == 16 * j + 4 * tig + 2 * step + reg);
          }
        });
        // c0, c1 -> W[m * 8 + g][nt * 8 + 2 tig + e], c2, c3 -> QS[...]: rows r < 8 keys, r >= 8
        // queries of the tile, so C[r][n] = X[16 m + r] . S[nt * 8 + n].
        for (int lane = 0; lane < 32; ++lane) {
          for (int reg = 0; reg < 4; ++reg) {
            const Elem e = c_elem(lane, reg);
            CAPTURE(K, BV, tiles, part, m, nt, lane, reg);
            REQUIRE(C[e.row][e.col] == dot(X[16 * m + e.row], S[nt * 8 + e.col]));
          }
        }
      }
    }
  }
}

/// The narrow form: state tiles of 16 rows as A, the 4 keys and 4 queries as B.
template <int K, int BV>
void check_narrow(std::mt19937& rng) {
  const Mat S = random_mat(BV, K, rng);
  const std::vector<double> st = stage_of<K>(S);
  for (int part = 0; part < 2; ++part) {
    const Mat X = random_mat(8, K, rng);  // rows 0..3 keys, 4..7 queries
    std::vector<double> op(static_cast<size_t>(2) * 8 * K, NAN);
    for (int r = 0; r < 8; ++r) {
      for (int k = 0; k < K; ++k) {
        const size_t at = static_cast<size_t>(fl::narrow_word<K>(part, r, k));
        REQUIRE(at < op.size());
        REQUIRE(std::isnan(op[at]));
        op[at] = X[r][k];
      }
    }
    std::vector<double> out(static_cast<size_t>(16) * BV, NAN);  // W: 8 BV words, then QS
    for (int mt = 0; mt < BV / 16; ++mt) {
      double C[16][8] = {};
      accumulate<K>(C, [&](int j, int step, int lane, Frags& f) {
        const int g = lane / 4, tig = lane % 4;
        const int k = 16 * j + 4 * tig;
        const int x0 = fl::swz<K>(16 * mt + g, k), x1 = fl::swz<K>(16 * mt + g + 8, k);
        const double quad[4] = {
            st[static_cast<size_t>(x0 + 2 * step)], st[static_cast<size_t>(x1 + 2 * step)],
            st[static_cast<size_t>(x0 + 2 * step + 1)], st[static_cast<size_t>(x1 + 2 * step + 1)]};
        for (int reg = 0; reg < 4; ++reg) {
          const Elem e = a_elem(lane, reg);
          f.A[e.row][e.col] = quad[reg];
        }
        const int xb = fl::narrow_word<K>(part, g, k);
        for (int reg = 0; reg < 2; ++reg) {
          const Elem e = b_elem(lane, reg);
          f.B[e.row][e.col] = op[static_cast<size_t>(xb + 2 * step + reg)];
        }
      });
      for (int lane = 0; lane < 32; ++lane) {
        for (int reg = 0; reg < 4; ++reg) {
          const Elem e = c_elem(lane, reg);
          const size_t at =
              static_cast<size_t>(fl::narrow_out_word<BV>(reg, lane / 4, lane % 4, mt));
          REQUIRE(at < out.size());
          REQUIRE(std::isnan(out[at]));
          out[at] = C[e.row][e.col];
        }
      }
    }
    // W[t][v] = key t . S[v] at word t BV + v; QS[t][v] = query t . S[v] at 8 BV + t BV + v.
    for (int t = 0; t < 4; ++t) {
      for (int v = 0; v < BV; ++v) {
        CAPTURE(K, BV, part, t, v);
        REQUIRE(out[static_cast<size_t>(t) * BV + v] == dot(X[t], S[v]));
        REQUIRE(out[static_cast<size_t>(8 + t) * BV + v] == dot(X[4 + t], S[v]));
      }
    }
  }
}

}  // namespace

TEST_CASE("fast layout: the wide form's fragments multiply to X S^T", "[kernels][fast]") {
  std::mt19937 rng(11);
  for (const int tiles : {1, 2}) {
    check_wide<64, 32>(tiles, rng);
    check_wide<64, 128>(tiles, rng);
    check_wide<128, 32>(tiles, rng);
    check_wide<128, 64>(tiles, rng);
    check_wide<128, 128>(tiles, rng);
  }
}

TEST_CASE("fast layout: the narrow form's fragments multiply to X S^T", "[kernels][fast]") {
  std::mt19937 rng(12);
  check_narrow<64, 32>(rng);
  check_narrow<64, 128>(rng);
  check_narrow<128, 32>(rng);
  check_narrow<128, 64>(rng);
  check_narrow<128, 128>(rng);
}
