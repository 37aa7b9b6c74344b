// ops.cc: kda::ops (ops.h): argument validation, the shapes read off the tensors, and the one
// place the commit-family params and the verify dispatch are built (shared with the backend).
#include "backend/ops.h"

#include <fmt/format.h>

#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"

namespace kda::ops {

namespace detail {

const char* commit_reason(CommitKind kind, RecordMode mode) {
  switch (kind) {
    case CommitKind::kEager:
      return mode == RecordMode::kRing ? "ring_fold" : "snapshot_copy";
    case CommitKind::kDeferred:
      return "deferred_record";
    case CommitKind::kMaterialize:
      return "materialize";
    case CommitKind::kDropPending:
      return "drop_pending";
    case CommitKind::kLazy:
      return "lazy_record";
  }
  return "?";
}

CommitParams commit_params(const Dims& dims, const StateTensors& state, const CommitCall& call) {
  CommitParams c;
  c.kind = call.kind;
  c.num_layers = dims.layers;
  c.B = call.B;
  c.T = call.T;
  c.T_max = dims.T_max;
  c.H = dims.H;
  c.HV = dims.HV;
  c.K = dims.K;
  c.V = dims.V;
  c.L = dims.L;
  c.num_slots = dims.S;
  c.num_rows = dims.R;
  c.mode = dims.mode;
  c.slots = call.slots;
  c.rows = call.rows;
  c.accepted = call.accepted;
  c.slot_allocated = call.slot_allocated;

  const TensorView& ssm = state.ssm_state;
  const TensorView& conv = state.conv_state;
  const TensorView& window = state.conv_window;
  c.ssm_state = static_cast<float*>(ssm.data());
  c.ssm_layer_stride = ssm.stride(0);
  c.ssm_slot_stride = ssm.stride(1);
  c.conv_state = static_cast<bf16_t*>(conv.data());
  c.conv_state_layer_stride = conv.stride(0);
  c.conv_state_slot_stride = conv.stride(1);
  c.conv_window = static_cast<bf16_t*>(window.data());
  c.conv_window_layer_stride = window.stride(0);
  c.conv_window_row_stride = window.stride(1);
  if (dims.mode == RecordMode::kRing) {
    const TensorView& rawv = state.ring_rawv;
    const TensorView& rawk = state.ring_rawk;
    const TensorView& g = state.ring_g;
    const TensorView& beta = state.ring_beta;
    c.ring_rawv = static_cast<bf16_t*>(rawv.data());
    c.ring_rawv_layer_stride = rawv.stride(0);
    c.ring_rawv_slot_stride = rawv.stride(1);
    c.ring_rawk = static_cast<bf16_t*>(rawk.data());
    c.ring_rawk_layer_stride = rawk.stride(0);
    c.ring_rawk_slot_stride = rawk.stride(1);
    c.ring_g = static_cast<float*>(g.data());
    c.ring_g_layer_stride = g.stride(0);
    c.ring_g_slot_stride = g.stride(1);
    c.ring_beta = static_cast<float*>(beta.data());
    c.ring_beta_layer_stride = beta.stride(0);
    c.ring_beta_slot_stride = beta.stride(1);
  } else {
    const TensorView& snapshots = state.snapshots;
    c.snapshots = static_cast<const float*>(snapshots.data());
    c.snapshot_layer_stride = snapshots.stride(0);
    c.snapshot_row_stride = snapshots.stride(1);
  }
  if (call.kind != CommitKind::kEager) {
    const TensorView& pending = state.ring_pending;
    c.ring_cursor = static_cast<int32_t*>(state.ring_cursor.data());
    c.ring_pending = static_cast<int32_t*>(pending.data());
    c.ring_pending_layer_stride = pending.stride(0);
    const TensorView& u = state.ring_u;
    c.ring_u = static_cast<const float*>(u.data());
    c.ring_u_layer_stride = u.defined() ? u.stride(0) : 0;
    c.ring_u_slot_stride = u.defined() ? u.stride(1) : 0;
    c.u_free = dims.u_records ? 0 : 1;
    if (dims.lazy) {
      c.ring_u = nullptr;  // the lazy write-back's folds compute u (it keeps no u records)
      c.ring_u_layer_stride = 0;
      c.ring_u_slot_stride = 0;
    }
  }
  c.error_flag = call.error_flag;
  c.checked_accepted = call.checked_accepted;
  c.token_offsets = call.token_offsets;
  c.parents = call.parents;
  c.accepted_paths = call.accepted_paths;
  c.track_slots = call.track_slots;
  c.track_steps = call.track_steps;
  return c;
}

VerifyParams verify_params(const Dims& dims, const StateTensors& state, const VerifyCall& call) {
  const auto pitch = [](const TensorView& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); };
  VerifyParams p;
  p.B = call.B;
  p.T = call.T;
  p.H = dims.H;
  p.HV = dims.HV;
  p.K = dims.K;
  p.V = dims.V;
  p.T_max = dims.T_max;
  p.L = dims.L;
  p.num_slots = dims.S;
  p.num_rows = dims.R;
  p.gate = call.gate;
  p.lower_bound = call.lower_bound;
  p.mode = dims.mode;
  p.mixed_qkv = static_cast<const bf16_t*>(call.mixed_qkv.data());
  p.mixed_qkv_stride = pitch(call.mixed_qkv);
  p.a = static_cast<const bf16_t*>(call.a.data());
  p.a_stride = pitch(call.a);
  p.b = static_cast<const bf16_t*>(call.b.data());
  p.b_stride = pitch(call.b);
  const LayerWeights& w = *call.weights;
  p.A_log = static_cast<const float*>(w.A_log.data());
  p.dt_bias = static_cast<const float*>(w.dt_bias.data());
  p.conv_weight = w.conv_weight.data();
  p.conv_bias = w.conv_bias.defined() ? w.conv_bias.data() : nullptr;
  p.conv_weight_type = call.conv_weight_type;
  p.conv_state = static_cast<const bf16_t*>(state.conv_state.data());
  p.conv_state_slot_stride = state.conv_state.stride(0);
  p.ssm_state = static_cast<const float*>(state.ssm_state.data());
  p.ssm_slot_stride = state.ssm_state.stride(0);
  p.slots = call.slots;
  p.rows = call.rows;
  p.token_offsets = call.token_offsets;
  p.parents = call.parents;
  p.out = static_cast<bf16_t*>(call.out.data());
  p.conv_window = static_cast<bf16_t*>(state.conv_window.data());
  p.conv_window_row_stride = state.conv_window.stride(0);
  if (dims.mode == RecordMode::kRing) {
    p.ring_rawv = static_cast<bf16_t*>(state.ring_rawv.data());
    p.ring_rawv_slot_stride = state.ring_rawv.stride(0);
    p.ring_rawk = static_cast<bf16_t*>(state.ring_rawk.data());
    p.ring_rawk_slot_stride = state.ring_rawk.stride(0);
    p.ring_g = static_cast<float*>(state.ring_g.data());
    p.ring_g_slot_stride = state.ring_g.stride(0);
    p.ring_beta = static_cast<float*>(state.ring_beta.data());
    p.ring_beta_slot_stride = state.ring_beta.stride(0);
  } else {
    p.snapshots = static_cast<float*>(state.snapshots.data());
    p.snapshot_row_stride = state.snapshots.stride(0);
  }
  if (state.qkv_act.defined()) {
    p.qkv_act = static_cast<bf16_t*>(state.qkv_act.data());
  }
  if (dims.deferred) {
    p.ring_cursor = static_cast<const int32_t*>(state.ring_cursor.data());
    p.ring_pending = static_cast<const int32_t*>(state.ring_pending.data());
    p.u_free = dims.u_records ? 0 : 1;
    p.lazy = dims.lazy ? 1 : 0;
    if (!dims.lazy) {  // lazy: no fold destination, no u records (kda_params.h ring_pending)
      p.ssm_fold_out = static_cast<float*>(state.ssm_state.data());
      p.ring_u = static_cast<float*>(state.ring_u.data());
      p.ring_u_slot_stride = state.ring_u.stride(0);
      p.fold_before_wait = call.fold_before_wait;
    }
  }
  return p;
}

DispatchProblem dispatch_problem(const Dims& dims, int B, int T, bool plain_chain, int64_t tokens,
                                 const TensorView& mixed_qkv, const TensorView& a,
                                 const TensorView& b, const LayerWeights& weights,
                                 const TensorView& slots, const TensorView& rows,
                                 const RingViews& rings) {
  DispatchProblem d;
  d.B = B;
  d.T = T;
  d.H = dims.H;
  d.HV = dims.HV;
  d.K = dims.K;
  d.V = dims.V;
  d.conv_width = kConvWidth;
  d.mode = dims.mode;
  d.plain_chain = plain_chain;
  d.tokens = tokens;
  d.mixed_qkv = mixed_qkv;
  d.a = a;
  d.b = b;
  d.conv_weight = weights.conv_weight;
  d.conv_bias = weights.conv_bias;
  d.slots = slots;
  d.rows = rows;
  if (dims.mode == RecordMode::kRing) {
    d.rings = rings;
  }
  d.num_slots = dims.S;
  d.deferred = dims.deferred;
  d.u_records = dims.u_records;
  d.lazy = dims.lazy;
  return d;
}

DispatchDecision run_verify(KernelSet& kernels, const VerifyParams& params,
                            const DispatchProblem& problem, const Platform& platform,
                            const DispatchFlags& flags, cudaStream_t stream) {
  DispatchDecision decision = choose_verify_path(problem, platform, flags);
  // The decision's numerics are the call's: the plan takes VerifySchedule::kFastChunk from them.
  VerifyParams p = params;
  p.numerics = decision.numerics;
  // Plan once (the kernel, its schedule and grid), launch what the plan says.
  decision.plan = kernels.plan_verify(p, decision.path, decision.block_v);
  // The dispatcher's gates are the plan's (kernels::fast_outputs_plannable): a fast decision
  // that plans exact outputs, or the reverse, is a bug, never a silent fallback.
  KDA_CHECK_CODE(decision.plan.numerics == decision.numerics, ErrorCode::kInternal,
                 "verify: the dispatcher chose {} outputs ({}), the plan runs {} ({})",
                 verify_numerics_name(decision.numerics), decision.describe_numerics(),
                 verify_numerics_name(decision.plan.numerics), decision.plan.kernel());
  kernels.verify(p, decision.plan, stream);
  return decision;
}

}  // namespace detail

