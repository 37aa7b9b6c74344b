#include "tools/bench/bench_problem.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "tools/bench/bench_device.h"

namespace kda::bench {

namespace {

constexpr int64_t kCopyAlignBytes = 256;

Pool spec(std::string name, DType dtype, std::vector<int64_t> shape, int copies) {
  Pool p;
  p.name = std::move(name);
  p.dtype = dtype;
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t e : p.shape) {
    p.numel *= e;
  }
  const int64_t align = kCopyAlignBytes / dtype_size(dtype);
  p.pitch = (p.numel + align - 1) / align * align;
  p.copies = copies;
  return p;
}

int64_t alloc_bytes(const Pool& p) { return p.pitch * dtype_size(p.dtype) * p.copies; }

/// track_slots [B] | track_steps [B] int32, with track slots only.
int64_t track_index_bytes(const ProblemConfig& c) {
  return c.track_slots > 0 ? 2 * int64_t{c.B} * 4 : 0;
}

// Input tensor ids for the seeds (a copy's tensor seed = f(seed, id, copy)).
enum TensorId : uint64_t { kQkv = 1, kA, kB, kALog, kDtBias, kConvW, kConvB, kConvState, kSsm };

uint64_t tensor_seed(uint64_t seed, uint64_t id, int copy) {
  return mix_seed(mix_seed(seed * 0x100000001b3ull + id) + static_cast<uint64_t>(copy));
}

}  // namespace

void* Pool::at(int copy) const {
  KDA_CHECK(defined(), "bench pool {}: not allocated", name);
  KDA_CHECK(copy >= 0 && copy < copies, "bench pool {}: copy {} outside [0, {})", name, copy,
            copies);
  return static_cast<char*>(buf.data()) + copy * pitch * dtype_size(dtype);
}

std::vector<const Pool*> OutputSet::written(RecordMode mode) const {
  if (mode == RecordMode::kRing) {
    return {&out, &conv_window, &rawv, &rawk, &g, &beta};
  }
  return {&out, &conv_window, &snapshots};
}

Problem::Pools Problem::plan(const ProblemConfig& c) {
  const Shape& s = c.shape;
  const int64_t B = c.B, S = int64_t{c.B} + c.track_slots, N = int64_t{c.B} * c.T_max, D = s.D(),
                HV = s.HV, H = s.H, K = s.K, V = s.V, L = c.L, Ta = c.T_max;
  const DType wt = s.conv_weight_type == ConvWeightType::kF32 ? DType::kF32 : DType::kBF16;
  const int n = c.copies;
  Pools p;
  const int inputs = c.inputs ? n : 0;
  p.mixed_qkv = spec("mixed_qkv", DType::kBF16, {N, D}, inputs);
  p.a = spec("a", DType::kBF16, {N, HV * K}, inputs);
  p.b = spec("b", DType::kBF16, {N, HV}, inputs);
  p.A_log = spec("A_log", DType::kF32, {HV}, n);
  p.dt_bias = spec("dt_bias", DType::kF32, {HV * K}, n);
  p.conv_weight = spec("conv_weight", wt, {D, kConvWidth}, n);
  p.conv_bias = spec("conv_bias", wt, {D}, s.conv_bias ? n : 0);
  p.conv_state = spec("conv_state", DType::kBF16, {S, kConvHistory, D}, n);
  p.ssm_state = spec("ssm_state", DType::kF32, {S, HV, V, K}, n);
  p.qkv_act = spec("qkv_act", DType::kBF16, {N, D}, 1);
  for (int set = 0; set < 2; ++set) {
    const int m = set == 0 ? n : (c.guard_set ? 1 : 0);
    OutputSet& o = p.sets[set];
    o.out = spec("out", DType::kBF16, {N, HV, V}, m);
    o.conv_window = spec("conv_window", DType::kBF16, {B, Ta, kConvHistory, D}, m);
    o.snapshots = spec("snapshots", DType::kF32, {B, Ta, HV, V, K}, c.snapshot ? m : 0);
    o.rawv = spec("ring_rawv", DType::kBF16, {S, HV, L, V}, c.ring ? m : 0);
    o.rawk = spec("ring_rawk", DType::kBF16, {S, H, L, K}, c.ring ? m : 0);
    o.g = spec("ring_g", DType::kF32, {S, HV, L, K}, c.ring ? m : 0);
    o.beta = spec("ring_beta", DType::kF32, {S, HV, L}, c.ring ? m : 0);
  }
  return p;
}

