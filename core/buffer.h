// buffer.h: an owning, move-only block of host or CUDA memory (RAII).
//
// Host buffers are 256-byte aligned; CUDA buffers come from cudaMalloc (256-byte aligned), or
// both from an engine's Allocator (core/allocator.h) when one is given: then the block is
// returned to it, with the same size, device and stream, when the buffer dies.
// upload()/download()/fill are synchronous set-up helpers for tools and tests; nothing on
// the verify/commit path allocates or copies through Buffer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/tensor_view.h"

namespace kda {

class Buffer {
 public:
  Buffer() = default;
  /// Allocates `bytes` on `device`; throws kOutOfMemory / kCuda / kUnsupported.
  Buffer(Device device, int64_t bytes);
  /// Allocates `bytes` on `device` from `allocator` on `stream` (null allocator: as above), then
  /// (CUDA) synchronises `stream`, so the block is free of the stream's earlier work. Throws
  /// kOutOfMemory when it returns nullptr, kInvalidArgument (after returning the block) when the
  /// block is not aligned to kAllocatorAlignment.
  Buffer(Device device, int64_t bytes, std::shared_ptr<Allocator> allocator, cudaStream_t stream);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  /// Whether the block came from an engine Allocator.
  bool from_allocator() const { return allocator_ != nullptr; }

  /// A contiguous view of the start of the buffer; throws if it does not fit.
  TensorView view(DType dtype, std::initializer_list<int64_t> shape) const;

  /// Synchronous copies between this buffer (at byte `offset`) and host memory.
  void upload(const void* src, int64_t bytes, int64_t offset = 0);
  void download(void* dst, int64_t bytes, int64_t offset = 0) const;

 private:
  void release() noexcept;

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_{};
  std::shared_ptr<Allocator> allocator_;  // null: cudaMalloc / aligned_alloc
  cudaStream_t stream_ = nullptr;         // the allocator's stream
};

/// Synchronous byte copy between any two devices (host or CUDA); for set-up and tests.
void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                int64_t bytes);

/// Copies a whole (possibly strided) view's elements into a host vector, packed row-major.
template <typename T>
std::vector<T> to_host_vector(const TensorView& v);

/// Copies a packed row-major host vector into a (possibly strided) view.
template <typename T>
void from_host_vector(const std::vector<T>& src, const TensorView& v);

}  // namespace kda