namespace {

using detail::Dims;

// "ops.verify: state" and the like.
std::string arg(const char* op, const char* name) { return fmt::format("ops.{}: {}", op, name); }

// A defined tensor of `ndim` dims (before its other checks: the shapes are read off it).
void expect_ndim(const TensorView& t, const std::string& name, int ndim, const char* shape) {
  KDA_CHECK(t.defined(), "{}: expected a tensor {}, got none", name, shape);
  KDA_CHECK(t.ndim() == ndim, "{}: expected {} dims {}, got {}", name, ndim, shape, t.shape_str());
}

// The shapes of `state` (file comment of ops.h); `stacked`: a [layers] dim leads.
Dims read_dims(const char* op, const StateTensors& state, bool stacked, bool lazy) {
  const int lead = stacked ? 1 : 0;
  Dims d;
  expect_ndim(state.ssm_state, arg(op, "state.ssm_state"), 4 + lead,
              stacked ? "[layers, S, HV, V, K]" : "[S, HV, V, K]");
  expect_ndim(state.conv_state, arg(op, "state.conv_state"), 3 + lead,
              stacked ? "[layers, S, W-1, D]" : "[S, W-1, D]");
  expect_ndim(state.conv_window, arg(op, "state.conv_window"), 4 + lead,
              stacked ? "[layers, R, T_max, W-1, D]" : "[R, T_max, W-1, D]");
  const TensorView& ssm = state.ssm_state;
  d.layers = stacked ? static_cast<int>(ssm.size(0)) : 1;
  d.S = static_cast<int>(ssm.size(lead));
  d.HV = static_cast<int>(ssm.size(lead + 1));
  d.V = static_cast<int>(ssm.size(lead + 2));
  d.K = static_cast<int>(ssm.size(lead + 3));
  d.R = static_cast<int>(state.conv_window.size(lead));
  d.T_max = static_cast<int>(state.conv_window.size(lead + 1));
  const int64_t D = state.conv_state.size(lead + 2);
  KDA_CHECK(d.layers >= 1 && d.S >= 1 && d.HV >= 1 && d.V >= 1,
            "{}: expected non-empty extents, got {}", arg(op, "state.ssm_state"), ssm.shape_str());
  KDA_CHECK(d.K == 64 || d.K == 128, "{}: K = dim {} is {}, expected 64 or 128",
            arg(op, "state.ssm_state"), lead + 3, d.K);
  KDA_CHECK(d.R >= 1 && d.T_max >= 1, "{}: expected R >= 1 rows and T_max >= 1 steps, got {}",
            arg(op, "state.conv_window"), state.conv_window.shape_str());

  const TensorView* rings[] = {&state.ring_rawv, &state.ring_rawk, &state.ring_g, &state.ring_beta};
  const char* ring_names[] = {"state.ring_rawv", "state.ring_rawk", "state.ring_g",
                              "state.ring_beta"};
  int given = 0;
  for (const TensorView* r : rings) {
    given += r->defined() ? 1 : 0;
  }
  if (given > 0) {
    for (int i = 0; i < 4; ++i) {
      KDA_CHECK(rings[i]->defined(),
                "{}: missing: ring mode needs all four rings (ring_rawv, ring_rawk, ring_g, "
                "ring_beta), {} of them given",
                arg(op, ring_names[i]), given);
    }
    KDA_CHECK(!state.snapshots.defined(),
              "{}: given with the rings: a state records either snapshots (snapshot mode) or "
              "rings (ring mode)",
              arg(op, "state.snapshots"));
    d.mode = RecordMode::kRing;
    expect_ndim(state.ring_rawv, arg(op, "state.ring_rawv"), 4 + lead,
                stacked ? "[layers, S, HV, L, V]" : "[S, HV, L, V]");
    expect_ndim(state.ring_rawk, arg(op, "state.ring_rawk"), 4 + lead,
                stacked ? "[layers, S, H, L, K]" : "[S, H, L, K]");
    d.L = static_cast<int>(state.ring_rawv.size(lead + 2));
    d.H = static_cast<int>(state.ring_rawk.size(lead + 1));
    KDA_CHECK(d.L >= 1 && (d.L & (d.L - 1)) == 0,
              "{}: L = dim {} is {}, expected a power of two (the ring length)",
              arg(op, "state.ring_rawv"), lead + 2, d.L);
    KDA_CHECK(d.L >= 2 * d.T_max,
              "{}: L = {} is smaller than 2 * T_max = {} (T_max: state.conv_window's steps; the "
              "pool invariant of contract §2)",
              arg(op, "state.ring_rawv"), d.L, 2 * d.T_max);
    KDA_CHECK(d.H >= 1 && 2 * int64_t{d.H} * d.K + int64_t{d.HV} * d.V == D,
              "{}: H = {} heads do not fit D = {} (state.conv_state's last dim): expected 2*H*K + "
              "HV*V = D with K = {}, HV = {}, V = {}",
              arg(op, "state.ring_rawk"), d.H, D, d.K, d.HV, d.V);
  } else {
    KDA_CHECK(state.snapshots.defined(),
              "{}: none given: the state needs the snapshots (snapshot mode) or the four rings "
              "(ring mode)",
              arg(op, "state.snapshots"));
    d.mode = RecordMode::kSnapshot;
    d.L = 16;  // unused in snapshot mode (the pool config wants a positive one)
    const int64_t qk = D - int64_t{d.HV} * d.V;
    KDA_CHECK(qk > 0 && qk % (2 * d.K) == 0,
              "{}: D = {} does not split as 2*H*K + HV*V with K = {}, HV = {}, V = {} "
              "(state.ssm_state's dims)",
              arg(op, "state.conv_state"), D, d.K, d.HV, d.V);
    d.H = static_cast<int>(qk / (2 * d.K));
  }
  KDA_CHECK(d.HV % d.H == 0, "{}: HV = {} is not a multiple of H = {}", arg(op, "state.ssm_state"),
            d.HV, d.H);
  for (const auto& [t, name] :
       {std::pair<const TensorView*, const char*>{&state.ring_cursor, "state.ring_cursor"},
        {&state.ring_u, "state.ring_u"}}) {
    KDA_CHECK(!t->defined() || state.ring_pending.defined(),
              "{}: given without state.ring_pending (the deferred commit's tensors come together: "
              "ring_cursor, ring_pending, ring_u)",
              arg(op, name));
  }
  KDA_CHECK(!lazy || state.ring_pending.defined(),
            "{}: none given: the lazy write-back (lazy = true) keeps pending counts (ring_cursor, "
            "ring_pending)",
            arg(op, "state.ring_pending"));
  if (state.ring_pending.defined()) {
    KDA_CHECK(d.mode == RecordMode::kRing,
              "{}: given in snapshot mode (the deferred commit is ring mode only)",
              arg(op, "state.ring_pending"));
    if (lazy) {
      KDA_CHECK(state.ring_cursor.defined(),
                "{}: missing: the lazy write-back (state.ring_pending given) needs ring_cursor too",
                arg(op, "state.ring_cursor"));
      KDA_CHECK(!state.ring_u.defined(),
                "{}: given with lazy = true: the lazy write-back keeps no u records",
                arg(op, "state.ring_u"));
      KDA_CHECK(d.L <= kFastMaxChunk,
                "{}: L = {} with lazy = true, expected at most {} (the pending steps and the next "
                "draft share one fast chunk)",
                arg(op, "state.ring_rawv"), d.L, kFastMaxChunk);
      d.lazy = true;
    } else {
      KDA_CHECK(state.ring_cursor.defined() && state.ring_u.defined(),
                "{}: missing: the deferred commit (state.ring_pending given) needs ring_cursor and "
                "ring_u too (the lazy write-back, without ring_u, is asked for with lazy = true)",
                arg(op, state.ring_cursor.defined() ? "state.ring_u" : "state.ring_cursor"));
      d.u_records = true;  // the ops' deferred state replays its u records (not u-free)
    }
    d.deferred = true;
  }
  return d;
}

PoolConfig pool_config_of(const Dims& d, const Device& device) {
  PoolConfig c;
  c.layers = d.layers;
  c.H = d.H;
  c.HV = d.HV;
  c.K = d.K;
  c.V = d.V;
  c.num_slots = d.S;
  c.num_rows = d.R;
  c.T_max = d.T_max;
  c.ring_mode = d.mode == RecordMode::kRing;
  c.ring_len = d.L;
  c.deferred_commit = d.deferred;
  c.deferred_u_records = d.u_records;
  c.lazy_commit = d.lazy;
  c.device = device;
  return c;
}

// Shapes, then every state tensor against pool_storage.h's rules.
Dims validate_state(const char* op, const StateTensors& state, bool stacked, bool lazy) {
  const Dims d = read_dims(op, state, stacked, lazy);
  validate_external_tensors(pool_config_of(d, state.ssm_state.device()), state,
                            arg(op, "state").c_str(), /*with_qkv_act=*/false,
                            /*per_layer=*/!stacked);
  return d;
}

// A [n] int32 contiguous index tensor on `device` (n < 0: any length >= 1).
void expect_index(const TensorView& t, const std::string& name, int64_t n, const Device& device) {
  KDA_CHECK(t.defined(), "{}: expected an int32 tensor [{}], got none", name,
            n < 0 ? std::string("n") : std::to_string(n));
  expect_tensor(t, name, DType::kI32, device, {n});
  expect_contiguous(t, name);
  expect_aligned(t, name, 4);
}

// The batch's index tensors; returns B.
int validate_batch(const char* op, const BatchTensors& batch, const Dims& d, const Device& device,
                   bool rows_required) {
  KDA_CHECK(batch.slots.defined() && batch.slots.ndim() == 1,
            "{}: expected an int32 tensor [B], got {}", arg(op, "batch.slots"),
            batch.slots.defined() ? batch.slots.shape_str() : std::string("none"));
  const int64_t B = batch.slots.size(0);
  KDA_CHECK(B >= 1 && B <= std::numeric_limits<int32_t>::max(),
            "{}: B = {} requests, expected >= 1", arg(op, "batch.slots"), B);
  expect_index(batch.slots, arg(op, "batch.slots"), B, device);
  KDA_CHECK(batch.T >= 1 && batch.T <= d.T_max,
            "{}: T = {} outside [1, T_max = {}] (T_max: state.conv_window's steps)",
            arg(op, "batch.T"), batch.T, d.T_max);
  if (rows_required || batch.rows.defined()) {
    expect_index(batch.rows, arg(op, "batch.rows"), B, device);
  }
  if (batch.query_start_loc.defined()) {
    KDA_CHECK(!batch.parents.defined(),
              "{}: given with batch.query_start_loc: a draft is a ragged chain or a tree",
              arg(op, "batch.parents"));
    expect_index(batch.query_start_loc, arg(op, "batch.query_start_loc"), B + 1, device);
  }
  if (batch.parents.defined()) {
    KDA_CHECK(batch.T <= kMaxTreeNodes, "{}: T = {} nodes for a tree, expected at most {}",
              arg(op, "batch.T"), batch.T, kMaxTreeNodes);
    const TensorView& p = batch.parents;
    const std::string name = arg(op, "batch.parents");
    KDA_CHECK((p.ndim() == 2 && p.size(0) == B && p.size(1) == batch.T) ||
                  (p.ndim() == 1 && p.size(0) == B * batch.T),
              "{}: expected shape [B, T] = [{}, {}] or [B*T] = [{}], got {}", name, B, batch.T,
              B * batch.T, p.shape_str());
    expect_dtype(p, name, DType::kI32);
    expect_device(p, name, device);
    expect_contiguous(p, name);
    expect_aligned(p, name, 4);
  }
  return static_cast<int>(B);
}

const int32_t* i32(const TensorView& t) { return static_cast<const int32_t*>(t.data()); }

// The dispatcher's platform for `device` (cached per CUDA device: detect_platform queries the
// driver).
Platform platform_of(const VerifyOptions& o, const Device& device) {
  if (o.platform) {
    return *o.platform;
  }
  if (!device.is_cuda()) {
    Platform p;
    p.reason = "the host kernel set runs on the CPU";
    return p;
  }
  static std::mutex mu;
  static std::map<int, Platform> cache;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device.index);
  if (it == cache.end()) {
    it = cache.emplace(device.index, detect_platform(device.index)).first;
  }
  return it->second;
}

