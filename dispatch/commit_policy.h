// commit_policy.h: whether a ring-mode backend defers its commit (--kda-deferred-commit auto,
// contract §7): the rule and the H200 and H100 measurements behind it (docs/perf.md, "Deferred
// commit").
// Plain C++; the backend evaluates it once, at construction, for its configured batch.
#pragma once

namespace kda {

/// The shape the rule looks at: the model's v-heads and head dims, the engine's batch
/// (--max-running-requests) and draft tokens (--speculative-num-draft-tokens).
struct CommitPolicyShape {
  int HV = 0, K = 0, V = 0;
  int max_batch = 0;
  int draft_tokens = 0;
  /// The device's peak memory bandwidth (Platform::memory_gbps): picks the table of the measured
  /// card nearest to it (H200, H100); 0 = unknown: the H200's.
  double memory_gbps = 0.0;
};

/// True where the bench measured the deferred round faster than the eager one (by more than
/// 2%) on the measured card nearest to the device.
bool deferred_commit_pays(const CommitPolicyShape& shape);

}  // namespace kda
