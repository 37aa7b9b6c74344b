#include "tools/bench/bench_timer.h"

#include <algorithm>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "core/error.h"

namespace kda::bench {

namespace {

struct GraphExec {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphExec() {
    if (exec != nullptr) {
      cudaGraphExecDestroy(exec);  // destructor: nothing to report to
    }
    if (graph != nullptr) {
      cudaGraphDestroy(graph);
    }
  }
};

/// Captures `enqueue` on `stream` into `g` and instantiates it. On a throw the capture is ended
/// first (the stream stays usable) and the error rethrown.
void capture(cudaStream_t stream, const std::function<void()>& enqueue, GraphExec& g) {
  KDA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);  // leave the stream usable; the error is rethrown
    if (broken != nullptr) {
      cudaGraphDestroy(broken);
    }
    cudaGetLastError();
    throw;
  }
  KDA_CUDA_CHECK(cudaStreamEndCapture(stream, &g.graph));
  KDA_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
}

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    KDA_CUDA_CHECK(cudaEventCreate(&start));
    KDA_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

Stream::Stream() { KDA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (stream_ != nullptr) {
    cudaStreamDestroy(stream_);
  }
}

Timing time_in_graph(cudaStream_t stream, int calls, const std::function<void(int call)>& enqueue,
                     const TimerConfig& config) {
  KDA_CHECK(stream != nullptr, "time_in_graph: capture needs a non-default stream");
  KDA_CHECK(calls >= 1 && config.iters >= 1 && config.reps >= 1 && config.warmup >= 0,
            "time_in_graph: calls={} iters={} reps={} warmup={}", calls, config.iters, config.reps,
            config.warmup);

  // Eager pass: loads modules, sets kernel attributes, surfaces launch errors un-captured.
  for (int i = 0; i < calls; ++i) {
    enqueue(i);
  }
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));

  GraphExec g;
  capture(
      stream,
      [&] {
        for (int i = 0; i < calls; ++i) {
          enqueue(i);
        }
      },
      g);

  for (int i = 0; i < config.warmup; ++i) {
    KDA_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
  }
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));

  EventPair ev;
  Timing t;
  t.calls_per_graph = calls;
  for (int r = 0; r < config.reps; ++r) {
    KDA_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    for (int i = 0; i < config.iters; ++i) {
      KDA_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
    }
    KDA_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
    KDA_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    float ms = 0.0f;
    KDA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    t.rep_us.push_back(static_cast<double>(ms) * 1e3 / (static_cast<double>(config.iters) * calls));
  }
  t.median_us = median(t.rep_us);
  t.min_us = *std::min_element(t.rep_us.begin(), t.rep_us.end());
  t.max_us = *std::max_element(t.rep_us.begin(), t.rep_us.end());
  return t;
}

void replay_in_graph(cudaStream_t stream, const std::function<void()>& enqueue, int replays,
                     const std::function<void(int replay)>& after_replay) {
  KDA_CHECK(stream != nullptr, "replay_in_graph: capture needs a non-default stream");
  KDA_CHECK(replays >= 1, "replay_in_graph: replays={}", replays);
  GraphExec g;
  capture(stream, enqueue, g);
  for (int r = 0; r < replays; ++r) {
    KDA_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
    after_replay(r);
  }
}

double measure_copy_gbps(cudaStream_t stream, int64_t bytes, int calls, const TimerConfig& config,
                         Timing* timing) {
  int device = 0;
  KDA_CUDA_CHECK(cudaGetDevice(&device));
  Buffer src(Device::cuda(device), bytes), dst(Device::cuda(device), bytes);
  KDA_CUDA_CHECK(cudaMemsetAsync(src.data(), 0x5a, static_cast<size_t>(bytes), stream));
  const Timing t = time_in_graph(
      stream, calls,
      [&](int) {
        KDA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes),
                                       cudaMemcpyDeviceToDevice, stream));
      },
      config);
  if (timing != nullptr) {
    *timing = t;
  }
  return 2.0 * static_cast<double>(bytes) / (t.median_us * 1e3);
}

}  // namespace kda::bench