// A 2-D activation [rows, cols] of bf16 on `device`: inner dim contiguous, row pitch >= cols.
void expect_activation(const TensorView& t, const std::string& name, const Device& device,
                       int64_t rows, int64_t cols) {
  expect_tensor(t, name, DType::kBF16, device, {rows, cols});
  expect_inner_contiguous(t, name);
  expect_aligned(t, name, dtype_size(DType::kBF16));
  KDA_CHECK(t.size(0) <= 1 || t.stride(0) >= cols,
            "{}: row stride {} is smaller than the row width {} (rows would overlap)", name,
            t.stride(0), cols);
}

}  // namespace

DispatchDecision verify(KernelSet& kernels, const VerifyArgs& args, cudaStream_t stream) {
  const char* op = "verify";
  const StateTensors& st = args.state;
  const Dims d = validate_state(op, st, /*stacked=*/false, args.options.lazy);
  KDA_CHECK(!d.lazy || args.options.dispatch.numerics != NumericsRequest::kExact,
            "{}: exact with lazy = true: the lazy write-back's verify computes fast outputs "
            "(expected fast or auto)",
            arg(op, "options.dispatch.numerics"));
  KDA_CHECK_CODE(!d.lazy || kernels.runs_lazy_write_back(), ErrorCode::kUnsupported,
                 "{}: the {} kernel set does not run the lazy write-back (contract §11)",
                 arg(op, "options.lazy"), kernels.name());
  const Device device = st.ssm_state.device();
  KDA_CHECK(kernels.device() == device, "{}: the state is on {}, the kernel set ({}) runs on {}",
            arg(op, "state.ssm_state"), device_name(device), kernels.name(),
            device_name(kernels.device()));
  const BatchTensors& batch = args.batch;
  const int B = validate_batch(op, batch, d, device, /*rows_required=*/true);
  const int64_t D = st.conv_state.size(2), HV = d.HV;
  // Activation rows: B*T, or a ragged batch's total (query_start_loc[B], at most B*T).
  KDA_CHECK(args.mixed_qkv.defined() && args.mixed_qkv.ndim() == 2,
            "{}: expected a bf16 tensor [N, D], got {}", arg(op, "mixed_qkv"),
            args.mixed_qkv.defined() ? args.mixed_qkv.shape_str() : std::string("none"));
  const int64_t N = args.mixed_qkv.size(0);
  const bool ragged = batch.query_start_loc.defined();
  const int64_t dense_rows = int64_t{B} * batch.T;
  KDA_CHECK(ragged ? (N >= B && N <= dense_rows) : N == dense_rows,
            "{}: {} rows, expected {} (B = {} requests{})", arg(op, "mixed_qkv"), N,
            ragged ? fmt::format("B..B*T = {}..{}", B, dense_rows) : std::to_string(dense_rows), B,
            ragged ? ", ragged: the sum of the lengths" : fmt::format(" x T = {}", batch.T));
  expect_activation(args.mixed_qkv, arg(op, "mixed_qkv"), device, N, D);
  expect_activation(args.a, arg(op, "a"), device, N, HV * d.K);
  expect_activation(args.b, arg(op, "b"), device, N, HV);
  expect_tensor(args.out, arg(op, "out"), DType::kBF16, device, {N, HV, d.V});
  expect_contiguous(args.out, arg(op, "out"));
  expect_aligned(args.out, arg(op, "out"), dtype_size(DType::kBF16));
  if (ragged && !device.is_cuda()) {
    const int32_t total = i32(batch.query_start_loc)[B];
    KDA_CHECK(total == N, "{}: query_start_loc[B] = {} packed rows, mixed_qkv has {}",
              arg(op, "batch.query_start_loc"), total, N);
  }

  ModelConfig model;
  model.num_layers = 1;
  model.H = d.H;
  model.HV = d.HV;
  model.K = d.K;
  model.V = d.V;
  model.gate = args.options.gate;
  model.lower_bound = args.options.lower_bound;
  model.conv_weight_type =
      args.weights.conv_weight.defined() && args.weights.conv_weight.dtype() == DType::kBF16
          ? ConvWeightType::kBF16
          : ConvWeightType::kF32;
  model.has_conv_bias = args.weights.conv_bias.defined();
  try {
    model.validate();
    validate_layer_weights(args.weights, model, device);
  } catch (const Error& e) {
    KDA_THROW(e.code(), "ops.verify: {}", e.message());
  }
  const DispatchFlags& flags = args.options.dispatch;
  KDA_CHECK(flags.fused_ring_max_batch >= 0,
            "{}: fused_ring_max_batch = {}, expected >= 0 (0: ring mode never fused)",
            arg(op, "options"), flags.fused_ring_max_batch);

  detail::VerifyCall call;
  call.B = B;
  call.T = batch.T;
  call.gate = model.gate;
  call.lower_bound = model.lower_bound;
  call.conv_weight_type = model.conv_weight_type;
  call.mixed_qkv = args.mixed_qkv;
  call.a = args.a;
  call.b = args.b;
  call.out = args.out;
  call.weights = &args.weights;
  call.slots = i32(batch.slots);
  call.rows = i32(batch.rows);
  call.token_offsets = ragged ? i32(batch.query_start_loc) : nullptr;
  call.parents = batch.parents.defined() ? i32(batch.parents) : nullptr;
  call.fold_before_wait = 0;  // no knowledge of the kernels before this one (kda_params.h)
  StateTensors layer_state = st;
  layer_state.qkv_act = TensorView();  // set below, when the unfused path runs
  VerifyParams p = detail::verify_params(d, layer_state, call);

  const DispatchProblem problem = detail::dispatch_problem(
      d, B, batch.T, !batch.parents.defined(), N, args.mixed_qkv, args.a, args.b, args.weights,
      batch.slots, batch.rows, RingViews{st.ring_rawv, st.ring_rawk, st.ring_g, st.ring_beta});
  const Platform platform = platform_of(args.options, device);
  // The unfused path hands the conv output to the recurrence through qkv_act: required then.
  const DispatchDecision chosen = choose_verify_path(problem, platform, flags);
  if (!chosen.fused()) {
    const std::string name = arg(op, "state.qkv_act");
    KDA_CHECK(st.qkv_act.defined(),
              "{}: none given, but the unfused path runs ({}): expected a bf16 tensor [>= {}, {}]",
              name, chosen.describe_path(), N, D);
    KDA_CHECK(st.qkv_act.ndim() == 2 && st.qkv_act.size(0) >= N && st.qkv_act.size(1) == D,
              "{}: expected shape [>= {}, {}], got {}", name, N, D, st.qkv_act.shape_str());
    expect_dtype(st.qkv_act, name, DType::kBF16);
    expect_device(st.qkv_act, name, device);
    expect_contiguous(st.qkv_act, name);
    expect_aligned(st.qkv_act, name, 4);
    p.qkv_act = static_cast<bf16_t*>(st.qkv_act.data());
  }
  return detail::run_verify(kernels, p, problem, platform, flags, stream);
}

