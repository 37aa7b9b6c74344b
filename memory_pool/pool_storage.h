// pool_storage.h: where a KdaStatePool's memory comes from: the engine's allocator hook
// (core/allocator.h) for what the pool allocates, and engine-owned tensors (an external pool)
// that the pool uses in place of allocating them.
//
// External tensors (all optional; an undefined view = the pool allocates that tensor). Letters
// as in docs/contract.md §2; S' >= S slots and R' >= R scratch rows (the pool uses the first S /
// R; the rest is never touched), T' >= T_max steps; every tensor on the pool's device:
//   conv_state   [layers, S', W-1, D]          bf16
//   ssm_state    [layers, S', HV, V, K]        f32   K contiguous
//   conv_window  [layers, R', T', W-1, D]      bf16  scratch
//   snapshots    [layers, R', T', HV, V, K]    f32   snapshot mode only
//   ring_rawv    [layers, S', HV, L, V]        bf16  ring mode only (SGLang's ring layout)
//   ring_rawk    [layers, S', H, L, K]         bf16  ring mode only
//   ring_g       [layers, S', HV, L, K]        f32   ring mode only
//   ring_beta    [layers, S', HV, L]           f32   ring mode only
//   ring_cursor  [S']                          i32   ring mode only, contiguous
//   ring_pending [layers, S']                  i32   ring mode only, slot stride 1
//   ring_u       [layers, S', HV, L, V]        f32   ring mode with the deferred commit only
//   qkv_act      [R'' >= R * T_max, D]         bf16  contiguous
// Strides (elements): the dims after the slot / row dim packed row-major; the slot / row pitch
// stride(1) at least one packed slot (padding allowed: SGLang's pools, a slice of a bigger
// tensor); the layer pitch stride(0) at least S' (R') pitches (layer-major, no overlap). The
// kernels' vector accesses: ssm_state and snapshots 16-byte aligned with 16-byte pitches, the
// others 4-byte aligned with 4-byte pitches (on the host too, so a layout that works there
// works on CUDA). No two external tensors may share a byte (their spans are disjoint).
// validate_external_tensors checks all of it and throws kda::Error(kInvalidArgument) naming the
// tensor ("external_pool.ssm_state: ..."), what was expected and what came; the pool checks
// before it allocates or writes anything.
//
// Ownership: external tensors stay the engine's; the pool holds views and never frees them; the
// engine keeps them alive (and at the same addresses) until the pool (the backend) is destroyed.
// The pool does not write them at construction (the engine's state stays); a slot's state is
// zeroed when allocate_slot / claim_slot(kZero) hands it out.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "core/allocator.h"
#include "core/tensor_view.h"
#include "memory_pool/pool_config.h"

namespace kda {

/// Engine-owned pool tensors (see the file comment); undefined = allocated by the pool.
struct ExternalPoolTensors {
  TensorView conv_state, ssm_state, conv_window, snapshots;
  TensorView ring_rawv, ring_rawk, ring_g, ring_beta;
  TensorView ring_cursor, ring_pending, ring_u, qkv_act;

  /// Whether any tensor is given.
  bool any() const;
};

/// A pool's memory sources.
struct PoolStorage {
  /// Where the pool allocates what `external` does not give (null: cudaMalloc on CUDA,
  /// aligned_alloc on the host). Kept alive by the pool until its memory is returned.
  std::shared_ptr<Allocator> allocator;
  /// The stream the pool's allocations, frees and construction-time zeroing are ordered on (null:
  /// the legacy default stream). Construction synchronises it once.
  cudaStream_t stream = nullptr;
  ExternalPoolTensors external;
};

/// The external tensors' rules (file comment) for `config`; throws kda::Error(kInvalidArgument)
/// naming the first offending tensor ("<prefix>.<name>", e.g. "external_pool.ssm_state"). Reads
/// no tensor memory. qkv_act is checked only when `with_qkv_act`. `per_layer`: one layer's views
/// (no [layers] dim: the ops' verify), config.layers = 1.
void validate_external_tensors(const PoolConfig& config, const ExternalPoolTensors& external,
                               const char* prefix = "external_pool", bool with_qkv_act = true,
                               bool per_layer = false);

/// The view the pool uses for an external tensor: narrowed to the config's S / R / T_max / R*T_max
/// (same strides). `name` as in the file comment. Only for a tensor that passed validation.
TensorView external_pool_view(const PoolConfig& config, const char* name, const TensorView& t);

}  // namespace kda
