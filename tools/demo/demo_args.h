// demo_args.h: the command line of kda_demo (plain C++; never touches a device, so --help and
// argument errors work on any machine).
//
// The engine flags (contract §5) are parsed by the backend's own parser (backend/flags.h),
// which consumes them; the demo's flags are parsed from what is left. Anything unknown is an
// error (UsageError, exit code 2).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "backend/flags.h"
#include "backend/model_config.h"
#include "tools/demo/demo_accept.h"
#include "tools/demo/demo_prefix.h"

namespace kda::demo {

/// A bad command line; the message names the flag, the value and what is allowed.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DeviceChoice : uint8_t {
  kAuto,  ///< CUDA device 0 when detect_platform() finds one, else the host
  kHost,
  kCuda,
};

/// Which independent runs check the final state.
enum class CheckChoice : uint8_t {
  kAuto,  ///< host: mode; CUDA: both
  kOff,
  kMode,  ///< a second backend on the same device in the other record mode: bitwise
  kHost,  ///< CUDA only: the host implementation (reduced sizes): relative L2
  kBoth,
};

/// The platform the dispatcher is told (BackendOptions::platform_override).
enum class PlatformChoice : uint8_t { kDetect, kSM90, kSM100, kOther };

struct DemoArgs {
  bool help = false;

  // ---- model: a preset, then per-field overrides ----
  std::string preset = "kimi-linear";
  std::optional<int> layers;  ///< unset: device default (see resolve_model)
  std::optional<int> heads, hv_heads, head_k_dim, head_v_dim;
  std::optional<GateKind> gate;  ///< from --lower-bound (none: standard)
  float lower_bound = 0.0f;      ///< with gate == kSafe
  std::optional<ConvWeightType> conv_weight;
  std::optional<bool> conv_bias;

  // ---- workload (unset: device default) ----
  std::optional<int> requests, prompt_len, rounds;
  uint64_t seed = 1;
  AcceptSpec accept;
  DraftShapeKind draft_shape = DraftShapeKind::kChain;

  // ---- prefix caching (demo_prefix.h) ----
  bool prefix_cache = false;
  std::optional<int> prefix_len;  ///< unset: half the prompt (at least 1)
  std::optional<int> prefix_group, track_interval;

  // ---- engine flags (backend/flags.h) ----
  EngineFlags flags;
  bool max_running_requests_given = false;  ///< else it follows --requests

  // ---- running ----
  DeviceChoice device = DeviceChoice::kAuto;
  int cuda_index = 0;
  PlatformChoice platform = PlatformChoice::kDetect;
  std::optional<bool> cuda_graph;  ///< unset: on for CUDA, off on the host
  CheckChoice check = CheckChoice::kAuto;
  int check_host_layers = 2;    ///< 0 = all
  int check_host_requests = 2;  ///< 0 = all
  bool quiet = false;
  std::string log_level = "warn";
};

/// Parses argv (argv[0] is the program). Throws UsageError on any bad or unknown argument.
/// --help / -h anywhere before a bare `--` sets help and skips every other check.
DemoArgs parse_demo_args(int argc, char** argv);

/// The full --help text (demo flags, then the engine flags' help from backend/flags.h).
std::string demo_help(const std::string& program);

/// The prefix-cache spec of `args` for a prompt of `prompt_len` tokens. Throws UsageError when
/// a prefix flag comes without --prefix-cache, or --prefix-len exceeds the prompt.
PrefixSpec resolve_prefix(const DemoArgs& args, int prompt_len);

/// The model of `args`: the preset, the overrides, `default_layers` when --layers is unset.
/// Validates it (ModelConfig::validate); throws UsageError naming the flag on a bad shape.
ModelConfig resolve_model(const DemoArgs& args, int default_layers);

const char* check_choice_name(CheckChoice c);

}  // namespace kda::demo
