// verify_fp64_ref.cc: the fp64 oracle: the verify recurrence instantiated for double.
#include <algorithm>
#include <vector>

#include "kernels/ref/host_common.h"
#include "kernels/ref/kda_host.h"

namespace kda::host {

Fp64Verify verify_fp64(const VerifyParams& p, bool keep_states) {
  detail::validate_verify(p, "kda::host::verify_fp64", params::kConv | params::kRecurrence);
  const int64_t D = qkv_dim(p);
  const int64_t head = static_cast<int64_t>(p.V) * p.K;
  const int64_t token_out = static_cast<int64_t>(p.HV) * p.V;
  Fp64Verify r;
  r.out.assign(static_cast<size_t>(p.B) * p.T * token_out, 0.0);
  if (keep_states) {
    r.states.assign(static_cast<size_t>(p.B) * p.T * p.HV * head, 0.0);
  }
  std::vector<bf16_t> act(static_cast<size_t>(p.T * D));
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[n];
    if (slot < 0) {
      continue;  // padding: zeros, like the zeroed output rows of the kernels
    }
    // The same f32 conv as the reference: q/k/v are the model's bf16 values.
    detail::conv_request(p, n, slot, act.data(), D, /*windows=*/nullptr,
                         /*last_window=*/nullptr);
    detail::recur_request<double>(
        p, n, slot, act.data(), D,
        [&](int hv, int t, const detail::HeadStep<double>& w) {
          const int64_t r_row = detail::qkv_row(p, n, t);
          std::copy(w.o.begin(), w.o.end(), r.out.begin() + (r_row * p.HV + hv) * p.V);
          if (keep_states) {
            std::copy(w.S.begin(), w.S.end(), r.states.begin() + (r_row * p.HV + hv) * head);
          }
        },
        [](int, const detail::HeadStep<double>&) {});
  }
  return r;
}

}  // namespace kda::host
