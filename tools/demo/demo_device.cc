#include "tools/demo/demo_device.h"

#include <cstring>

#include "core/cuda_check.h"
#include "core/error.h"

namespace kda::demo {

DemoStream::DemoStream(const Device& device) : device_(device) {
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(cudaSetDevice(device_.index));
    KDA_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
}

DemoStream::~DemoStream() {
  if (stream_ != nullptr) {
    cudaStreamDestroy(stream_);  // destructor: nothing to report to
  }
}

void DemoStream::synchronize() const {
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

StagedInts::StagedInts(const Device& device, int n)
    : device_(device), device_buffer_(device, static_cast<int64_t>(n) * sizeof(int32_t)) {
  KDA_CHECK(n >= 1, "StagedInts: n = {} (expected >= 1)", n);
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&staging_), n * sizeof(int32_t)));
  } else {
    host_store_.assign(static_cast<size_t>(n), 0);
    staging_ = host_store_.data();
  }
}

StagedInts::~StagedInts() {
  if (device_.is_cuda() && staging_ != nullptr) {
    cudaFreeHost(staging_);
  }
}

void StagedInts::upload(int n, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
  KDA_CHECK(n >= 1 && static_cast<int64_t>(bytes) <= device_buffer_.bytes(),
            "StagedInts::upload: n = {} outside [1, {}]", n,
            device_buffer_.bytes() / static_cast<int64_t>(sizeof(int32_t)));
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(
        cudaMemcpyAsync(device_buffer_.data(), staging_, bytes, cudaMemcpyHostToDevice, stream));
  } else {
    std::memcpy(device_buffer_.data(), staging_, bytes);
  }
}

TensorView StagedInts::device_view(int n) const { return device_buffer_.view(DType::kI32, {n}); }

StreamClock::StreamClock(const Device& device, cudaStream_t stream, int marks)
    : device_(device), stream_(stream) {
  KDA_CHECK(marks >= 2, "StreamClock: {} marks (expected >= 2)", marks);
  if (device_.is_cuda()) {
    events_.assign(static_cast<size_t>(marks), nullptr);
    for (cudaEvent_t& e : events_) {
      KDA_CUDA_CHECK(cudaEventCreate(&e));
    }
  } else {
    host_marks_.resize(static_cast<size_t>(marks));
  }
}

StreamClock::~StreamClock() {
  for (cudaEvent_t e : events_) {
    if (e != nullptr) {
      cudaEventDestroy(e);
    }
  }
}

void StreamClock::mark(int i) {
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(cudaEventRecord(events_.at(static_cast<size_t>(i)), stream_));
  } else {
    host_marks_.at(static_cast<size_t>(i)) = std::chrono::steady_clock::now();
  }
}

void StreamClock::finish(int last) {
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(cudaEventSynchronize(events_.at(static_cast<size_t>(last))));
  }
}

double StreamClock::elapsed_ms(int from, int to) const {
  if (device_.is_cuda()) {
    float ms = 0.0f;
    KDA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_.at(static_cast<size_t>(from)),
                                        events_.at(static_cast<size_t>(to))));
    return ms;
  }
  return std::chrono::duration<double, std::milli>(host_marks_.at(static_cast<size_t>(to)) -
                                                   host_marks_.at(static_cast<size_t>(from)))
      .count();
}

CudaGraph::~CudaGraph() { reset(); }

void CudaGraph::reset() {
  if (exec_ != nullptr) {
    cudaGraphExecDestroy(exec_);  // teardown: nothing to report to
    exec_ = nullptr;
  }
  if (graph_ != nullptr) {
    cudaGraphDestroy(graph_);
    graph_ = nullptr;
  }
}

void CudaGraph::capture(cudaStream_t stream, const std::function<void()>& body) {
  KDA_CHECK(stream != nullptr, "CudaGraph::capture: needs a CUDA stream");
  reset();
  KDA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  try {
    body();
  } catch (...) {
    // Leave the stream out of capture mode; the body's error is the one to report.
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial != nullptr) {
      cudaGraphDestroy(partial);
    }
    throw;
  }
  KDA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
  KDA_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

void CudaGraph::launch(cudaStream_t stream) const {
  KDA_CHECK(exec_ != nullptr, "CudaGraph::launch: nothing captured");
  KDA_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

}  // namespace kda::demo
