// example.cc: seeded example replay directories.
#include "tools/replay/example.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "tools/replay/problem.h"

namespace kda::replay {
namespace {

// Box-Muller over mt19937_64 (both fully specified), so a seed gives the same files with any
// standard library; std::normal_distribution is implementation-defined.
class Normal {
 public:
  explicit Normal(uint64_t seed) : gen_(seed) {}
  float operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(gen_() >> 11) + 1.0) * 0x1p-53;  // (0, 1]
    const double u2 = static_cast<double>(gen_() >> 11) * 0x1p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
  }
  uint64_t next_u64() { return gen_(); }

 private:
  std::mt19937_64 gen_;
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

std::vector<float> randn(Normal& rng, int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = rng() * scale;
  }
  return v;
}

std::vector<bf16_t> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = float_to_bf16(v[i]);
  }
  return out;
}

// Overwrites the rows of request `n` (T rows of `row` elements) with NaN.
template <typename T>
void poison_rows(std::vector<T>& v, int64_t first, int64_t count, int64_t row) {
  const T nan = [] {
    if constexpr (std::is_same_v<T, bf16_t>) {
      return float_to_bf16(std::numeric_limits<float>::quiet_NaN());
    } else {
      return std::numeric_limits<float>::quiet_NaN();
    }
  }();
  std::fill(v.begin() + first * row, v.begin() + (first + count) * row, nan);
}

}  // namespace

