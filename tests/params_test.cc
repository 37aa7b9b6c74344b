// The shared parts of a verify and an extend survive VerifyParams <-> ExtendParams field for
// field: every byte of every part's fields (its padding aside) reaches the other struct and comes
// back, so a field added to a part but not to copy_shared_parts fails here.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/params/kda_params.h"

using namespace kda;

namespace {

/// The bytes of a part that belong to its fields (not padding): 0xFF in the mask.
template <typename Part>
std::vector<uint8_t> field_mask() {
  Part p;
  std::memset(static_cast<void*>(&p), 0xFF, sizeof(Part));
  __builtin_clear_padding(&p);
  std::vector<uint8_t> mask(sizeof(Part));
  std::memcpy(mask.data(), &p, sizeof(Part));
  return mask;
}

/// A byte pattern no two bytes of which are equal within 251 bytes (all nonzero).
void fill(void* dst, size_t n, int seed) {
  auto* bytes = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    bytes[i] = static_cast<uint8_t>(1 + (i * 7 + static_cast<size_t>(seed) * 31) % 251);
  }
}

/// Field bytes of `Part` in `got` that differ from `want` (padding ignored).
template <typename Part>
int differing_field_bytes(const ExtendParams& want, const ExtendParams& got) {
  const std::vector<uint8_t> mask = field_mask<Part>();
  const auto* w = reinterpret_cast<const uint8_t*>(static_cast<const Part*>(&want));
  const auto* g = reinterpret_cast<const uint8_t*>(static_cast<const Part*>(&got));
  int differ = 0;
  for (size_t i = 0; i < sizeof(Part); ++i) {
    differ += (mask[i] != 0 && w[i] != g[i]) ? 1 : 0;
  }
  return differ;
}

}  // namespace

TEST_CASE("params: the shared parts round-trip ExtendParams -> VerifyParams -> ExtendParams",
          "[params]") {
  ExtendParams e;
  fill(&e, sizeof(e), 1);
  e.T_max = e.T;  // verify_view sets T_max = T (an extend has no scratch)
  // Two different fills of the middle and the target: a byte that survives both came through.
  for (int seed : {2, 3}) {
    VerifyParams v;
    fill(&v, sizeof(v), seed);
    v = verify_view(e);
    ExtendParams back;
    fill(&back, sizeof(back), seed + 10);
    back = extend_params_of(v);
    CHECK(differing_field_bytes<VerifySizes>(e, back) == 0);
    CHECK(differing_field_bytes<TokenInputs>(e, back) == 0);
    CHECK(differing_field_bytes<WeightParams>(e, back) == 0);
    CHECK(differing_field_bytes<CommittedState>(e, back) == 0);
    CHECK(differing_field_bytes<BatchParams>(e, back) == 0);
    CHECK(back.out == e.out);
    // What an extend has and a verify has not stays at its default.
    CHECK(back.ssm_state_out == nullptr);
    CHECK(back.conv_state_out == nullptr);
    CHECK(back.track_slots == nullptr);
    CHECK(back.track_steps == nullptr);
    // The verify's own fields stay at their defaults.
    CHECK(v.conv_window == nullptr);
    CHECK(v.snapshots == nullptr);
    CHECK(v.ring_rawv == nullptr);
    CHECK(v.ring_pending == nullptr);
    CHECK(v.ring_u == nullptr);
    CHECK(v.fold_before_wait == 0);
    CHECK(v.qkv_act == nullptr);
  }
}

TEST_CASE("params: the field mask sees a missed field", "[params]") {
  // The check above can fail: a copy that skips one field of a part leaves its bytes behind.
  ExtendParams e;
  fill(&e, sizeof(e), 1);
  ExtendParams back = e;
  back.ssm_slot_stride = 0;  // as if copy_shared_parts forgot CommittedState::ssm_slot_stride
  CHECK(differing_field_bytes<CommittedState>(e, back) == 8);
  CHECK(differing_field_bytes<VerifySizes>(e, back) == 0);
}
