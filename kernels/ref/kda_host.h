// kda_host.h: the host (CPU) reference of every KDA kernel family: the numerical oracle the
// CUDA kernels are tested against, and the kernels of the host KernelSet that runs the whole
// backend without a GPU.
//
// Params: each function takes the same struct as its CUDA counterpart (kernels/kda_params.h;
// layouts, strides in elements, docs/contract.md §2) with *host* pointers. Nothing is owned or
// allocated beyond per-call temporaries; the caller keeps every tensor alive for the call.
// Errors: every entry validates first (kda::Error, kInvalidArgument, naming the field, what
// was expected and what came) and writes nothing when it throws. Indices (slots, rows,
// accepted) are host data here, so the reference also range-checks them.
// Execution: synchronous, single-threaded on the calling thread; reentrant (concurrent calls
// must not write the same memory).
//
// Numerics: docs/contract.md §3, in order: the same elementwise forms, FMA exactly where the
// contract says fma, and the contract's 32-partial reduction tree for every K-length sum,
// with <cmath> exp/log/sqrt and IEEE division where the GPU uses approximate instructions.
// Hence the host paths agree *bitwise* with each other (fused == unfused, N tokens ==
// N single-token extends, fold == snapshot copy), and with the GPU within the contract's
// tolerances (relative L2: bf16 outputs <= 1e-2, f32 states <= 1e-5). The one exception is
// verify_fused_fast's outputs (contract §10), which agree with the exact paths within §10's
// bounds; its records and windows are bitwise theirs.
//
// Padding requests (slots[n] < 0): the T output rows are zeroed; nothing else of the request
// (inputs, rows[n], state, scratch, rings) is read or written.
#pragma once

#include <vector>

#include "kernels/params/kda_params.h"

namespace kda::host {

// ---- verify (reads conv_state and ssm_state, never writes them) ----

/// Unfused step 1: conv + SiLU of all T tokens of every real request into p.qkv_act ([N, D]
/// bf16, packed rows) and the windows after each token into p.conv_window[rows[n]][t].
/// Reads qkv, conv_weight/bias, conv_state, slots, rows.
void conv_update(const VerifyParams& p);

/// Unfused step 2: gates, beta and the delta rule over p.qkv_act; writes out, and by p.mode
/// snapshots[rows[n]][t] (state after token t) or the ring records of steps t < L at slot
/// slots[n] (rawk once per k-head, rawv, g, beta). Does not touch conv_window.
void verify_recurrent(const VerifyParams& p);

/// conv_update then verify_recurrent.
void verify_unfused(const VerifyParams& p);

/// The fused path: the conv runs inside the token loop of each (request, v-head), as the
/// fused kernel does; same outputs as verify_unfused, bitwise. p.qkv_act is not used.
void verify_fused(const VerifyParams& p);

/// The fused path with fast outputs (contract §10; VerifyNumerics::kFast, whatever p.numerics
/// says): conv windows and ring records bitwise those of verify_fused (the same code writes
/// them); each (request, v-head)'s outputs from the chunked form of its T_n <= 16 tokens, in the
/// order the fast kernel uses: per-k prefix decays as products of the factors EXP(g_t); the
/// T x T system (key-key A, key-query M) as tree dots of ratio-decayed keys (products of the
/// factors d_{i+1..t} <= 1); the state contractions W_t = Σ_k xk_t[k] S0[k][:] and
/// QS_t = Σ_k xq_t[k] S0[k][:] summed in double and rounded once to f32 (the tensor cores' order
/// is not reproducible); then per column u_t = (v_t - W_t - Σ_{i<t} A[t][i] u_i) beta_t and
/// o_t = QS_t + Σ_{i<=t} M[t][i] u_i as f32 fma chains, out = bf16(o_t). Outputs agree with
/// verify_fused within the contract's §10 (b) bounds, not bitwise.
/// Domain: ring mode, a dense or ragged chain (no parents), no pending fold (ring_pending null),
/// T <= 16; otherwise kda::Error naming the field. Never writes the committed state.
void verify_fused_fast(const VerifyParams& p);

// ---- extend (prefill through the recurrence) ----

/// Processes the p.T tokens of every real request and commits them in place: outputs into
/// p.out, the final state into p.ssm_state_out[slot], the window after the last token
/// (last W-1 raw inputs) into p.conv_state_out[slot]. Either may alias its input. mode, rows,
/// T_max, L, scratch, rings and qkv_act are ignored.
void extend(const ExtendParams& p);

// ---- commit (all layers; requests with slots[i] < 0 are skipped) ----
// An accepted length n outside [1, T] skips the request and sets *p.error_flag = 1 (if set).

/// Ring mode: replays ring steps 0..n-1 (rawk -> L2 norm, exp(g) decay, delta rule with rawv
/// and beta) onto ssm_state[layer][slots[i]]; an eager commit's valid track (commit_track.h)
/// gets the state after step k. Requires L >= T.
void fold(const CommitParams& p);

/// Deferred commit's tracks (kDeferred with tracks): for each valid track (commit_track.h),
/// ssm_state[layer][track slot] = the fold of ring positions (c + j) mod L, j <= k, onto
/// ssm_state[layer][slot], and ring_pending[layer][track slot] = 0. Run before the cursor moves.
void fold_track_deferred(const CommitParams& p);

/// Snapshot mode: ssm_state[layer][slots[i]] = snapshots[layer][rows[i]][n-1] (and the track
/// slot's = snapshot k).
void commit_snapshot(const CommitParams& p);

/// conv_state[layer][slots[i]] = conv_window[layer][rows[i]][n-1] (and the track slot's =
/// window k).
void commit_conv(const CommitParams& p);

/// fold (ring mode) or commit_snapshot (snapshot mode), then commit_conv.
void commit(const CommitParams& p);

// ---- fp64 oracle ----

/// The verify math in double precision, for accuracy tests of the f32 paths.
struct Fp64Verify {
  std::vector<double> out;     ///< [N, HV, V] like p.out, NOT rounded to bf16; padding rows 0
  std::vector<double> states;  ///< [B, T, HV, V, K] state after each token; padding requests 0
};

/// Runs verify with double everywhere after the conv's bf16 rounding point. The conv itself
/// (taps, SiLU, bf16 rounding) is the f32 one: q/k/v entering the recurrence as bf16 values
/// is part of the model, so both runs see identical q/k/v and the comparison measures the
/// recurrence alone. Reads the verify inputs and ssm_state; ignores mode, rows, every output,
/// scratch and ring pointer, and writes nothing. keep_states false: `states` is left empty (the
/// outputs alone; B*T*HV*V*K doubles less to hold).
Fp64Verify verify_fp64(const VerifyParams& p, bool keep_states = true);

/// The chunked form of verify_fused_fast in double precision, with verify_fp64's conventions
/// (the f32 conv and its bf16 rounding, then double everywhere: d_t = exp(g_t), the T x T system,
/// the state contractions, the per-column solve). In exact arithmetic it equals the sequential
/// recurrence, so its outputs agree with verify_fp64's to double rounding: the check of the
/// chunked algebra. Chains only (parents set: kda::Error); `states` is left empty (the chunked
/// form computes outputs only). Reads what verify_fp64 reads and writes nothing.
Fp64Verify verify_fp64_chunked(const VerifyParams& p);

}  // namespace kda::host