Manifest make_example(const std::string& dir, const ExampleOptions& o) {
  KDA_CHECK(o.B >= 1 && o.T >= 1 && o.H >= 1 && o.HV >= 1 && o.K >= 1 && o.V >= 1,
            "make-example: B={} T={} H={} HV={} K={} V={} must all be >= 1", o.B, o.T, o.H, o.HV,
            o.K, o.V);
  KDA_CHECK(o.HV % o.H == 0, "make-example: HV={} is not a multiple of H={}", o.HV, o.H);
  KDA_CHECK(o.T_max == 0 || o.T_max >= o.T, "make-example: T_max={} is smaller than T={}", o.T_max,
            o.T);
  KDA_CHECK(o.extra_slots >= 0, "make-example: extra slots {} must be >= 0", o.extra_slots);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KDA_CHECK_CODE(!ec, ErrorCode::kIo, "make-example: cannot create {}: {}", dir, ec.message());

  Manifest m;
  m.B = o.B;
  m.T = o.T;
  m.H = o.H;
  m.HV = o.HV;
  m.K = o.K;
  m.V = o.V;
  m.lower_bound = o.lower_bound;
  m.L = o.L;
  if (o.T_max > 0) {
    m.T_max = o.T_max;
  }
  m.mode = o.mode;
  m.conv_state_layout = o.conv_layout;
  m.conv_window_layout = o.conv_layout;
  m.comment = "kda_replay --make-example (seed " + std::to_string(o.seed) + ")";

  const int64_t B = o.B, T = o.T, H = o.H, HV = o.HV, K = o.K, V = o.V;
  KDA_CHECK(o.draft_shape == "chain" || o.draft_shape == "ragged" || o.draft_shape == "tree",
            "make-example: --draft-shape {} unknown, expected chain, ragged or tree",
            o.draft_shape);
  KDA_CHECK(o.draft_shape != "tree" || T <= kMaxTreeNodes,
            "make-example: a tree has at most {} nodes, got --T {}", kMaxTreeNodes, T);
  const bool ragged = o.draft_shape == "ragged", tree = o.draft_shape == "tree";
  std::vector<int32_t> qsl = {0};  // ragged: request n's first row
  for (int64_t n = 0; n < B; ++n) {
    qsl.push_back(qsl.back() + static_cast<int32_t>(ragged ? T - n % T : T));
  }
  const int64_t N = qsl.back(), D = m.D(), S = B + o.extra_slots, W1 = kConvHistory;
  const int64_t Ta = o.T_max > 0 ? o.T_max : T;
  const int64_t L = o.L, R = o.rows ? B + 1 : B;
  const int pad = o.pad_request ? (o.B > 1 ? 1 : 0) : -1;
  Normal rng(o.seed);

  auto write = [&](const std::string& name, const std::vector<int64_t>& shape, const auto& values) {
    npy::write_npy(dir + "/" + name + ".npy", shape, values, o.bf16);
    m.tensors[name] = name + ".npy";
  };

  // Contract §6 scales.
  std::vector<bf16_t> qkv = to_bf16(randn(rng, N * D, 0.5f));
  std::vector<bf16_t> a = to_bf16(randn(rng, N * HV * K, 0.5f));
  std::vector<bf16_t> b = to_bf16(randn(rng, N * HV, 1.0f));
  if (pad >= 0) {  // a padding request's inputs may be anything: NaN proves they are not read
    const int64_t first = qsl[static_cast<size_t>(pad)];
    const int64_t count = qsl[static_cast<size_t>(pad) + 1] - first;
    poison_rows(qkv, first, count, D);
    poison_rows(a, first, count, HV * K);
    poison_rows(b, first, count, HV);
  }
  write("mixed_qkv", {N, D}, qkv);
  write("a", {N, HV * K}, a);
  write("b", {N, HV}, b);
  write("A_log", {HV}, randn(rng, HV, 0.5f));
  write("dt_bias", {HV * K}, randn(rng, HV * K, 0.5f));
  const std::vector<float> w = randn(rng, D * kConvWidth, 0.3f);
  const std::vector<float> bias = randn(rng, D, 0.1f);
  if (o.conv_bf16) {
    write("conv_weight", {D, kConvWidth}, to_bf16(w));
  } else {
    write("conv_weight", {D, kConvWidth}, w);
  }
  if (o.bias) {
    if (o.conv_bf16) {
      write("conv_bias", {D}, to_bf16(bias));
    } else {
      write("conv_bias", {D}, bias);
    }
  }
  const std::vector<bf16_t> conv_state = to_bf16(randn(rng, S * W1 * D, 0.5f));
  if (o.conv_layout == ConvLayout::kSWD) {
    write("conv_state", {S, W1, D}, conv_state);
  } else {
    write("conv_state", {S, D, W1}, transpose_last2(conv_state, S, W1, D));
  }
  write("ssm_state", {S, HV, V, K}, randn(rng, S * HV * V * K, 0.2f));

  std::vector<int32_t> slots(static_cast<size_t>(B)), rows(static_cast<size_t>(B));
  std::vector<int32_t> accepted(static_cast<size_t>(B));
  for (int n = 0; n < o.B; ++n) {
    slots[static_cast<size_t>(n)] = static_cast<int32_t>(S - 1 - n);
    rows[static_cast<size_t>(n)] = static_cast<int32_t>(B - n);
    accepted[static_cast<size_t>(n)] = static_cast<int32_t>(1 + rng.next_u64() % T);
  }
  if (pad >= 0) {
    slots[static_cast<size_t>(pad)] = -1;
    rows[static_cast<size_t>(pad)] = 1 << 20;  // never read
  }
  write("slots", {B}, slots);
  if (o.rows) {
    write("rows", {B}, rows);
    m.R = static_cast<int>(R);
  }
  if (ragged) {
    write("query_start_loc", {B + 1}, qsl);
    for (int64_t n = 0; n < B; ++n) {  // n_i <= T_i
      int32_t& acc = accepted[static_cast<size_t>(n)];
      acc = 1 + (acc - 1) % (qsl[static_cast<size_t>(n) + 1] - qsl[static_cast<size_t>(n)]);
    }
  }
  if (tree) {
    std::vector<int32_t> parents, paths(static_cast<size_t>(B * T), -1);
    for (int64_t n = 0; n < B; ++n) {
      for (int64_t j = 0; j < T; ++j) {
        parents.push_back(j == 0 ? -1 : static_cast<int32_t>((j - 1) / 2));
      }
      std::vector<int32_t> path;
      for (int64_t j = T - 1 - n % T; j >= 0; j = j == 0 ? -1 : (j - 1) / 2) {
        path.insert(path.begin(), static_cast<int32_t>(j));
      }
      std::copy(path.begin(), path.end(), paths.begin() + n * T);
      accepted[static_cast<size_t>(n)] = static_cast<int32_t>(path.size());
    }
    write("parents", {B, T}, parents);
    if (o.accepted) {
      write("accepted_paths", {B, T}, paths);
    }
  }
  if (o.accepted) {
    write("accepted", {B}, accepted);
  }

  if (o.prefill) {  // finite non-zero garbage: a write that is missed or misplaced shows
    const std::vector<bf16_t> window = to_bf16(randn(rng, R * Ta * W1 * D, 1.0f));
    if (o.conv_layout == ConvLayout::kSWD) {
      write("conv_window", {R, Ta, W1, D}, window);
    } else {
      write("conv_window", {R, Ta, D, W1}, transpose_last2(window, R * Ta, W1, D));
    }
    write("snapshots", {R, Ta, HV, V, K}, randn(rng, R * Ta * HV * V * K, 1.0f));
    write("ring_rawv", {S, HV, L, V}, to_bf16(randn(rng, S * HV * L * V, 1.0f)));
    write("ring_rawk", {S, H, L, K}, to_bf16(randn(rng, S * H * L * K, 1.0f)));
    write("ring_g", {S, HV, L, K}, randn(rng, S * HV * L * K, 1.0f));
    write("ring_beta", {S, HV, L}, randn(rng, S * HV * L, 1.0f));
  }

  const std::string path = dir + "/" + kManifestFile;
  std::ofstream f(path);
  f << manifest_to_json(m);
  f.close();
  KDA_CHECK_CODE(static_cast<bool>(f), ErrorCode::kIo, "make-example: cannot write {}", path);
  return m;
}

}  // namespace kda::replay
