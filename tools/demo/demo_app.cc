#include "tools/demo/demo_app.h"

#include <fmt/format.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "core/platform.h"
#include "tools/demo/demo_args.h"
#include "tools/demo/demo_check.h"
#include "tools/demo/demo_driver.h"
#include "tools/demo/demo_model.h"
#include "tools/demo/demo_prefix_check.h"
#include "tools/demo/demo_report.h"

namespace kda::demo {

namespace {

// Workload defaults per device: the host implementation is a scalar reference (about a
// second per verify -> commit round of the full Kimi-Linear shape on 2 cores), so the host
// default is the Kimi-Linear shape at 2 layers and a small batch; CUDA runs the full model.
struct DeviceDefaults {
  int layers;  ///< 0: the preset's
  int requests, prompt_len, rounds;
};
constexpr DeviceDefaults kHostDefaults{2, 4, 32, 16};
constexpr DeviceDefaults kCudaDefaults{0, 16, 64, 32};

class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

std::optional<Platform> platform_override(PlatformChoice c) {
  switch (c) {
    case PlatformChoice::kDetect:
      return std::nullopt;
    case PlatformChoice::kSM90:
      return fake_platform(9, 0);
    case PlatformChoice::kSM100:
      return fake_platform(10, 0);
    case PlatformChoice::kOther:
      return fake_platform(8, 0);
  }
  return std::nullopt;
}

// Prints every round (at most ~25 lines per run: larger runs print every k-th and the last).
ProgressFn progress_printer(std::ostream& err, bool quiet) {
  if (quiet) {
    return nullptr;
  }
  return [&err](const RunSpec& spec, const RoundRecord& rec) {
    const int every = spec.rounds <= 25 ? 1 : (spec.rounds + 24) / 25;
    if ((rec.round + 1) % every == 0 || rec.round + 1 == spec.rounds) {
      err << progress_line(spec, rec) << std::endl;
    }
  };
}

void announce(std::ostream& err, bool quiet, const RunSpec& s) {
  if (!quiet) {
    err << fmt::format("[{}] {}: {} layers, {} requests, prompt {}, {} rounds{}, {}", s.label,
                       device_name(s.device), s.model.num_layers, s.requests, s.prompt_len,
                       s.rounds, s.cuda_graph ? " (CUDA graph)" : "",
                       describe_engine_flags(s.flags))
        << std::endl;
  }
}

// Runs `spec` to completion with progress, then compares it with the primary.
CheckOutcome run_check(const DemoRun& primary, const RunSpec& spec, CompareRule rule,
                       std::ostream& err, bool quiet) {
  const Stopwatch run_sw;
  announce(err, quiet, spec);
  DemoRun check(spec);
  check.run(progress_printer(err, quiet));
  const double run_seconds = run_sw.seconds();
  const Stopwatch compare_sw;
  CheckOutcome out = compare_runs(primary, check, rule);
  out.run_seconds = run_seconds;
  out.compare_seconds = compare_sw.seconds();
  return out;
}

int run(const DemoArgs& args, std::ostream& out, std::ostream& err) {
  const Stopwatch total;
  set_log_level(args.log_level);
  SummaryContext ctx;

  // ---- device ----
  Device device = Device::host();
  if (args.device != DeviceChoice::kHost) {
    const Platform p = detect_platform(args.device == DeviceChoice::kCuda ? args.cuda_index : -1);
    if (p.has_device) {
      device = Device::cuda(p.device);
      ctx.device_text = fmt::format("{}: {} (CUDA kernels)", device_name(device), p.describe());
    } else if (args.device == DeviceChoice::kCuda) {
      KDA_THROW(ErrorCode::kUnsupported, "--device cuda:{}: no usable CUDA device: {}",
                args.cuda_index, p.reason);
    } else {
      ctx.notes.push_back(
          fmt::format("--device auto: {}; running the host implementation", p.describe()));
    }
  }
  if (!device.is_cuda()) {
    ctx.device_text = "host (CPU reference implementation of every kernel)";
  }

  // ---- sizes: flags, else the device's defaults ----
  const DeviceDefaults& dd = device.is_cuda() ? kCudaDefaults : kHostDefaults;
  const ModelPreset& preset = *find_preset(args.preset);
  const int default_layers = dd.layers > 0 ? dd.layers : preset.config.num_layers;
  RunSpec spec;
  spec.label = "primary";
  spec.model = resolve_model(args, default_layers);
  spec.device = device;
  spec.platform = platform_override(args.platform);
  spec.requests = args.requests.value_or(dd.requests);
  spec.prompt_len = args.prompt_len.value_or(dd.prompt_len);
  spec.rounds = args.rounds.value_or(dd.rounds);
  spec.seed = args.seed;
  spec.accept = args.accept;
  spec.prefix = resolve_prefix(args, spec.prompt_len);
  spec.draft_shape = args.draft_shape;
  if (spec.prefix.enabled && spec.draft_shape != DraftShapeKind::kChain) {
    throw UsageError(fmt::format("--draft-shape {}: --prefix-cache runs chain drafts only",
                                 draft_shape_kind_name(spec.draft_shape)));
  }
  if (spec.draft_shape == DraftShapeKind::kTree && !args.flags.tree_drafts()) {
    throw UsageError(
        "--draft-shape tree: needs --speculative-eagle-topk > 1 (children per tree node)");
  }
  if (args.cuda_graph.value_or(false) && !device.is_cuda()) {
    throw UsageError(
        "--cuda-graph: needs a CUDA device; this run is on the host (use --device cuda)");
  }
  spec.cuda_graph = args.cuda_graph.value_or(device.is_cuda());
  spec.flags = args.flags;
  if (!args.max_running_requests_given) {
    spec.flags.max_running_requests = spec.requests;
  } else if (spec.requests > spec.flags.max_running_requests) {
    throw UsageError(fmt::format("--requests {} exceeds --max-running-requests {}", spec.requests,
                                 spec.flags.max_running_requests));
  }
  std::string layer_note;
  if (!args.layers && spec.model.num_layers != preset.config.num_layers) {
    layer_note = fmt::format(" (host default; the preset has {}: --layers {})",
                             preset.config.num_layers, preset.config.num_layers);
  }
  const bool overridden = args.heads || args.hv_heads || args.head_k_dim || args.head_v_dim ||
                          args.gate || args.conv_weight || args.conv_bias;
  ctx.model_text =
      fmt::format("{}{}: {} layer{}{}, {}", preset.name, overridden ? " with shape overrides" : "",
                  spec.model.num_layers, spec.model.num_layers == 1 ? "" : "s", layer_note,
                  describe_shape(spec.model));
  if (!device.is_cuda() && !args.requests && !args.rounds) {
    ctx.notes.push_back("host defaults: small batch and few rounds (the host kernels are scalar)");
  }

  // ---- checks to run ----
  CheckChoice check = args.check;
  if (check == CheckChoice::kAuto) {
    check = device.is_cuda() ? CheckChoice::kBoth : CheckChoice::kMode;
  }
  if (!device.is_cuda() && (check == CheckChoice::kHost || check == CheckChoice::kBoth)) {
    throw UsageError(fmt::format(
        "--check {}: the host check compares a CUDA run with the host implementation; this run "
        "is on the host (use --check mode)",
        check_choice_name(check)));
  }

  // ---- primary run ----
  const bool quiet = args.quiet;
  const Stopwatch primary_sw;
  announce(err, quiet, spec);
  DemoRun primary(spec);
  primary.prefill();
  if (!quiet) {
    err << fmt::format("[{}] prefill done: {} x {} prompt tokens in {:.1f} ms", spec.label,
                       spec.requests, spec.prompt_len, primary.stats().prefill_ms)
        << std::endl;
  }
  const ProgressFn progress = progress_printer(err, quiet);
  for (int r = 0; r < spec.rounds; ++r) {
    const RoundRecord rec = primary.run_round(r);
    if (progress) {
      progress(spec, rec);
    }
  }
  primary.finish();
  ctx.primary_seconds = primary_sw.seconds();

  // ---- independent runs + compare ----
  std::vector<CheckOutcome> checks;
  if (check == CheckChoice::kMode || check == CheckChoice::kBoth) {
    std::string note;
    const RunSpec other = other_mode_spec(spec, &note);
    if (!note.empty()) {
      ctx.notes.push_back(note);
    }
    checks.push_back(run_check(primary, other, CompareRule::kBitwise, err, quiet));
  }
  if (check == CheckChoice::kHost || check == CheckChoice::kBoth) {
    const RunSpec host =
        host_reference_spec(spec, args.check_host_layers, args.check_host_requests);
    if (host.model.num_layers < spec.model.num_layers || host.requests < spec.requests) {
      ctx.notes.push_back(fmt::format(
          "host check run reduced to {} of {} layers and {} of {} requests (the host kernels are "
          "slow; --check-host-layers / --check-host-requests, 0 = all)",
          host.model.num_layers, spec.model.num_layers, host.requests, spec.requests));
    }
    checks.push_back(run_check(primary, host, CompareRule::kRelL2, err, quiet));
  }
  if (spec.prefix.enabled && check != CheckChoice::kOff) {
    if (!quiet) {
      err << fmt::format(
                 "[check (prefix cache)] recomputing {} requests' histories by extend on {}",
                 spec.requests, device_name(spec.device))
          << std::endl;
    }
    checks.push_back(check_prefix_cache(primary));
  }

  ctx.total_seconds = total.seconds();
  print_summary(out, ctx, primary, checks);
  for (const CheckOutcome& c : checks) {
    if (!c.passed()) {
      return kExitFail;
    }
  }
  return kExitPass;
}

}  // namespace

int run_kda_demo(int argc, char** argv, std::ostream& out, std::ostream& err) {
  std::string program = argc > 0 && argv[0] != nullptr ? argv[0] : "kda_demo";
  program = program.substr(program.find_last_of('/') + 1);  // npos + 1 == 0: no slash
  try {
    const DemoArgs args = parse_demo_args(argc, argv);
    if (args.help) {
      out << demo_help(program);
      return kExitPass;
    }
    return run(args, out, err);
  } catch (const UsageError& e) {
    err << "kda_demo: error: " << e.what() << "\n(see --help)" << std::endl;
    return kExitUsage;
  } catch (const Error& e) {
    err << "kda_demo: error: " << e.what() << std::endl;
    return kExitFail;
  } catch (const std::exception& e) {
    err << "kda_demo: error: " << e.what() << std::endl;
    return kExitFail;
  }
}

}  // namespace kda::demo