int64_t Problem::device_bytes(const ProblemConfig& config) {
  Pools p = plan(config);
  int64_t total = (3 * int64_t{config.B} + 1) * 4 + track_index_bytes(config);
  p.each([&](const Pool& pool) { total += alloc_bytes(pool); });
  return total;
}

Problem::Problem(const ProblemConfig& config, cudaStream_t stream)
    : config_(config), pools_(plan(config)) {
  const Shape& s = config.shape;
  KDA_CHECK(config.B >= 1 && config.T_max >= 1 && config.copies >= 1,
            "Problem: B={} T_max={} copies={} must be >= 1", config.B, config.T_max, config.copies);
  KDA_CHECK(config.track_slots >= 0, "Problem: track_slots={} must be >= 0", config.track_slots);
  const Device dev = Device::cuda(config.device);
  pools_.each([&](Pool& p) {
    if (p.copies > 0 && p.numel > 0) {
      p.buf = Buffer(dev, alloc_bytes(p));
    }
  });
  indices_ = Buffer(dev, (3 * int64_t{config.B} + 1) * 4);

  // Inputs: randn in the stated dtypes, scaled as contract §6.
  const auto randn = [&](const Pool& p, TensorId id, float scale) {
    for (int c = 0; c < p.copies; ++c) {
      const uint64_t seed = tensor_seed(config.seed, id, c);
      if (p.dtype == DType::kBF16) {
        fill_randn_bf16(p.as<bf16_t>(c), p.numel, scale, seed, stream);
      } else {
        fill_randn_f32(p.as<float>(c), p.numel, scale, seed, stream);
      }
    }
  };
  if (config.inputs) {
    randn(pools_.mixed_qkv, kQkv, 0.5f);
    randn(pools_.a, kA, 0.5f);
    randn(pools_.b, kB, 1.0f);
  }
  randn(pools_.A_log, kALog, 0.5f);
  randn(pools_.dt_bias, kDtBias, 0.5f);
  randn(pools_.conv_weight, kConvW, 0.3f);
  if (s.conv_bias) {
    randn(pools_.conv_bias, kConvB, 0.1f);
  }
  randn(pools_.conv_state, kConvState, 0.5f);
  randn(pools_.ssm_state, kSsm, 0.2f);

  // Outputs and scratch start as zeros (as upstream's bench); the guard prefills garbage.
  for (const OutputSet& o : pools_.sets) {
    for (const Pool* p : {&o.out, &o.conv_window, &o.snapshots, &o.rawv, &o.rawk, &o.g, &o.beta}) {
      if (p->defined()) {
        KDA_CUDA_CHECK(
            cudaMemsetAsync(p->buf.data(), 0, static_cast<size_t>(p->buf.bytes()), stream));
      }
    }
  }
  KDA_CUDA_CHECK(cudaMemsetAsync(pools_.qkv_act.buf.data(), 0,
                                 static_cast<size_t>(pools_.qkv_act.buf.bytes()), stream));

  int32_t* idx = static_cast<int32_t*>(indices_.data());
  fill_arange_i32(idx, config.B, stream);             // slots = arange(B)
  fill_arange_i32(idx + config.B, config.B, stream);  // rows = arange(B)
  fill_i32(idx + 2 * config.B, config.B, 1, stream);  // accepted (set per commit)
  fill_i32(idx + 3 * config.B, 1, 0, stream);         // error flag
  std::vector<int32_t> track_slots;  // pageable: copied before the synchronise below
  if (config.track_slots > 0) {
    tracks_ = Buffer(dev, track_index_bytes(config));
    int32_t* t = static_cast<int32_t*>(tracks_.data());
    track_slots.resize(static_cast<size_t>(config.B));
    for (int n = 0; n < config.B; ++n) {
      track_slots[static_cast<size_t>(n)] = config.B + n;  // slots past the batch, distinct
    }
    KDA_CUDA_CHECK(cudaMemcpyAsync(t, track_slots.data(), track_slots.size() * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream));
    fill_i32(t + config.B, config.B, -1, stream);  // track_steps: none until set_tracks()
  }
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

const OutputSet& Problem::outputs(int set) const {
  KDA_CHECK(set == 0 || (set == 1 && config_.guard_set), "Problem: output set {} not allocated",
            set);
  return pools_.sets[set];
}

VerifyParams Problem::verify_params(int copy, int T, RecordMode mode, int set) const {
  const ProblemConfig& c = config_;
  const Shape& s = c.shape;
  const OutputSet& o = outputs(set);
  KDA_CHECK(T >= 1 && T <= c.T_max, "Problem: T={} outside [1, T_max={}]", T, c.T_max);
  const int32_t* idx = static_cast<const int32_t*>(indices_.data());
  const int64_t D = s.D();

  VerifyParams p;
  p.B = c.B;
  p.T = T;
  p.H = s.H;
  p.HV = s.HV;
  p.K = s.K;
  p.V = s.V;
  p.T_max = c.T_max;
  p.L = c.L;
  p.num_slots = num_slots();
  p.num_rows = c.B;
  p.gate = s.gate;
  p.lower_bound = s.lower_bound;
  p.mode = mode;

  if (c.inputs) {
    p.mixed_qkv = pools_.mixed_qkv.as<const bf16_t>(copy);
    p.mixed_qkv_stride = D;
    p.a = pools_.a.as<const bf16_t>(copy);
    p.a_stride = int64_t{s.HV} * s.K;
    p.b = pools_.b.as<const bf16_t>(copy);
    p.b_stride = s.HV;
  }
  p.A_log = pools_.A_log.as<const float>(copy);
  p.dt_bias = pools_.dt_bias.as<const float>(copy);
  p.conv_weight = pools_.conv_weight.at(copy);
  p.conv_bias = s.conv_bias ? pools_.conv_bias.at(copy) : nullptr;
  p.conv_weight_type = s.conv_weight_type;
  p.conv_state = pools_.conv_state.as<const bf16_t>(copy);
  p.conv_state_slot_stride = kConvHistory * D;
  p.ssm_state = pools_.ssm_state.as<const float>(copy);
  p.ssm_slot_stride = int64_t{s.HV} * s.V * s.K;
  p.slots = idx;
  p.rows = idx + c.B;

  p.out = o.out.as<bf16_t>(copy);
  p.conv_window = o.conv_window.as<bf16_t>(copy);
  p.conv_window_row_stride = int64_t{c.T_max} * kConvHistory * D;
  if (mode == RecordMode::kSnapshot) {
    p.snapshots = o.snapshots.as<float>(copy);
    p.snapshot_row_stride = int64_t{c.T_max} * s.HV * s.V * s.K;
  } else {
    p.ring_rawv = o.rawv.as<bf16_t>(copy);
    p.ring_rawv_slot_stride = int64_t{s.HV} * c.L * s.V;
    p.ring_rawk = o.rawk.as<bf16_t>(copy);
    p.ring_rawk_slot_stride = int64_t{s.H} * c.L * s.K;
    p.ring_g = o.g.as<float>(copy);
    p.ring_g_slot_stride = int64_t{s.HV} * c.L * s.K;
    p.ring_beta = o.beta.as<float>(copy);
    p.ring_beta_slot_stride = int64_t{s.HV} * c.L;
  }
  p.qkv_act = pools_.qkv_act.as<bf16_t>(0);
  return p;
}

CommitParams Problem::commit_params(int T, RecordMode mode, int layers) const {
  const ProblemConfig& c = config_;
  const Shape& s = c.shape;
  KDA_CHECK(layers >= 1 && layers <= c.copies, "Problem: {} layers, {} copies allocated", layers,
            c.copies);
  KDA_CHECK(T >= 1 && T <= c.T_max, "Problem: T={} outside [1, T_max={}]", T, c.T_max);
  const OutputSet& o = outputs(0);
  const int32_t* idx = static_cast<const int32_t*>(indices_.data());
  const VerifyParams v = verify_params(0, T, mode, 0);  // the per-layer (slot/row) strides

  CommitParams p;
  p.num_layers = layers;
  p.B = c.B;
  p.T = T;
  p.T_max = c.T_max;
  p.H = s.H;
  p.HV = s.HV;
  p.K = s.K;
  p.V = s.V;
  p.L = c.L;
  p.num_slots = num_slots();
  p.num_rows = c.B;
  p.mode = mode;
  p.slots = idx;
  p.rows = idx + c.B;
  p.accepted = idx + 2 * c.B;
  p.ssm_state = pools_.ssm_state.as<float>(0);
  p.ssm_layer_stride = pools_.ssm_state.pitch;
  p.ssm_slot_stride = v.ssm_slot_stride;
  p.conv_state = pools_.conv_state.as<bf16_t>(0);
  p.conv_state_layer_stride = pools_.conv_state.pitch;
  p.conv_state_slot_stride = v.conv_state_slot_stride;
  p.conv_window = o.conv_window.as<bf16_t>(0);
  p.conv_window_layer_stride = o.conv_window.pitch;
  p.conv_window_row_stride = v.conv_window_row_stride;
  if (mode == RecordMode::kSnapshot) {
    p.snapshots = o.snapshots.as<const float>(0);
    p.snapshot_layer_stride = o.snapshots.pitch;
    p.snapshot_row_stride = v.snapshot_row_stride;
  } else {
    p.ring_rawv = o.rawv.as<bf16_t>(0);
    p.ring_rawv_layer_stride = o.rawv.pitch;
    p.ring_rawv_slot_stride = v.ring_rawv_slot_stride;
    p.ring_rawk = o.rawk.as<bf16_t>(0);
    p.ring_rawk_layer_stride = o.rawk.pitch;
    p.ring_rawk_slot_stride = v.ring_rawk_slot_stride;
    p.ring_g = o.g.as<float>(0);
    p.ring_g_layer_stride = o.g.pitch;
    p.ring_g_slot_stride = v.ring_g_slot_stride;
    p.ring_beta = o.beta.as<float>(0);
    p.ring_beta_layer_stride = o.beta.pitch;
    p.ring_beta_slot_stride = v.ring_beta_slot_stride;
  }
  p.error_flag = const_cast<int32_t*>(idx + 3 * c.B);
  return p;
}

CommitParams Problem::tracked_commit_params(int T, RecordMode mode, int layers) const {
  KDA_CHECK(config_.track_slots > 0, "Problem: tracked commit without track slots");
  CommitParams p = commit_params(T, mode, layers);
  const int32_t* t = static_cast<const int32_t*>(tracks_.data());
  p.track_slots = t;
  p.track_steps = t + config_.B;
  return p;
}

void Problem::set_tracks(int k, cudaStream_t stream) const {
  KDA_CHECK(config_.track_slots > 0, "Problem: set_tracks without track slots");
  int32_t* steps = static_cast<int32_t*>(tracks_.data()) + config_.B;
  const int tracked = std::min(config_.B, config_.track_slots);
  fill_i32(steps, tracked, k, stream);
  if (tracked < config_.B) {
    fill_i32(steps + tracked, config_.B - tracked, -1, stream);
  }
}

void Problem::set_accepted(int n, cudaStream_t stream) const {
  int32_t* idx = static_cast<int32_t*>(indices_.data());
  fill_i32(idx + 2 * config_.B, config_.B, n, stream);
}

void Problem::set_accepted(const std::vector<int>& lengths, cudaStream_t stream) const {
  KDA_CHECK(static_cast<int64_t>(lengths.size()) == config_.B,
            "Problem::set_accepted: {} lengths for B={}", lengths.size(), config_.B);
  const std::vector<int32_t> host(lengths.begin(), lengths.end());
  int32_t* idx = static_cast<int32_t*>(indices_.data());
  KDA_CUDA_CHECK(cudaMemcpyAsync(idx + 2 * config_.B, host.data(), host.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream));
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` is pageable and local
}

int32_t Problem::read_and_clear_error_flag(cudaStream_t stream) const {
  int32_t* flag = static_cast<int32_t*>(indices_.data()) + 3 * config_.B;
  int32_t host = 0;
  KDA_CUDA_CHECK(cudaMemcpyAsync(&host, flag, sizeof(host), cudaMemcpyDeviceToHost, stream));
  KDA_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int32_t), stream));
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

void Problem::prefill_outputs(int set, uint64_t seed, cudaStream_t stream) const {
  const OutputSet& o = outputs(set);
  uint64_t id = 0;
  for (const Pool* p : {&o.out, &o.conv_window, &o.snapshots, &o.rawv, &o.rawk, &o.g, &o.beta}) {
    ++id;
    if (p->defined()) {
      // Same seed per tensor in both sets: identical garbage; copy 0 only.
      fill_bits(p->at(0), p->bytes(), mix_seed(seed + id), stream);
    }
  }
}

}  // namespace kda::bench