CommitDecision commit(KernelSet& kernels, const CommitArgs& args, cudaStream_t stream) {
  const char* op = "commit";
  const StateTensors& st = args.state;
  const Dims d = validate_state(op, st, /*stacked=*/true, args.lazy);
  KDA_CHECK(args.lazy_fold_interval >= 0 && args.lazy_fold_interval <= kFastMaxChunk,
            "{}: {}, expected 0..{} (0: fold only when the next draft would not fit)",
            arg(op, "lazy_fold_interval"), args.lazy_fold_interval, kFastMaxChunk);
  KDA_CHECK(args.lazy || args.lazy_fold_interval == 0, "{}: {} without lazy = true (expected 0)",
            arg(op, "lazy_fold_interval"), args.lazy_fold_interval);
  KDA_CHECK_CODE(!d.lazy || kernels.runs_lazy_write_back(), ErrorCode::kUnsupported,
                 "{}: the {} kernel set does not run the lazy write-back (contract §11)",
                 arg(op, "lazy"), kernels.name());
  const Device device = st.ssm_state.device();
  KDA_CHECK(kernels.device() == device, "{}: the state is on {}, the kernel set ({}) runs on {}",
            arg(op, "state.ssm_state"), device_name(device), kernels.name(),
            device_name(kernels.device()));
  const BatchTensors& batch = args.batch;
  const int B = validate_batch(op, batch, d, device, /*rows_required=*/true);
  expect_index(args.accepted_lengths, arg(op, "accepted_lengths"), B, device);
  const bool tree = batch.parents.defined();
  const bool ragged = batch.query_start_loc.defined();
  KDA_CHECK(!tree || !d.deferred,
            "{}: a tree round commits eagerly (state.ring_pending given: the deferred commit)",
            arg(op, "batch.parents"));
  if (tree) {
    const std::string name = arg(op, "accepted_paths");
    KDA_CHECK(args.accepted_paths.defined(),
              "{}: a tree round (batch.parents) commits its "
              "accepted paths: expected an int32 tensor [B, T] = [{}, {}], got none",
              name, B, batch.T);
    expect_tensor(args.accepted_paths, name, DType::kI32, device, {B, batch.T});
    expect_contiguous(args.accepted_paths, name);
    expect_aligned(args.accepted_paths, name, 4);
  } else {
    KDA_CHECK(!args.accepted_paths.defined(),
              "{}: given for a chain (accepted paths belong to a tree round: batch.parents)",
              arg(op, "accepted_paths"));
  }
  KDA_CHECK(args.track_slots.defined() == args.track_steps.defined(),
            "{}: track_slots and track_steps go together ([B] each, or neither)",
            arg(op, args.track_slots.defined() ? "track_steps" : "track_slots"));
  if (args.track_slots.defined()) {
    expect_index(args.track_slots, arg(op, "track_slots"), B, device);
    expect_index(args.track_steps, arg(op, "track_steps"), B, device);
  }
  if (tree || ragged) {
    expect_index(args.checked_accepted, arg(op, "checked_accepted"), B, device);
  }
  if (args.error_flag.defined()) {
    expect_index(args.error_flag, arg(op, "error_flag"), 1, device);
  }
  detail::CommitCall call;
  call.kind = d.lazy ? CommitKind::kLazy : d.deferred ? CommitKind::kDeferred : CommitKind::kEager;
  call.B = B;
  call.T = batch.T;
  call.slots = i32(batch.slots);
  call.rows = i32(batch.rows);
  call.accepted = i32(args.accepted_lengths);
  call.token_offsets = ragged ? i32(batch.query_start_loc) : nullptr;
  call.parents = tree ? i32(batch.parents) : nullptr;
  call.accepted_paths = tree ? i32(args.accepted_paths) : nullptr;
  call.track_slots = args.track_slots.defined() ? i32(args.track_slots) : nullptr;
  call.track_steps = args.track_steps.defined() ? i32(args.track_steps) : nullptr;
  call.checked_accepted =
      tree || ragged ? static_cast<int32_t*>(args.checked_accepted.data()) : nullptr;
  call.error_flag =
      args.error_flag.defined() ? static_cast<int32_t*>(args.error_flag.data()) : nullptr;
  CommitParams params = detail::commit_params(d, st, call);
  params.lazy_fold_interval = d.lazy ? args.lazy_fold_interval : 0;
  kernels.commit(params, stream);
  return CommitDecision{call.kind, d.mode, detail::commit_reason(call.kind, d.mode)};
}

