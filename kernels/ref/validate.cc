// validate.cc: parameter checks of the host reference: the structural checks every op shares
// with the CUDA entry points (kernels/params_check.h), then the index arrays, which are host
// memory here (the CUDA launchers cannot read them), e.g.
//   "kda::host::verify_fused: slots[1]=4 out of range [0, num_slots=4) (negative = padding)".
#include <cstdint>

#include "core/error.h"
#include "kernels/params/params_check.h"
#include "kernels/ref/host_common.h"

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

// The draft shape's index arrays (contract §8): ragged lengths 1..T packed from row 0; each
// real request's tree rooted at node 0 alone, every other node's parent before it.
void check_shape(const VerifyParams& p, const char* op) {
  if (p.token_offsets != nullptr) {
    KDA_CHECK(p.token_offsets[0] == 0, "{}: token_offsets[0]={}, expected 0 (packed rows)", op,
              p.token_offsets[0]);
    for (int n = 0; n < p.B; ++n) {
      const int32_t len = p.token_offsets[n + 1] - p.token_offsets[n];
      KDA_CHECK(len >= 1 && len <= p.T,
                "{}: token_offsets[{}]={} - token_offsets[{}]={} gives T_{}={}, expected 1..T={}",
                op, n + 1, p.token_offsets[n + 1], n, p.token_offsets[n], n, len, p.T);
    }
  }
  if (p.parents != nullptr) {
    for (int n = 0; n < p.B; ++n) {
      if (p.slots[n] < 0) {
        continue;  // padding: its parents are not read
      }
      const int32_t* par = p.parents + static_cast<int64_t>(n) * p.T;
      KDA_CHECK(par[0] == -1, "{}: parents[{}]={} for node 0 of request {}, expected -1 (the root)",
                op, n * p.T, par[0], n);
      for (int j = 1; j < p.T; ++j) {
        KDA_CHECK(par[j] >= 0 && par[j] < j,
                  "{}: parents[{}]={} for node {} of request {}, expected in [0, {}) (one root, "
                  "every parent before its child)",
                  op, n * p.T + j, par[j], j, n, j);
      }
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
  check_shape(p, op);
}

void validate_extend(const ExtendParams& e, const char* op) {
  params::check_extend(e, op);
  const VerifyParams p = verify_view(e);
  check_indices(op, p.B, p.slots, p.num_slots, nullptr, p.num_rows,
                /*distinct_slots=*/true, /*distinct_rows=*/false);
  if (e.track_steps == nullptr) {
    return;
  }
  // Tracks: a step of the prompt, a slot of its own (outside the batch, one per track).
  for (int n = 0; n < p.B; ++n) {
    const int32_t k = e.track_steps[n], t = e.track_slots[n];
    if (p.slots[n] < 0 || k < 0) {
      continue;
    }
    KDA_CHECK(k < p.T, "{}: track_steps[{}]={} out of range [-1, T={})", op, n, k, p.T);
    KDA_CHECK(t >= 0 && t < p.num_slots, "{}: track_slots[{}]={} out of range [0, num_slots={})",
              op, n, t, p.num_slots);
    for (int m = 0; m < p.B; ++m) {
      KDA_CHECK(p.slots[m] != t,
                "{}: track_slots[{}]={} is also slots[{}] (a track slot is "
                "outside the batch)",
                op, n, t, m);
      KDA_CHECK(m >= n || p.slots[m] < 0 || e.track_steps[m] < 0 || e.track_slots[m] != t,
                "{}: track_slots[{}] and track_slots[{}] are both {} (one track per slot)", op, m,
                n, t);
    }
  }
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
