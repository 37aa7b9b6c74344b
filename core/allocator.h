// allocator.h: the engine's memory allocator hook. A backend (and its pool) given an Allocator
// takes every byte of device memory it owns from it instead of cudaMalloc (or, for the host
// kernel set, instead of aligned_alloc), so the memory lives in the engine's allocator and
// budget (PyTorch's caching allocator, an engine's KV-cache manager).
//
// Contract of an implementation (checked where it can be, by kda::Buffer):
//   allocate(bytes, device, stream): `bytes` > 0 of memory on `device` (host memory for
//     Device::host()), usable by work enqueued on `stream`, aligned to kAllocatorAlignment bytes;
//     nullptr when out of memory (the caller throws kOutOfMemory naming the size). It may throw
//     kda::Error. Called on the thread that drives the backend, never during a CUDA-graph capture
//     (only at construction).
//   deallocate(ptr, bytes, device, stream): returns a block from allocate with the same bytes,
//     device and stream. Must not throw. Called when the owner is destroyed; the work that used
//     the block must have run (the backend's destroy rule), so a stream-ordered allocator may
//     reuse it on `stream` at once.
// The allocator must outlive every block it handed out (the backend keeps a shared_ptr).
// Thread safety: whatever the implementation gives; the module calls it from one thread at a
// time per backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor_view.h"

namespace kda {

/// Every block an Allocator returns is aligned to this many bytes (cudaMalloc's guarantee; the
/// kernels' vector and TMA accesses need 16).
constexpr int64_t kAllocatorAlignment = 256;

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// See the file comment. nullptr = out of memory.
  virtual void* allocate(int64_t bytes, const Device& device, cudaStream_t stream) = 0;
  /// See the file comment. Never throws.
  virtual void deallocate(void* ptr, int64_t bytes, const Device& device,
                          cudaStream_t stream) noexcept = 0;
  /// For messages: "torch caching allocator", "engine allocator", ...
  virtual const char* name() const { return "engine allocator"; }
};

}  // namespace kda
