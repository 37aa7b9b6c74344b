// runner.h: replays a loaded problem through a KernelSet (host reference or CUDA kernels):
// verify on the chosen path, then commit if accepted lengths were captured; returns every
// output tensor as a host copy and writes them (.npy + summary.json) into a directory.
//
// The KernelSet is called directly with VerifyParams / CommitParams built over buffers that
// hold the captured tensors as they are (captured slot and row indices, captured S and R),
// rather than through KdaAttentionBackend, whose pool owns its own slots and scratch.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/platform.h"
#include "core/tensor_view.h"
#include "dispatch/verify_dispatch.h"
#include "tools/npy/npy.h"
#include "tools/replay/problem.h"

namespace kda::replay {

/// --path: the dispatcher's choice, or a forced path.
enum class PathChoice : uint8_t { kAuto, kFused, kUnfused };
/// "auto" / "fused" / "unfused".
const char* path_choice_name(PathChoice c);

struct RunOptions {
  Device device = Device::host();
  PathChoice path = PathChoice::kAuto;
  int block_v = 0;                   ///< fused V tile; 0 = kernels::kDefaultFusedBlockV
  int fused_ring_max_batch = 1;      ///< dispatcher flag (--kda-fused-ring-max-batch)
  std::optional<Platform> platform;  ///< pretend platform; nullopt: detect_platform
  int repeat = 1;                    ///< verify calls (same outputs each time); the first is kept
};

/// One output tensor, packed, in the layout it is written in (conv tensors converted back to
/// the manifest's layout).
struct OutputTensor {
  std::string name;  ///< file name without ".npy"
  npy::NpyType type = npy::NpyType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  template <typename T>
  std::vector<T> as() const;
};

struct RunResult {
  std::string device;      ///< "host" / "cuda:0"
  std::string kernel_set;  ///< KernelSet::name()
  Platform platform;       ///< what the dispatcher saw
  RecordMode mode = RecordMode::kRing;
  PathChoice requested = PathChoice::kAuto;
  VerifyPath path = VerifyPath::kUnfused;  ///< the path that ran
  int block_v = 0;                         ///< fused tile that ran (0 when unfused)
  DispatchDecision decision;               ///< the dispatcher's choice (also when forced)
  bool committed = false;
  int32_t commit_error_flag = 0;  ///< 1: an accepted length outside [1, T] was skipped
  struct Timings {
    double upload_ms = 0, verify_first_ms = 0, verify_mean_ms = 0, commit_ms = 0, download_ms = 0;
    int verify_calls = 0;
  } timings;
  std::vector<OutputTensor> outputs;  ///< output, conv_window, records, [ssm_state, conv_state]

  const OutputTensor* find(const std::string& name) const;
};

/// Runs verify (+ commit) of `p`. Throws kda::Error (invalid problem for the kernels, no CUDA
/// device, CUDA failure); a CUDA run synchronises the device before returning.
RunResult run_replay(const ReplayProblem& p, const RunOptions& options);

/// Writes every output as OUT/<name>.npy and OUT/summary.json (created if missing). Returns
/// the summary JSON text. `load_ms` / `write_ms` are reported in the summary's timings.
std::string write_outputs(const ReplayProblem& p, const RunResult& r, const std::string& out_dir,
                          npy::Bf16Descr bf16, double load_ms);

}  // namespace kda::replay
