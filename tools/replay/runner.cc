// runner.cc: buffers, params and the verify / commit calls of one replay.
#include "tools/replay/runner.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend/kernel_set_factory.h"
#include "core/buffer.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"

namespace kda::replay {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;
constexpr int64_t kW1 = kConvHistory;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Every timing includes the device's completion: a CUDA run synchronises after each phase.
void sync(const Device& device) {
  if (device.is_cuda()) {
    KDA_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

// A device copy of a host vector (no buffer for an empty one).
template <typename T>
Buffer upload(const std::vector<T>& v, const Device& device) {
  const int64_t bytes = static_cast<int64_t>(v.size() * sizeof(T));
  Buffer b(device, bytes);
  if (bytes > 0) {
    b.upload(v.data(), bytes);
  }
  return b;
}

Buffer upload_bytes(const std::vector<uint8_t>& v, const Device& device) {
  return upload(v, device);
}

template <typename T>
std::vector<T> download(const Buffer& b, int64_t count) {
  std::vector<T> v(static_cast<size_t>(count));
  if (count > 0) {
    b.download(v.data(), count * static_cast<int64_t>(sizeof(T)));
  }
  return v;
}

template <typename T>
OutputTensor make_output(const std::string& name, std::vector<int64_t> shape,
                         const std::vector<T>& values) {
  OutputTensor o;
  o.name = name;
  o.type = npy::npy_type_of<T>();
  o.shape = std::move(shape);
  o.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) {
    std::memcpy(o.bytes.data(), values.data(), o.bytes.size());
  }
  return o;
}

// All device memory of one replay.
struct DeviceTensors {
  Buffer mixed_qkv, a, b, A_log, dt_bias, conv_weight, conv_bias, conv_state, ssm_state;
  Buffer slots, rows, accepted, error_flag;
  Buffer query_start_loc, parents, accepted_paths, checked_accepted;  // draft shape (§8)
  Buffer out, conv_window, snapshots, rawv, rawk, g, beta, qkv_act;
};

Json shape_json(const std::vector<int64_t>& shape) {
  Json j = Json::array();
  for (int64_t d : shape) {
    j.push_back(d);
  }
  return j;
}

// The tile of a forced fused run: the one the dispatcher picks for this very call with its
// fused gates open (so --block-v 0 follows the dispatcher's default, batch-dependent or not);
// the resolved flag if even then the dispatcher would not fuse (the kernel will say why).
int forced_fused_block_v(const DispatchProblem& dp, const DispatchFlags& flags) {
  DispatchFlags open = flags;
  open.fused_verify = true;
  open.fused_ring_max_batch = std::numeric_limits<int>::max();
  const DispatchDecision d = choose_verify_path(dp, fake_platform(9, 0), open);
  return d.fused() ? d.block_v : resolve_block_v(flags.block_v);
}

}  // namespace

const char* path_choice_name(PathChoice c) {
  switch (c) {
    case PathChoice::kAuto:
      return "auto";
    case PathChoice::kFused:
      return "fused";
    case PathChoice::kUnfused:
      return "unfused";
  }
  return "?";
}

template <typename T>
std::vector<T> OutputTensor::as() const {
  KDA_CHECK(type == npy::npy_type_of<T>(), "OutputTensor {}: dtype {}, asked for {}", name,
            npy::npy_type_name(type), npy::npy_type_name(npy::npy_type_of<T>()));
  std::vector<T> v(bytes.size() / sizeof(T));
  if (!v.empty()) {
    std::memcpy(v.data(), bytes.data(), bytes.size());
  }
  return v;
}
template std::vector<float> OutputTensor::as<float>() const;
template std::vector<int32_t> OutputTensor::as<int32_t>() const;
template std::vector<bf16_t> OutputTensor::as<bf16_t>() const;

const OutputTensor* RunResult::find(const std::string& name) const {
  for (const OutputTensor& o : outputs) {
    if (o.name == name) {
      return &o;
    }
  }
  return nullptr;
}

namespace {

// ---- the steps of run_replay, in order ----

// Every captured tensor on `dev`, outputs zeroed; the record buffers of the capture's mode only
// (rings or snapshots), the accepted lengths and the error flag only if there are accepted lengths.
DeviceTensors upload_problem(const ReplayProblem& p, const Device& dev) {
  DeviceTensors t;
  t.mixed_qkv = upload(p.mixed_qkv, dev);
  t.a = upload(p.a, dev);
  t.b = upload(p.b, dev);
  t.A_log = upload(p.A_log, dev);
  t.dt_bias = upload(p.dt_bias, dev);
  t.conv_weight = upload_bytes(p.conv_weight, dev);
  t.conv_bias = upload_bytes(p.conv_bias, dev);
  t.conv_state = upload(p.conv_state, dev);
  t.ssm_state = upload(p.ssm_state, dev);
  t.slots = upload(p.slots, dev);
  t.rows = upload(p.rows, dev);
  t.out = upload(std::vector<bf16_t>(static_cast<size_t>(p.N * p.HV * p.V), bf16_t{0}), dev);
  t.conv_window = upload(p.conv_window, dev);
  t.qkv_act = upload(std::vector<bf16_t>(static_cast<size_t>(p.N * p.D), bf16_t{0}), dev);
  if (p.mode == RecordMode::kRing) {
    t.rawv = upload(p.ring_rawv, dev);
    t.rawk = upload(p.ring_rawk, dev);
    t.g = upload(p.ring_g, dev);
    t.beta = upload(p.ring_beta, dev);
  } else {
    t.snapshots = upload(p.snapshots, dev);
  }
  if (p.accepted) {
    t.accepted = upload(*p.accepted, dev);
    t.error_flag = upload(std::vector<int32_t>{0}, dev);
    t.checked_accepted = upload(std::vector<int32_t>(static_cast<size_t>(p.B), 0), dev);
  }
  if (p.query_start_loc) {
    t.query_start_loc = upload(*p.query_start_loc, dev);
  }
  if (p.parents) {
    t.parents = upload(*p.parents, dev);
  }
  if (p.accepted_paths) {
    t.accepted_paths = upload(*p.accepted_paths, dev);
  }
  return t;
}

// The verify call over `t` (contract §2 layouts, packed: every pitch is the packed extent).
VerifyParams make_verify_params(const ReplayProblem& p, const DeviceTensors& t) {
  const int64_t D = p.D, HV = p.HV, H = p.H, K = p.K, V = p.V;
  VerifyParams v;
  v.B = p.B;
  v.T = p.T;
  v.H = p.H;
  v.HV = p.HV;
  v.K = p.K;
  v.V = p.V;
  v.T_max = p.T_max;
  v.L = p.L;
  v.num_slots = p.S;
  v.num_rows = p.R;
  v.gate = p.manifest.lower_bound ? GateKind::kSafe : GateKind::kStandard;
  v.lower_bound = p.manifest.lower_bound.value_or(0.0f);
  v.mode = p.mode;
  v.mixed_qkv = static_cast<const bf16_t*>(t.mixed_qkv.data());
  v.mixed_qkv_stride = D;
  v.a = static_cast<const bf16_t*>(t.a.data());
  v.a_stride = HV * K;
  v.b = static_cast<const bf16_t*>(t.b.data());
  v.b_stride = HV;
  v.A_log = static_cast<const float*>(t.A_log.data());
  v.dt_bias = static_cast<const float*>(t.dt_bias.data());
  v.conv_weight = t.conv_weight.data();
  v.conv_bias = p.has_bias ? t.conv_bias.data() : nullptr;
  v.conv_weight_type = p.wtype;
  v.conv_state = static_cast<const bf16_t*>(t.conv_state.data());
  v.conv_state_slot_stride = kW1 * D;
  v.ssm_state = static_cast<const float*>(t.ssm_state.data());
  v.ssm_slot_stride = p.state_elems();
  v.slots = static_cast<const int32_t*>(t.slots.data());
  v.rows = static_cast<const int32_t*>(t.rows.data());
  v.out = static_cast<bf16_t*>(t.out.data());
  v.conv_window = static_cast<bf16_t*>(t.conv_window.data());
  v.conv_window_row_stride = int64_t{p.T_max} * kW1 * D;
  if (p.mode == RecordMode::kRing) {
    v.ring_rawv = static_cast<bf16_t*>(t.rawv.data());
    v.ring_rawv_slot_stride = HV * p.L * V;
    v.ring_rawk = static_cast<bf16_t*>(t.rawk.data());
    v.ring_rawk_slot_stride = H * p.L * K;
    v.ring_g = static_cast<float*>(t.g.data());
    v.ring_g_slot_stride = HV * p.L * K;
    v.ring_beta = static_cast<float*>(t.beta.data());
    v.ring_beta_slot_stride = HV * p.L;
  } else {
    v.snapshots = static_cast<float*>(t.snapshots.data());
    v.snapshot_row_stride = int64_t{p.T_max} * p.state_elems();
  }
  v.qkv_act = static_cast<bf16_t*>(t.qkv_act.data());
  v.token_offsets = static_cast<const int32_t*>(t.query_start_loc.data());  // null: dense
  v.parents = static_cast<const int32_t*>(t.parents.data());                // null: a chain
  return v;
}

// The dispatcher's view of the same call (views over `t`, which must outlive it).
DispatchProblem make_dispatch_problem(const ReplayProblem& p, const DeviceTensors& t,
                                      const Device& dev) {
  const int64_t N = p.N, D = p.D, HV = p.HV, H = p.H, K = p.K, V = p.V;
  const DType wdtype = p.wtype == ConvWeightType::kF32 ? DType::kF32 : DType::kBF16;
  DispatchProblem dp;
  dp.B = p.B;
  dp.T = p.T;
  dp.H = p.H;
  dp.HV = p.HV;
  dp.K = p.K;
  dp.V = p.V;
  dp.mode = p.mode;
  dp.plain_chain = !p.parents;  // trees take the unfused path
  dp.tokens = N;
  dp.mixed_qkv = TensorView::contiguous(t.mixed_qkv.data(), DType::kBF16, dev, {N, D});
  dp.a = TensorView::contiguous(t.a.data(), DType::kBF16, dev, {N, HV * K});
  dp.b = TensorView::contiguous(t.b.data(), DType::kBF16, dev, {N, HV});
  dp.conv_weight = TensorView::contiguous(t.conv_weight.data(), wdtype, dev, {D, kConvWidth});
  if (p.has_bias) {
    dp.conv_bias = TensorView::contiguous(t.conv_bias.data(), wdtype, dev, {D});
  }
  dp.slots = TensorView::contiguous(t.slots.data(), DType::kI32, dev, {p.B});
  dp.rows = TensorView::contiguous(t.rows.data(), DType::kI32, dev, {p.B});
  if (p.mode == RecordMode::kRing) {
    const int64_t Sr = p.ring_slots, L = p.L;
    dp.rings.rawv = TensorView::contiguous(t.rawv.data(), DType::kBF16, dev, {Sr, HV, L, V});
    dp.rings.rawk = TensorView::contiguous(t.rawk.data(), DType::kBF16, dev, {Sr, H, L, K});
    dp.rings.g = TensorView::contiguous(t.g.data(), DType::kF32, dev, {Sr, HV, L, K});
    dp.rings.beta = TensorView::contiguous(t.beta.data(), DType::kF32, dev, {Sr, HV, L});
  }
  dp.num_slots = p.S;
  return dp;
}

// Sets r.decision (the dispatcher's choice, also when a path is forced) and the path and tile
// that will run: the decision's for --path auto, else the forced path's.
void choose_path(const DispatchProblem& dp, const RunOptions& options, RunResult& r) {
  DispatchFlags flags;
  flags.fused_ring_max_batch = options.fused_ring_max_batch;
  flags.block_v = options.block_v;
  // A replay runs the capture's verify with exact outputs (its params' numerics), so the decision
  // it reports, and the tile it takes from it, are the exact path's.
  flags.numerics = NumericsRequest::kExact;
  r.decision = choose_verify_path(dp, r.platform, flags);
  switch (options.path) {
    case PathChoice::kAuto:
      r.path = r.decision.path;
      r.block_v = r.decision.block_v;
      break;
    case PathChoice::kFused:
      r.path = VerifyPath::kFused;
      r.block_v = forced_fused_block_v(dp, flags);
      break;
    case PathChoice::kUnfused:
      r.path = VerifyPath::kUnfused;
      r.block_v = 0;
      break;
  }
}

// Verify `repeat` times on r.path (idempotent: it never writes the committed state, so repeats
// are safe); times the first call and the mean.
void run_verify(KernelSet& kernels, const VerifyParams& v, const Device& dev, int repeat,
                RunResult& r) {
  double total_ms = 0.0;
  for (int i = 0; i < repeat; ++i) {
    const auto start = Clock::now();
    if (r.path == VerifyPath::kFused) {
      kernels.verify_fused(v, r.block_v, nullptr);
    } else {
      kernels.verify_unfused(v, nullptr);
    }
    sync(dev);
    const double ms = ms_since(start);
    if (i == 0) {
      r.timings.verify_first_ms = ms;
    }
    total_ms += ms;
  }
  r.timings.verify_calls = repeat;
  r.timings.verify_mean_ms = total_ms / repeat;
}

// The commit of one layer over the buffers `v` verified into (the capture has accepted lengths).
CommitParams make_commit_params(const VerifyParams& v, const DeviceTensors& t) {
  CommitParams c = one_layer_commit_params(v);
  c.accepted = static_cast<const int32_t*>(t.accepted.data());
  c.ssm_state = static_cast<float*>(t.ssm_state.data());
  c.conv_state = static_cast<bf16_t*>(t.conv_state.data());
  c.error_flag = static_cast<int32_t*>(t.error_flag.data());
  c.accepted_paths = static_cast<const int32_t*>(t.accepted_paths.data());
  if (v.token_offsets != nullptr || v.parents != nullptr) {
    c.checked_accepted = static_cast<int32_t*>(t.checked_accepted.data());
  }
  return c;
}

// Host copies into r.outputs, conv tensors back in the manifest's layouts; the committed state
// and the error flag only if r.committed.
void download_outputs(const ReplayProblem& p, const DeviceTensors& t, RunResult& r) {
  const int64_t N = p.N, D = p.D, HV = p.HV, H = p.H, K = p.K, V = p.V;
  const int64_t R = p.R, Ta = p.T_max, S = p.S;
  const bool window_sdw = p.manifest.conv_window_layout == ConvLayout::kSDW;
  const bool state_sdw = p.manifest.conv_state_layout == ConvLayout::kSDW;
  r.outputs.push_back(make_output("output", {N, HV, V}, download<bf16_t>(t.out, N * HV * V)));
  std::vector<bf16_t> window = download<bf16_t>(t.conv_window, R * Ta * kW1 * D);
  r.outputs.push_back(window_sdw ? make_output("conv_window", {R, Ta, D, kW1},
                                               transpose_last2(window, R * Ta, kW1, D))
                                 : make_output("conv_window", {R, Ta, kW1, D}, window));
  if (p.mode == RecordMode::kRing) {
    const int64_t Sr = p.ring_slots, L = p.L;
    r.outputs.push_back(
        make_output("ring_rawv", {Sr, HV, L, V}, download<bf16_t>(t.rawv, Sr * HV * L * V)));
    r.outputs.push_back(
        make_output("ring_rawk", {Sr, H, L, K}, download<bf16_t>(t.rawk, Sr * H * L * K)));
    r.outputs.push_back(
        make_output("ring_g", {Sr, HV, L, K}, download<float>(t.g, Sr * HV * L * K)));
    r.outputs.push_back(
        make_output("ring_beta", {Sr, HV, L}, download<float>(t.beta, Sr * HV * L)));
  } else {
    r.outputs.push_back(make_output("snapshots", {R, Ta, HV, V, K},
                                    download<float>(t.snapshots, R * Ta * p.state_elems())));
  }
  if (r.committed) {
    r.outputs.push_back(
        make_output("ssm_state", {S, HV, V, K}, download<float>(t.ssm_state, S * p.state_elems())));
    std::vector<bf16_t> conv = download<bf16_t>(t.conv_state, S * kW1 * D);
    r.outputs.push_back(
        state_sdw ? make_output("conv_state", {S, D, kW1}, transpose_last2(conv, S, kW1, D))
                  : make_output("conv_state", {S, kW1, D}, conv));
    r.commit_error_flag = download<int32_t>(t.error_flag, 1)[0];
  }
}

}  // namespace

RunResult run_replay(const ReplayProblem& p, const RunOptions& options) {
  KDA_CHECK(options.repeat >= 1, "replay: --repeat {} must be >= 1", options.repeat);
  const Device dev = options.device;
  std::unique_ptr<KernelSet> kernels = make_kernel_set(dev);
  RunResult r;
  r.device = device_name(dev);
  r.kernel_set = kernels->name();
  r.mode = p.mode;
  r.requested = options.path;
  r.platform =
      options.platform ? *options.platform : detect_platform(dev.is_cuda() ? dev.index : -1);

  auto start = Clock::now();
  const DeviceTensors t = upload_problem(p, dev);
  sync(dev);
  r.timings.upload_ms = ms_since(start);

  const VerifyParams v = make_verify_params(p, t);
  choose_path(make_dispatch_problem(p, t, dev), options, r);
  run_verify(*kernels, v, dev, options.repeat, r);

  if (p.accepted) {  // commit (one layer), if the capture has accepted lengths
    const CommitParams c = make_commit_params(v, t);
    start = Clock::now();
    kernels->commit(c, nullptr);
    sync(dev);
    r.timings.commit_ms = ms_since(start);
    r.committed = true;
  }

  start = Clock::now();
  download_outputs(p, t, r);
  r.timings.download_ms = ms_since(start);
  return r;
}

std::string write_outputs(const ReplayProblem& p, const RunResult& r, const std::string& out_dir,
                          npy::Bf16Descr bf16, double load_ms) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  KDA_CHECK_CODE(!ec, ErrorCode::kIo, "replay: cannot create output directory {}: {}", out_dir,
                 ec.message());
  const auto start = Clock::now();
  Json outputs = Json::object();
  for (const OutputTensor& o : r.outputs) {
    const std::string file = o.name + ".npy";
    npy::write_npy(out_dir + "/" + file, o.type, o.shape, o.bytes.data(), bf16);
    outputs[o.name] = {
        {"file", file}, {"dtype", npy::npy_type_name(o.type)}, {"shape", shape_json(o.shape)}};
  }
  const double write_ms = ms_since(start);

