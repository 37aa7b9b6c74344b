// kda_state_pool.h: the KDA layers' persistent per-request state and verify scratch.
//
// Tensors (letters as in docs/contract.md §2; every one has a leading [layers] dim):
//   indexed by slot (persistent, one slot per running request):
//     conv_state   [layers, S, W-1, D]          bf16  raw (pre-conv) inputs, oldest first
//     ssm_state    [layers, S, HV, V, K]        f32   K contiguous
//     ring mode only (ReplaySSM records, rewritten by every verify, folded by commit):
//     ring_rawv    [layers, S, HV, L, V]        bf16
//     ring_rawk    [layers, S, H, L, K]         bf16
//     ring_g       [layers, S, HV, L, K]        f32
//     ring_beta    [layers, S, HV, L]           f32
//     ring_cursor  [S]                          i32   ring base c: a verify's step t goes to
//                                                     ring position (c + t) mod L (contract §7)
//     ring_pending [layers, S]                  i32   deferred commit: steps of the ring that
//                                                     the next verify (or materialize) folds;
//                                                     lazy write-back (contract §11): steps the
//                                                     commit folds once the next draft would not
//                                                     fit (at most L - T_max: the ring's capacity)
//     ring_u       [layers, S, HV, L, V]        f32   deferred commit only, not the lazy
//     (config.deferred_commit, !lazy_commit):         write-back: each step's u, which those
//                                                     folds replay
//   indexed by scratch row (the batch position by default; valid between verify and commit):
//     conv_window  [layers, R, T_max, W-1, D]   bf16  window after consuming token t
//     snapshots    [layers, R, T_max, HV, V, K] f32   snapshot mode only: state after token t
//     qkv_act      [R * T_max, D]               bf16  unfused conv output of ONE layer; every
//                                                     layer's verify reuses it (stream-ordered)
// All tensors are packed row-major (strides in elements are the products of the inner
// extents); the per-layer views drop the leading dim. Views into a mode's absent tensors
// (snapshots in ring mode, rings in snapshot mode) are undefined (data() == nullptr).
//
// Deferred commit (contract §7): with pending steps, a slot's ssm_state is the state before
// them: the committed state is materialized (folded) by the slot's next verify of each layer
// or by KdaAttentionBackend::materialize (the lazy write-back: by the commit that fills the
// ring, or materialize). Read or copy ssm_state only with no steps pending
// (ring_pending zero for the slot in every layer), e.g. right after materialize.
// Ownership: the pool owns the memory it allocates (kda::Buffer, RAII) on config.device, host or
// CUDA, from cudaMalloc / aligned_alloc or from the engine's Allocator (PoolStorage::allocator,
// pool_storage.h); tensors the engine hands in (PoolStorage::external, an "external pool") stay
// the engine's, are validated (validate_external_tensors) and used in place, with their padded
// pitches. The pool is move-only and views stay valid (same addresses) across a move until the
// pool is destroyed. What the pool allocates is zeroed at construction; external tensors are not
// written then. A slot's conv_state, ssm_state and rings (and ring cursor and pending counts) are
// zeroed when it is handed out by allocate_slot or claim_slot(kZero), so a released slot never
// leaks the previous request's state. Views of external tensors may have padded slot / row /
// layer pitches: read strides from the views. Thread safety: none; the owner (the backend)
// serialises calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/tensor_view.h"
#include "memory_pool/memory_report.h"
#include "memory_pool/pool_config.h"
#include "memory_pool/pool_storage.h"
#include "memory_pool/slot_allocator.h"

namespace kda {

/// What KdaStatePool::claim_slot does to the slot's state.
enum class SlotInit {
  kZero,       ///< as allocate_slot: conv_state, ssm_state, rings, cursor and pending counts zeroed
  kKeepState,  ///< the engine wrote the slot's conv_state and ssm_state (e.g. its own prefill):
               ///< they are kept; the ring cursor and pending counts are zeroed
};

/// What KdaStatePool::copy_slot copies besides conv_state and ssm_state.
enum class SlotCopy {
  /// Only the state; in ring mode dst's pending counts are zeroed (for a src with none pending).
  kState,
  /// Ring mode: also the ring records (all L positions), the cursor and the pending counts, so
  /// dst's next verify (or materialize) folds src's pending steps exactly as src's would.
  kStateAndPending,
};

class KdaStatePool {
 public:
  /// Validates `config` (kInvalidArgument, see validate_pool_config), checks the memory budget
  /// (kOutOfMemory, message gives both numbers and the ring-mode alternative), allocates,
  /// zeroes every tensor (synchronously) and logs the memory report at info level.
  explicit KdaStatePool(const PoolConfig& config);
  /// The same with `storage`'s memory sources: validates config, then the external tensors
  /// (kInvalidArgument naming "external_pool.<tensor>", before anything is allocated or written),
  /// allocates the rest from storage.allocator on storage.stream (zeroed there; the stream is
  /// synchronised once).
  KdaStatePool(const PoolConfig& config, const PoolStorage& storage);

