// persistent_stage.cuh: persistent CTAs that bring each work item's state tile through a
// shared-memory stage.
//
// Why: at large B a verify/fold CTA spends its life in two phases, "wait for 64 KiB of
// state and the inputs" and "compute", and with only 2 CTAs per SM (register-bound) the
// phases of the two CTAs line up, so the SM idles while the data arrives.
// A persistent CTA instead walks the work items blockIdx.x, blockIdx.x + gridDim.x, ...
// and, as soon as it is done with item i's stage, has the TMA engine (cp.async.bulk, sm_90+)
// bring the next live item's tile into the same stage, so that load runs under item i's
// recurrence.
//
// BulkStage protocol (one stage, one mbarrier, the parity flips per filled stage):
//   fill:         issue(run)... then one arrive()   (fill(): one warp does both)
//   all threads:  wait()                            -> the last fill has landed
// then the item reads the stage; every thread must be done reading a region (a
// __syncthreads) before it is refilled — regions may be refilled at different times within
// one fill. Every fill must be waited for exactly once, in order.
// A run is `bytes` contiguous bytes, 16-byte aligned at both ends, a multiple of 16
// (launchers check the tensors' alignment and fall back to the per-item kernels otherwise).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/device_math.cuh"

namespace kda::kernels {

/// Shared-memory address (32-bit, .shared::cta window) of a generic pointer to shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// One bulk copy: `bytes` from global `src` to the stage at byte offset `dst`.
struct BulkRun {
  uint32_t dst;
  const void* src;
  uint32_t bytes;
};

class BulkStage {
 public:
  /// `stage` and `bar` are shared memory.
  __device__ BulkStage(void* stage, uint64_t* bar) : stage_(stage), bar_(bar) {}

  /// Thread 0 initialises the barrier; a __syncthreads() must follow before any use.
  __device__ void init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar_)) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
  }

  /// One thread: announces r.bytes on the barrier and puts the copy in flight. A fill is any
  /// number of issue() calls followed (in an order the issuing threads agree on, e.g. across
  /// a __syncthreads) by exactly one arrive().
  __device__ void issue(const BulkRun& r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t bar = smem_addr(bar_);
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(r.bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(smem_addr(stage_) + r.dst),
        "l"(r.src), "r"(r.bytes), "r"(bar)
        : "memory");
#else
    (void)r;
    __trap();  // launchers go persistent on sm_90+ only
#endif
  }

  /// A whole one-run fill by the threads with `pred` set, branch-free (predicated inside one
  /// asm block): cheap in registers where a kernel's state is live.
  __device__ void fill_one_if(bool pred, const BulkRun& r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.u32 p, %4, 0;\n"
        "@p mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %3;\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%1], [%2], %3, "
        "[%0];\n"
        "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
        "}\n" ::"r"(smem_addr(bar_)),
        "r"(smem_addr(stage_) + r.dst), "l"(r.src), "r"(r.bytes), "r"(pred ? 1u : 0u)
        : "memory");
#else
    (void)pred;
    (void)r;
#endif
  }

  /// One thread: the fill's single arrival (after all its issue() calls).
  __device__ void arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar_)) : "memory");
#endif
  }

  /// Warp 0, all 32 lanes: a whole fill of runs 0..count-1 (`run(i)` returns a BulkRun).
  template <typename Runs>
  __device__ void fill(const Runs& run, int count) {
    for (int i = static_cast<int>(threadIdx.x % 32); i < count; i += 32) {
      issue(run(i));
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
      arrive();
    }
  }

  /// Every thread: waits until the fill that the next wait() waits for has landed, without
  /// consuming it (that wait() then returns at once).
  __device__ void wait_landed() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "KDA_STAGE_PEEK:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra KDA_STAGE_PEEK;\n"
        "}\n" ::"r"(smem_addr(bar_)),
        "r"(phase_)
        : "memory");
#endif
  }

  /// Every thread: waits until the last fill has landed.
  __device__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "KDA_STAGE_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra KDA_STAGE_WAIT;\n"
        "}\n" ::"r"(smem_addr(bar_)),
        "r"(phase_)
        : "memory");
    phase_ ^= 1u;
#endif
  }

 private:
  void* stage_;
  uint64_t* bar_;
  uint32_t phase_ = 0;
};

/// Global -> shared copy of BYTES (4, 8 or 16) that bypasses the registers. 16-byte pieces
/// also bypass L1 (.cg: the verify inputs are read once); .cg takes only 16, so the smaller
/// ones (the fold's beta scalars) go through it (.ca).
template <int BYTES>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)), "l"(gmem)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_addr(smem)), "l"(gmem),
                 "n"(BYTES)
                 : "memory");
  }