  const Manifest& m = p.manifest;
  Json j;
  j["tool"] = "kda_replay";
  j["input_dir"] = p.dir;
  if (!m.comment.empty()) {
    j["comment"] = m.comment;
  }
  j["device"] = r.device;
  j["kernel_set"] = r.kernel_set;
  j["platform"] = r.platform.describe();
  j["platform_family"] = arch_family_name(r.platform.family());
  j["mode"] = record_mode_name(r.mode);
  j["path_requested"] = path_choice_name(r.requested);
  j["path"] = verify_path_name(r.path);
  j["block_v"] = r.block_v;
  j["dispatch"] = {{"path", verify_path_name(r.decision.path)},
                   {"reason", dispatch_reason_name(r.decision.reason)},
                   {"block_v", r.decision.block_v},
                   {"describe", r.decision.describe()}};
  Json pads = Json::array();
  for (int n : p.padding_requests()) {
    pads.push_back(n);
  }
  j["shapes"] = {{"B", p.B},
                 {"T", p.T},
                 {"H", p.H},
                 {"HV", p.HV},
                 {"K", p.K},
                 {"V", p.V},
                 {"D", p.D},
                 {"N", p.N},
                 {"S", p.S},
                 {"R", p.R},
                 {"T_max", p.T_max},
                 {"L", p.L},
                 {"ring_slots", p.ring_slots},
                 {"gate", m.lower_bound ? "safe" : "standard"},
                 {"lower_bound", m.lower_bound ? Json(*m.lower_bound) : Json(nullptr)},
                 {"conv_weight_dtype", p.wtype == ConvWeightType::kF32 ? "f32" : "bf16"},
                 {"conv_bias", p.has_bias},
                 {"conv_state_layout", conv_layout_name(m.conv_state_layout)},
                 {"conv_window_layout", conv_layout_name(m.conv_window_layout)},
                 {"padding_requests", pads}};
  Json commit = {{"ran", r.committed}};
  if (r.committed) {
    commit["accepted"] = *p.accepted;
    commit["error_flag"] = r.commit_error_flag;
  }
  j["commit"] = commit;
  j["verify_calls"] = r.timings.verify_calls;
  j["timings_ms"] = {{"load", load_ms},
                     {"upload", r.timings.upload_ms},
                     {"verify_first", r.timings.verify_first_ms},
                     {"verify_mean", r.timings.verify_mean_ms},
                     {"commit", r.timings.commit_ms},
                     {"download", r.timings.download_ms},
                     {"write", write_ms}};
  j["outputs"] = outputs;
  const std::string text = j.dump(2) + "\n";
  const std::string path = out_dir + "/summary.json";
  std::ofstream f(path);
  f << text;
  f.close();
  KDA_CHECK_CODE(static_cast<bool>(f), ErrorCode::kIo, "replay: cannot write {}", path);
  return text;
}

}  // namespace kda::replay