  KdaStatePool(KdaStatePool&&) noexcept = default;
  KdaStatePool& operator=(KdaStatePool&&) noexcept = default;
  KdaStatePool(const KdaStatePool&) = delete;
  KdaStatePool& operator=(const KdaStatePool&) = delete;

  const PoolConfig& config() const { return config_; }
  const PoolMemoryReport& memory_report() const { return report_; }
  const Device& device() const { return config_.device; }
  bool ring_mode() const { return config_.ring_mode; }
  int num_layers() const { return config_.layers; }
  int num_slots() const { return config_.num_slots; }
  int num_rows() const { return config_.num_rows; }
  int T_max() const { return config_.T_max; }
  int ring_len() const { return config_.ring_len; }
  int64_t qkv_dim() const { return config_.qkv_dim(); }

  // ---- slots ----

  /// Hands out a free slot with its conv_state, ssm_state and rings zeroed in every layer.
  /// CUDA: the zeroing is enqueued on `stream` (cudaMemset2DAsync; no host sync), so work
  /// on that stream sees a clean slot; host: done before returning. Throws kOutOfMemory
  /// when all S slots are in use. Not for the verify/commit hot path (not capturable).
  int allocate_slot(cudaStream_t stream = nullptr);
  /// Hands out `slot` itself (an engine that numbers its slots: SGLang's MambaPool indices),
  /// zeroed as allocate_slot does, or with its conv / SSM state kept (SlotInit::kKeepState).
  /// Throws kInvalidArgument for a slot outside [0, S) or one already allocated; nothing
  /// changes on a throw. Enqueued on `stream` like allocate_slot.
  void claim_slot(int slot, SlotInit init, cudaStream_t stream = nullptr);
  /// Returns `slot` to the free list. Throws kInvalidArgument for a slot outside [0, S)
  /// or one that is not allocated (double release); nothing changes on a throw. The caller
  /// must not release a slot that enqueued work still uses.
  void release_slot(int slot);
  /// dst's conv_state and ssm_state of every layer become src's, bitwise (plus `what`).
  /// Enqueued on `stream` (cudaMemcpy2DAsync per tensor: capturable, no host sync); host: done
  /// before returning. Throws kInvalidArgument (nothing enqueued) for a slot outside [0, S) or
  /// not allocated, src == dst, or kStateAndPending in snapshot mode.
  void copy_slot(int src, int dst, SlotCopy what, cudaStream_t stream = nullptr);
  bool is_slot_allocated(int slot) const { return slots_.is_allocated(slot); }
  int num_free_slots() const { return slots_.num_free(); }
  int num_allocated_slots() const { return slots_.num_allocated(); }

  // ---- per-layer views (throw kInvalidArgument for a layer outside [0, layers)) ----

  TensorView conv_state(int layer) const;    ///< [S, W-1, D] bf16
  TensorView ssm_state(int layer) const;     ///< [S, HV, V, K] f32
  TensorView conv_window(int layer) const;   ///< [R, T_max, W-1, D] bf16
  TensorView snapshots(int layer) const;     ///< [R, T_max, HV, V, K] f32; undefined in ring mode
  TensorView ring_rawv(int layer) const;     ///< [S, HV, L, V] bf16; undefined in snapshot mode
  TensorView ring_rawk(int layer) const;     ///< [S, H, L, K] bf16
  TensorView ring_g(int layer) const;        ///< [S, HV, L, K] f32
  TensorView ring_beta(int layer) const;     ///< [S, HV, L] f32
  TensorView ring_pending(int layer) const;  ///< [S] i32 pending steps; undefined in snapshot mode
  TensorView ring_u(int layer) const;  ///< [S, HV, L, V] f32; undefined without deferred_commit
  TensorView ring_cursor() const { return ring_cursor_; }  ///< [S] i32 ring base per slot
  TensorView qkv_act() const { return qkv_act_; }  ///< [R * T_max, D] bf16, shared by layers

  // ---- whole-stack views ([layers, ...]; for commit, which covers all layers at once) ----

  TensorView conv_state_all() const { return conv_state_; }
  TensorView ssm_state_all() const { return ssm_state_; }
  TensorView conv_window_all() const { return conv_window_; }
  TensorView snapshots_all() const { return snapshots_; }
  TensorView ring_rawv_all() const { return ring_rawv_; }
  TensorView ring_rawk_all() const { return ring_rawk_; }
  TensorView ring_g_all() const { return ring_g_; }
  TensorView ring_beta_all() const { return ring_beta_; }
  TensorView ring_pending_all() const { return ring_pending_; }  ///< [layers, S] i32
  TensorView ring_u_all() const { return ring_u_; }              ///< [layers, S, HV, L, V] f32

 private:
  TensorView layer_view(const TensorView& all, int layer, const char* what) const;
  void zero_slot(int slot, bool state, cudaStream_t stream);

  PoolConfig config_;
  PoolMemoryReport report_;
  SlotAllocator slots_;
  std::vector<Buffer> buffers_;  // owns the memory behind every view below but external ones
  TensorView conv_state_, ssm_state_, conv_window_, snapshots_, qkv_act_;
  TensorView ring_rawv_, ring_rawk_, ring_g_, ring_beta_, ring_cursor_, ring_pending_, ring_u_;
};

}  // namespace kda