#else
  (void)smem;
  (void)gmem;
  __trap();  // launchers go persistent on sm_90+ only
#endif
}

/// A 16-byte cp.async that copies `gmem` when `valid` and fills the 16 bytes with zeros when not
/// (src-size 0: nothing is read, but `gmem` must still be an address of the tensor).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  (void)smem;
  (void)gmem;
  (void)valid;
#endif
}

/// Waits for all of this thread's cp.async copies (before another thread reads them, a
/// __syncthreads must follow).
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

/// Closes this thread's cp.async copies issued since the last commit into one group (an empty
/// group when there were none).
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/// Waits until at most N of this thread's committed cp.async groups, the newest, are pending
/// (before another thread reads the landed ones, a __syncthreads must follow).
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/// Orders this thread's generic-proxy shared-memory stores before later async-proxy (bulk copy)
/// writes of the same bytes.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/// One thread: a bulk copy of `bytes` (a multiple of 16, both ends 16-byte aligned) from shared
/// memory `src` to global memory `dst` through the TMA engine, committed as one bulk group. The
/// shared bytes' generic-proxy stores must be ordered before it (fence_proxy_async_shared by
/// their writers, then a __syncthreads).
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#else
  (void)dst;
  (void)src;
  (void)bytes;
  __trap();  // launchers go persistent on sm_90+ only
#endif
}

/// The bulk_store thread: waits until its bulk stores have read their shared memory (it may be
/// overwritten, e.g. refilled).
__device__ __forceinline__ void bulk_store_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}

/// The bulk_store thread: waits until its bulk stores are complete (before the CTA exits).
__device__ __forceinline__ void bulk_store_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

/// Orders this thread's generic-proxy global stores before later async-proxy (bulk copy) reads
/// of the same bytes.
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

/// Every thread: zero-fills `bytes` (a multiple of 16) of 16-byte aligned shared memory that
/// bulk copies write later, and orders these generic-proxy stores before those async-proxy
/// writes (fence.proxy.async). A __syncthreads must follow before the first bulk copy.
__device__ __forceinline__ void clear_shared_before_bulk(void* smem, size_t bytes) {
  float4* p = static_cast<float4*>(smem);
  for (size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
    p[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/// Whether two CTAs of a persistent kernel (the 2 of its __launch_bounds__(256, 2)) fit one
/// SM's shared memory on sm_90 / sm_100 (228 KiB, of which each CTA reserves 1 KiB), given a
/// CTA's static plus dynamic bytes. The launchers size the grid from the occupancy API, so a
/// miss would not fail — it would halve the resident CTAs; the kernels assert it instead.
constexpr bool two_ctas_fit_per_sm(size_t smem_per_cta) {
  return 2 * (smem_per_cta + 1024) <= 228 * 1024;
}

/// First live item at or after `item` in this CTA's walk (stride gridDim.x), or count().
/// Items: `int count() const`, `bool live(int) const`.
template <typename Items>
__device__ __forceinline__ int next_live_item(const Items& items, int item) {
  while (item < items.count() && !items.live(item)) {
    item += static_cast<int>(gridDim.x);
  }
  return item;
}

/// Every thread, at the start of a persistent kernel: initialises the stage's
/// barrier, waits for the previous grid (PDL) and lets the next one launch, then has warp 0
/// put the fill of this CTA's first live item in flight (`fill_first(item)`, called by the 32
/// lanes of warp 0). Returns that item, or items.count() when the CTA has none. A kernel that
/// must put something else in flight first (the verify: its first item's inputs, before the
/// tile) passes a no-op and fills the stage itself after that.
/// kFirstBeforeWait: the items' liveness reads only inputs that the previous kernel on the
/// stream does not write (verify: the slot indices, kda_kernels.h), so the first live item is
/// found before the PDL wait and that load overlaps the previous kernel's tail. The fold's
/// liveness reads the accepted lengths, which the kernel before the commit
/// (sampling) may write: it finds its first item after the wait.
template <bool kFirstBeforeWait, typename Items, typename FillFirst>
__device__ __forceinline__ int begin_persistent(BulkStage& bulk, const Items& items,
                                                const FillFirst& fill_first) {
  bulk.init();
  int first = 0;
  if constexpr (kFirstBeforeWait) {
    first = next_live_item(items, static_cast<int>(blockIdx.x));
  }
  pdl_enter();
  __syncthreads();  // the barrier is initialised
  if constexpr (!kFirstBeforeWait) {
    first = next_live_item(items, static_cast<int>(blockIdx.x));
  }
  if (first < items.count() && threadIdx.x < 32) {
    fill_first(first);
  }
  return first;
}

}  // namespace kda::kernels
