// bench_timer.h: CUDA-graph timing of kda_bench (contract §6 / upstream §7.1 methodology).
//
// `calls` enqueues are captured into ONE graph on a non-default stream, the graph is
// replayed `warmup` times, then `reps` repetitions of `iters` replays are timed between two
// events each; the time per call of a repetition is elapsed / (iters * calls). Before the
// capture the same enqueues run once eagerly (module loading, cudaFuncSetAttribute, errors
// outside the capture).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "tools/bench/bench_timing.h"

namespace kda::bench {

struct TimerConfig {
  int warmup = 5;
  int iters = 200;
  int reps = 5;
};

/// Times `enqueue(i)`, i = 0 .. calls-1, captured in one graph on `stream` (not the legacy
/// default stream). Throws kda::Error on any CUDA failure (the capture is ended first).
Timing time_in_graph(cudaStream_t stream, int calls, const std::function<void(int call)>& enqueue,
                     const TimerConfig& config);

/// Captures `enqueue` once into a graph on `stream` (not the legacy default stream; nothing runs
/// uncaptured), then `replays` times: launches it, synchronises, calls `after_replay(r)`. Throws
/// kda::Error on any CUDA failure (the capture is ended first).
void replay_in_graph(cudaStream_t stream, const std::function<void()>& enqueue, int replays,
                     const std::function<void(int replay)>& after_replay);

/// Device copy rate: `calls` cudaMemcpyAsync D2D of `bytes` per graph, timed as above;
/// returns GB/s counting read + write (2 * bytes per copy), and the timing.
double measure_copy_gbps(cudaStream_t stream, int64_t bytes, int calls, const TimerConfig& config,
                         Timing* timing = nullptr);

/// RAII non-blocking stream on the current device.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace kda::bench