void materialize(KernelSet& kernels, const MaterializeArgs& args, cudaStream_t stream) {
  const char* op = "materialize";
  const StateTensors& st = args.state;
  const Dims d = validate_state(op, st, /*stacked=*/true, args.lazy);
  const Device device = st.ssm_state.device();
  KDA_CHECK(kernels.device() == device, "{}: the state is on {}, the kernel set ({}) runs on {}",
            arg(op, "state.ssm_state"), device_name(device), kernels.name(),
            device_name(kernels.device()));
  KDA_CHECK(d.deferred,
            "{}: none given: materialize folds the deferred commit's pending steps (ring_cursor, "
            "ring_pending, ring_u)",
            arg(op, "state.ring_pending"));
  KDA_CHECK(args.slots.defined() && args.slots.ndim() == 1,
            "{}: expected an int32 tensor [n], got {}", arg(op, "slots"),
            args.slots.defined() ? args.slots.shape_str() : std::string("none"));
  const int64_t n = args.slots.size(0);
  if (n == 0) {
    return;
  }
  expect_index(args.slots, arg(op, "slots"), n, device);
  KDA_CHECK(n <= std::numeric_limits<int32_t>::max(), "{}: {} slots, at most 2^31 - 1",
            arg(op, "slots"), n);
  if (!device.is_cuda()) {
    const int32_t* s = i32(args.slots);
    for (int64_t i = 0; i < n; ++i) {
      KDA_CHECK(s[i] >= 0 && s[i] < d.S, "{}: slots[{}] = {} out of range [0, {})",
                arg(op, "slots"), i, s[i], d.S);
      for (int64_t j = 0; j < i; ++j) {
        KDA_CHECK(s[j] != s[i], "{}: slots[{}] and slots[{}] are both {} (distinct slots)",
                  arg(op, "slots"), j, i, s[i]);
      }
    }
  }
  detail::CommitCall call;
  call.kind = CommitKind::kMaterialize;
  call.B = static_cast<int>(n);
  call.T = d.T_max;
  call.slots = i32(args.slots);
  kernels.commit(detail::commit_params(d, st, call), stream);
}

}  // namespace kda::ops
