#include "tests/output_compare.h"

namespace kda::testing {

OutCompare compare_requests(const std::vector<bf16_t>& got, const std::vector<bf16_t>& want,
                            const std::vector<int64_t>& first, const std::vector<int32_t>& lengths,
                            int pad, int HV, int V) {
  const int64_t width = static_cast<int64_t>(HV) * V;
  OutCompare c;
  for (size_t n = 0; n < first.size(); ++n) {
    if (static_cast<int>(n) != pad) {
      c.add_request(got.data() + first[n] * width, want.data() + first[n] * width, lengths[n], HV,
                    V);
    }
  }
  return c;
}

}  // namespace kda::testing
