// validate.cc: parameter checks of the host reference: the structural checks every op shares
// with the CUDA entry points (kernels/params_check.h), then the index arrays, which are host
// memory here (the CUDA launchers cannot read them), e.g.
//   "kda::host::verify_fused: slots[1]=4 out of range [0, num_slots=4) (negative = padding)".
#include <cstdint>

#include "core/error.h"
#include "kernels/host/host_common.h"
#include "kernels/params_check.h"

namespace kda::host::detail {
namespace {

// Index ranges of the real requests (slots[n] >= 0; padding requests' rows are never read),
// and distinctness where two requests would write the same slot / scratch row.
void check_indices(const char* op, int B, const int32_t* slots, int num_slots, const int32_t* rows,
                   int num_rows, bool distinct_slots, bool distinct_rows) {
  for (int n = 0; n < B; ++n) {
    if (slots[n] < 0) {
      continue;
    }
    KDA_CHECK(slots[n] < num_slots,
              "{}: slots[{}]={} out of range [0, num_slots={}) (negative = padding)", op, n,
              slots[n], num_slots);
    if (rows != nullptr) {
      KDA_CHECK(rows[n] >= 0 && rows[n] < num_rows, "{}: rows[{}]={} out of range [0, num_rows={})",
                op, n, rows[n], num_rows);
    }
    for (int m = 0; m < n; ++m) {
      if (slots[m] < 0) {
        continue;
      }
      KDA_CHECK(!distinct_slots || slots[m] != slots[n],
                "{}: slots[{}] and slots[{}] are both {}: two requests would write one slot", op, m,
                n, slots[n]);
      KDA_CHECK(!distinct_rows || rows[m] != rows[n],
                "{}: rows[{}] and rows[{}] are both {}: two requests would write one scratch row",
                op, m, n, rows[n]);
    }
  }
}

}  // namespace

void validate_verify(const VerifyParams& p, const char* op, uint32_t needs) {
  params::check_verify(p, op, needs);
  const bool records = (needs & params::kRecords) != 0;
  const bool ring = records && p.mode == RecordMode::kRing;
  const bool uses_rows =
      (needs & params::kWindows) != 0 || (records && p.mode == RecordMode::kSnapshot);
  check_indices(op, p.B, p.slots, p.num_slots, uses_rows ? p.rows : nullptr, p.num_rows,
                /*distinct_slots=*/ring || (needs & params::kWritesSlots) != 0,
                /*distinct_rows=*/uses_rows);
}

void validate_extend(const ExtendParams& e, const char* op) {
  params::check_extend(e, op);
  check_indices(op, e.v.B, e.v.slots, e.v.num_slots, nullptr, e.v.num_rows,
                /*distinct_slots=*/true, /*distinct_rows=*/false);
}

void validate_commit(const CommitParams& p, const char* op, uint32_t needs) {
  params::check_commit(p, op, needs);
  const bool uses_rows = (needs & (params::kSnapshot | params::kConvCommit)) != 0;
  // Commits write the slot's state: two requests on one slot would race on the GPU. Reading
  // one scratch row twice is harmless, so rows need not be distinct.
  check_indices(op, p.B, p.slots, p.num_slots, uses_rows ? p.rows : nullptr, p.num_rows,
                /*distinct_slots=*/true, /*distinct_rows=*/false);
}

}  // namespace kda::host::detail
