// demo_device.h: the few device-side helpers the demo needs beyond the backend: a stream,
// pinned staging for the small per-round values (accepted lengths, the round number), a clock
// of marks on the stream, and one captured CUDA graph.
//
// Plain C++ over the CUDA runtime API. For Device::host() nothing here calls CUDA: the stream
// is nullptr (the host kernel set ignores it), staging is ordinary memory and the clock reads
// std::chrono::steady_clock (the host kernels run synchronously, so a mark after a call is
// the call's end); a CudaGraph needs a CUDA stream. For CUDA the clock records cudaEvents on
// the stream and reads them after the round has finished. All classes own their resources
// (RAII, move-only).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/buffer.h"
#include "core/tensor_view.h"

namespace kda::demo {

/// A CUDA stream (cudaStreamCreate: it orders with the legacy default stream, so synchronous
/// Buffer copies before and after a run cannot overtake its kernels); nullptr on the host.
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

/// [n] int32 on the device plus a pinned host staging copy: the host writes the values into
/// staging(), upload() enqueues the copy on the stream (cudaMemcpyAsync; on the host a
/// memcpy). The caller must not rewrite staging() before that copy has run (the demo
/// synchronises at the end of every round). device_data() has a fixed address, so a captured
/// graph that reads it sees the values uploaded before each replay.
class StagedInts {
 public:
  StagedInts(const Device& device, int n);
  ~StagedInts();
  StagedInts(const StagedInts&) = delete;
  StagedInts& operator=(const StagedInts&) = delete;

  int32_t* staging() { return staging_; }
  void upload(int n, cudaStream_t stream);
  const int32_t* device_data() const { return static_cast<const int32_t*>(device_buffer_.data()); }
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

/// One CUDA graph captured from a stream and instantiated (CUDA only).
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// Captures what `body` enqueues on `stream` (cudaStreamCaptureModeGlobal; nothing runs)
  /// and instantiates it, replacing any earlier graph. If `body` or the capture fails, the
  /// capture is ended, nothing is kept and the error propagates.
  void capture(cudaStream_t stream, const std::function<void()>& body);
  bool captured() const { return exec_ != nullptr; }
  /// Enqueues one replay on `stream`.
  void launch(cudaStream_t stream) const;

 private:
  void reset();

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace kda::demo
