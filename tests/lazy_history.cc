#include "tests/lazy_history.h"

#include <random>

#include "core/error.h"

namespace kda::testing {

LazyHistory write_history(VerifyProblem& p, const std::vector<int32_t>& steps, float scale,
                          uint64_t seed) {
  const VerifyCase& c = p.config();
  const int S = p.num_slots(), L = c.L, group = c.HV / c.H;
  KDA_CHECK(static_cast<int>(steps.size()) == S, "write_history: {} step counts for {} slots",
            steps.size(), S);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, scale * 0.5f);
  std::uniform_real_distribution<float> gate(-1.5f, -0.01f), beta(0.05f, 0.95f);
  std::vector<bf16_t> rawk = p.rawk(), rawv = p.rawv();
  std::vector<float> g = p.ring_g(), b = p.ring_beta();
  LazyHistory h{std::vector<int32_t>(static_cast<size_t>(S), 0), steps};
  for (int slot = 0; slot < S; ++slot) {
    const int n = steps[static_cast<size_t>(slot)];
    KDA_CHECK(n >= 0 && n <= L, "write_history: steps[{}] = {} outside [0, L = {}]", slot, n, L);
    if (n == 0) {
      continue;
    }
    const int cursor = static_cast<int>(rng() % static_cast<unsigned>(L));
    h.cursor[static_cast<size_t>(slot)] = cursor;
    for (int j = 0; j < n; ++j) {
      const int64_t pos = (cursor - n + j) & (L - 1);
      for (int hv = 0; hv < c.HV; ++hv) {
        const int64_t head = (int64_t{slot} * c.HV + hv) * L + pos;
        for (int v = 0; v < c.V; ++v) {
          rawv[static_cast<size_t>(head * c.V + v)] = float_to_bf16(normal(rng));
        }
        for (int k = 0; k < c.K; ++k) {
          g[static_cast<size_t>(head * c.K + k)] = gate(rng);
        }
        b[static_cast<size_t>(head)] = beta(rng);
        if (hv % group == 0) {
          const int64_t khead = (int64_t{slot} * c.H + hv / group) * L + pos;
          for (int k = 0; k < c.K; ++k) {
            rawk[static_cast<size_t>(khead * c.K + k)] = float_to_bf16(normal(rng));
          }
        }
      }
    }
  }
  p.set(Tensor::kRingRawk, rawk);
  p.set(Tensor::kRingRawv, rawv);
  p.set(Tensor::kRingG, g);
  p.set(Tensor::kRingBeta, b);
  return h;
}

}  // namespace kda::testing
