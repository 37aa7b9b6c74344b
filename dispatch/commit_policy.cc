#include "dispatch/commit_policy.h"

namespace kda {

bool deferred_commit_pays(const CommitPolicyShape& shape) {
  // H200, kda_bench --phases round, fused+ring, 20 layers (docs/perf.md "Deferred commit"):
  // the deferred round is faster at every measured (preset, B, T); the fold's own launch and
  // its state pass cost more than the fold steps inside the next verify.
  return shape.max_batch >= 1 && shape.draft_tokens >= 1;
}

}  // namespace kda
