// demo_device.h: the few device-side helpers the demo needs beyond the backend: a stream, a
// pinned staging buffer for the accepted lengths, and a clock of marks on the stream.
//
// Plain C++ over the CUDA runtime API. For Device::host() nothing here calls CUDA: the stream
// is nullptr (the host kernel set ignores it), staging is ordinary memory and the clock reads
// std::chrono::steady_clock (the host kernels run synchronously, so a mark after a call is
// the call's end). For CUDA the clock records cudaEvents on the stream and reads them after
// the round has finished. All classes own their resources (RAII, move-only).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/tensor_view.h"

namespace kda::demo {

/// A CUDA stream (cudaStreamCreate: it orders with the legacy default stream, so the
/// synchronous Buffer uploads between rounds cannot overtake the round's kernels); nullptr on
/// the host.
class DemoStream {
 public:
  explicit DemoStream(const Device& device);
  ~DemoStream();
  DemoStream(const DemoStream&) = delete;
  DemoStream& operator=(const DemoStream&) = delete;

  cudaStream_t get() const { return stream_; }
  /// Waits for all work on the stream (no-op on the host).
  void synchronize() const;

 private:
  Device device_;
  cudaStream_t stream_ = nullptr;
};

/// [n] int32 on the device plus a pinned host staging copy: the host writes the accepted
/// lengths into staging(), upload() enqueues the copy on the stream (cudaMemcpyAsync; on the
/// host a memcpy). The caller must not rewrite staging() before that copy has run (the demo
/// synchronises at the end of every round).
class AcceptedLengths {
 public:
  AcceptedLengths(const Device& device, int n);
  ~AcceptedLengths();
  AcceptedLengths(const AcceptedLengths&) = delete;
  AcceptedLengths& operator=(const AcceptedLengths&) = delete;

  int32_t* staging() { return staging_; }
  void upload(int n, cudaStream_t stream);
  /// The first `n` entries on the device, as commit() takes them.
  TensorView device_view(int n) const;

 private:
  Device device_;
  Buffer device_buffer_;
  int32_t* staging_ = nullptr;       // cudaMallocHost'ed (CUDA) or new[] (host)
  std::vector<int32_t> host_store_;  // backs staging_ on the host
};

/// Time marks on a stream: mark(i) for i = 0..n-1 in order, then elapsed_ms(i, j) between two
/// marks once finish() has returned (CUDA: cudaEventSynchronize on the last mark).
class StreamClock {
 public:
  StreamClock(const Device& device, cudaStream_t stream, int marks);
  ~StreamClock();
  StreamClock(const StreamClock&) = delete;
  StreamClock& operator=(const StreamClock&) = delete;

  void mark(int i);
  /// Waits until mark `last` has been reached on the device.
  void finish(int last);
  double elapsed_ms(int from, int to) const;

 private:
  Device device_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  std::vector<std::chrono::steady_clock::time_point> host_marks_;
};

}  // namespace kda::demo
