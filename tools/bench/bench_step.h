// bench_step.h: kda_bench's step phase (contract §6 "step", the headline workload: what an engine
// pays). Per layer: the input projection GEMM x[N, hidden] * W_in[P, hidden]^T (cuBLASLt, bf16,
// fp32 accumulate) into one activation buffer [N, P] whose column ranges are mixed_qkv | a | b
// (row stride >= P > D, as engines pass them), the verify on those views, the output projection
// GEMM out[N, HV*V] * W_out[hidden, HV*V]^T plus the residual into the next hidden state (and with
// --mlp a dense GEMM pair with its residual); --layers layers with distinct weights and state,
// then the commit; one CUDA graph. The gemm-only step is the same graph without the verifies and
// the commit; the KDA share is the difference.
//
// Every tensor a step reads is made on the bench's stream (or synchronised before the first
// capture): no input reaches a step through another stream. Each hidden state has its own buffer,
// so a step is a function of its input and the committed state.
#pragma once

#include "tools/bench/bench_phases.h"

namespace kda::bench {

/// Per batch size and T: the step guard (unless --skip-guard), then the gemm-only step and every
/// variant's step (ring variants eager and deferred), the KDA share of each, a check that the
/// hidden and committed states stayed finite, and at the end the step's advice (the deferred
/// commit per row, the fused-ring batch limit). Throws GuardFailure when the guard fails.
void run_step_phase(BenchContext& ctx);

}  // namespace kda::bench
