// kda_c.cc: the C ABI over kda::KdaAttentionBackend (capi/kda_c.h).
//
// Every entry point runs its body through guarded(): kda::Error becomes its ErrorCode + 1 and
// its message, std::bad_alloc KDA_ERROR_OUT_OF_MEMORY, anything else KDA_ERROR_INTERNAL; the
// message is kept per thread for kda_last_error. DLTensors become TensorViews in to_view(),
// which checks only what a TensorView cannot express (dtype code, lanes, device type, rank);
// shapes, strides, devices and values are left to the backend's own validation and messages.
#include "capi/kda_c.h"

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/flags.h"
#include "backend/kda_backend.h"
#include "backend/kernel_set_factory.h"
#include "backend/ops.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/tensor_view.h"

namespace kda::capi {
namespace {

constexpr uint64_t kHandleMagic = 0x4b44415f48414e44ull;  // "KDA_HAND"
// A kda_backend* is a token, never an address: kHandleTag in bits 48..63 and a serial (never
// reused) above 4 zero bits, so that a destroyed handle stays unknown even when a new backend
// takes its memory, and no handle value is ever dereferenced.
constexpr uint64_t kHandleTag = 0x4b44;  // "KD"
constexpr int kTagShift = 48;
constexpr int kSerialShift = 4;
constexpr uint64_t kMaxSerial = (uint64_t{1} << (kTagShift - kSerialShift)) - 1;

// What a live handle resolves to.
struct Handle {
  uint64_t magic = kHandleMagic;
  std::unique_ptr<KdaAttentionBackend> backend;
  std::string round_state;  // kda_round_state's string
  // kda_pool_view's shape and strides, per (name, layer): stable for the handle's lifetime.
  std::map<std::pair<std::string, int>, std::array<int64_t, 2 * TensorView::kMaxDims>> dims;
};

uint64_t token_value(const kda_backend* h) { return reinterpret_cast<uintptr_t>(h); }

// The live handles, by serial. Lookups lock one mutex; a handle is used outside it (one thread
// drives a backend; destroying it during another thread's call on it is undefined, kda_c.h).
class Registry {
 public:
  kda_backend* add(std::unique_ptr<Handle> handle) {
    const std::lock_guard<std::mutex> lock(mu_);
    KDA_CHECK_CODE(next_serial_ <= kMaxSerial, ErrorCode::kInternal,
                   "create: every handle serial is used");
    const uint64_t serial = next_serial_++;
    live_.emplace(serial, std::move(handle));
    return reinterpret_cast<kda_backend*>(
        static_cast<uintptr_t>((kHandleTag << kTagShift) | (serial << kSerialShift)));
  }

  /// The live handle `h`; throws kInvalidArgument naming `call` for NULL, a destroyed handle
  /// or a value that never came from kda_backend_create.
  Handle& find(const kda_backend* h, const char* call) {
    KDA_CHECK(h != nullptr, "{}: backend is NULL", call);
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(serial_of(h));
    if (it == live_.end()) {
      fail_unknown(h, call);
    }
    KDA_CHECK_CODE(it->second->magic == kHandleMagic, ErrorCode::kInternal,
                   "{}: backend {:#x}: its magic value is overwritten (memory corruption)", call,
                   token_value(h));
    return *it->second;
  }

  /// Removes `h` and returns its handle; throws as find() when it is not live.
  std::unique_ptr<Handle> remove(const kda_backend* h, const char* call) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(serial_of(h));
    if (it == live_.end()) {
      fail_unknown(h, call);
    }
    std::unique_ptr<Handle> handle = std::move(it->second);
    live_.erase(it);
    handle->magic = 0;
    return handle;
  }

 private:
  // The serial of a well-formed token, else 0 (never issued).
  static uint64_t serial_of(const kda_backend* h) {
    const uint64_t v = token_value(h);
    const uint64_t low = (uint64_t{1} << kSerialShift) - 1;
    if ((v >> kTagShift) != kHandleTag || (v & low) != 0) {
      return 0;
    }
    return (v & ((uint64_t{1} << kTagShift) - 1)) >> kSerialShift;
  }

  [[noreturn]] void fail_unknown(const kda_backend* h, const char* call) const {
    const uint64_t serial = serial_of(h);
    KDA_CHECK(serial == 0 || serial >= next_serial_,
              "{}: backend {:#x} was destroyed (kda_backend_destroy); expected a live handle", call,
              token_value(h));
    KDA_FAIL("{}: backend {:#x} is not a handle made by kda_backend_create", call, token_value(h));
  }

  std::mutex mu_;
  uint64_t next_serial_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Handle>> live_;
};

// Never destroyed: backends still live at exit are left alone (as before the registry), not torn
// down after the CUDA runtime.
Registry& registry() {
  static Registry* const r = new Registry();
  return *r;
}

thread_local std::string t_last_error;
thread_local int t_last_status = KDA_OK;

int status_of(ErrorCode code) { return static_cast<int>(code) + 1; }

int fail(int status, const char* message) {
  t_last_status = status;
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // no memory for the message: the status still tells
  }
  return status;
}

// Runs `body`; no exception leaves it.
template <typename F>
int guarded(F&& body) noexcept {
  t_last_status = KDA_OK;
  t_last_error.clear();
  try {
    body();
    return KDA_OK;
  } catch (const Error& e) {
    return fail(status_of(e.code()), e.message().c_str());
  } catch (const std::bad_alloc&) {
    return fail(KDA_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(KDA_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(KDA_ERROR_INTERNAL, "unknown exception");
  }
}

KdaAttentionBackend& backend_of(const kda_backend* h, const char* call) {
  return *registry().find(h, call).backend;
}

// DLPack dtype names ("bfloat16", "float32", "int64", ...).
std::string dl_dtype_name(const DLDataType& t) {
  const char* base = "unknown";
  switch (t.code) {
    case kDLInt:
      base = "int";
      break;
    case kDLUInt:
      base = "uint";
      break;
    case kDLFloat:
      base = "float";
      break;
    case kDLBfloat:
      base = "bfloat";
      break;
    case kDLComplex:
      base = "complex";
      break;
    default:
      return fmt::format("code {} ({} bits)", t.code, t.bits);
  }
  std::string s = fmt::format("{}{}", base, t.bits);
  if (t.lanes != 1) {
    s += fmt::format("x{}", t.lanes);
  }
  return s;
}

const char* dl_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF32:
      return "float32";
    case DType::kI32:
      return "int32";
  }
  return "?";
}

bool dl_matches(const DLDataType& t, DType want) {
  if (t.lanes != 1) {
    return false;
  }
  switch (want) {
    case DType::kBF16:
      return t.code == kDLBfloat && t.bits == 16;
    case DType::kF16:
      return t.code == kDLFloat && t.bits == 16;
    case DType::kF32:
      return t.code == kDLFloat && t.bits == 32;
    case DType::kI32:
      return t.code == kDLInt && t.bits == 32;
  }
  return false;
}

std::string dtype_list(std::initializer_list<DType> allowed) {
  std::string s;
  for (DType d : allowed) {
    s += (s.empty() ? "" : " or ") + std::string(dl_name(d));
  }
  return s;
}

/// `t` as a TensorView; `call` and `arg` name it in errors. dtype must be one of `allowed`.
/// NULL `t`: an undefined view if `optional`, else an error.
TensorView to_view(const DLTensor* t, const std::string& call, const char* arg,
                   std::initializer_list<DType> allowed, bool optional = false) {
  if (t == nullptr) {
    KDA_CHECK(optional, "{}: {}: NULL DLTensor", call, arg);
    return TensorView();
  }
  DType dtype = *allowed.begin();
  bool found = false;
  for (DType d : allowed) {
    if (dl_matches(t->dtype, d)) {
      dtype = d;
      found = true;
      break;
    }
  }
  KDA_CHECK(found, "{}: {}: dtype {} unsupported, expected {}", call, arg, dl_dtype_name(t->dtype),
            dtype_list(allowed));
  Device device;
  switch (t->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      device = Device::host();
      break;
    case kDLCUDA:
      KDA_CHECK(t->device.device_id >= 0, "{}: {}: CUDA device id {} is negative", call, arg,
                t->device.device_id);
      device = Device::cuda(t->device.device_id);
      break;
    default:
      KDA_FAIL(
          "{}: {}: DLPack device type {} unsupported, expected kDLCPU (1), kDLCUDA (2) or "
          "kDLCUDAHost (3)",
          call, arg, static_cast<int>(t->device.device_type));
  }
  KDA_CHECK(t->ndim >= 0 && t->ndim <= TensorView::kMaxDims, "{}: {}: {} dims, at most {}", call,
            arg, t->ndim, TensorView::kMaxDims);
  KDA_CHECK(t->ndim == 0 || t->shape != nullptr, "{}: {}: {} dims but shape is NULL", call, arg,
            t->ndim);
  int64_t numel = 1;
  for (int d = 0; d < t->ndim; ++d) {
    KDA_CHECK(t->shape[d] >= 0, "{}: {}: negative extent {} in dim {}", call, arg, t->shape[d], d);
    numel *= t->shape[d];
  }
  KDA_CHECK(t->data != nullptr || numel == 0, "{}: {}: data is NULL", call, arg);
  std::array<int64_t, TensorView::kMaxDims> strides{};
  if (t->strides != nullptr) {
    for (int d = 0; d < t->ndim; ++d) {
      strides[d] = t->strides[d];
    }
  } else {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; --d) {
      strides[d] = s;
      s *= t->shape[d];
    }
  }
  void* data = t->data == nullptr ? nullptr : static_cast<char*>(t->data) + t->byte_offset;
  return TensorView::strided(data, dtype, device, t->shape, strides.data(), t->ndim);
}

VerifyInputs to_inputs(const std::string& call, const DLTensor* mixed_qkv, const DLTensor* a,
                       const DLTensor* b) {
  VerifyInputs in;
  in.mixed_qkv = to_view(mixed_qkv, call, "mixed_qkv", {DType::kBF16});
  in.a = to_view(a, call, "a", {DType::kBF16});
  in.b = to_view(b, call, "b", {DType::kBF16});
  return in;
}

std::vector<int32_t> host_array(const int32_t* p, int32_t n, const char* call, const char* arg) {
  KDA_CHECK(n >= 0, "{}: {} has negative length {}", call, arg, n);
  KDA_CHECK(p != nullptr || n == 0, "{}: {} is NULL for {} entries", call, arg, n);
  return n == 0 ? std::vector<int32_t>() : std::vector<int32_t>(p, p + n);
}

Device parse_device(const char* s) {
  KDA_CHECK(s != nullptr, "create: device is NULL, expected \"host\", \"cuda\" or \"cuda:N\"");
  const std::string v(s);
  if (v == "host" || v == "cpu") {
    return Device::host();
  }
  if (v == "cuda") {
    return Device::cuda(0);
  }
  if (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.size() <= 9 &&
      v.find_first_not_of("0123456789", 5) == std::string::npos) {
    return Device::cuda(std::stoi(v.substr(5)));
  }
  KDA_FAIL("create: device '{}' unsupported, expected \"host\", \"cuda\" or \"cuda:N\"", v);
}

ModelConfig to_model(const kda_model_config& m) {
  ModelConfig c;
  c.num_layers = m.num_layers;
  c.H = m.H;
  c.HV = m.HV;
  c.K = m.K;
  c.V = m.V;
  KDA_CHECK(m.gate == KDA_GATE_STANDARD || m.gate == KDA_GATE_SAFE,
            "create: model.gate = {} unsupported, expected KDA_GATE_STANDARD (0) or "
            "KDA_GATE_SAFE (1)",
            m.gate);
  c.gate = m.gate == KDA_GATE_SAFE ? GateKind::kSafe : GateKind::kStandard;
  c.lower_bound = m.lower_bound;
  KDA_CHECK(m.conv_weight_dtype == KDA_CONV_F32 || m.conv_weight_dtype == KDA_CONV_BF16,
            "create: model.conv_weight_dtype = {} unsupported, expected KDA_CONV_F32 (0) or "
            "KDA_CONV_BF16 (1)",
            m.conv_weight_dtype);
  c.conv_weight_type =
      m.conv_weight_dtype == KDA_CONV_BF16 ? ConvWeightType::kBF16 : ConvWeightType::kF32;
  KDA_CHECK(m.has_conv_bias == 0 || m.has_conv_bias == 1,
            "create: model.has_conv_bias = {}, expected 0 or 1", m.has_conv_bias);
  c.has_conv_bias = m.has_conv_bias != 0;
  return c;
}

// The pool tensor `name` of `layer` (-1: all layers); throws naming the name.
TensorView pool_tensor(const KdaStatePool& pool, const std::string& name, int layer) {
  using Layer = TensorView (KdaStatePool::*)(int) const;
  using All = TensorView (KdaStatePool::*)() const;
  struct Entry {
    const char* name;
    Layer layer;
    All all;
  };
  static const Entry kEntries[] = {
      {"conv_state", &KdaStatePool::conv_state, &KdaStatePool::conv_state_all},
      {"ssm_state", &KdaStatePool::ssm_state, &KdaStatePool::ssm_state_all},
      {"conv_window", &KdaStatePool::conv_window, &KdaStatePool::conv_window_all},
      {"snapshots", &KdaStatePool::snapshots, &KdaStatePool::snapshots_all},
      {"ring_rawv", &KdaStatePool::ring_rawv, &KdaStatePool::ring_rawv_all},
      {"ring_rawk", &KdaStatePool::ring_rawk, &KdaStatePool::ring_rawk_all},
      {"ring_g", &KdaStatePool::ring_g, &KdaStatePool::ring_g_all},
      {"ring_beta", &KdaStatePool::ring_beta, &KdaStatePool::ring_beta_all},
      {"ring_pending", &KdaStatePool::ring_pending, &KdaStatePool::ring_pending_all},
      {"ring_u", &KdaStatePool::ring_u, &KdaStatePool::ring_u_all},
      {"ring_cursor", nullptr, &KdaStatePool::ring_cursor},
      {"qkv_act", nullptr, &KdaStatePool::qkv_act},
  };
  for (const Entry& e : kEntries) {
    if (name != e.name) {
      continue;
    }
    TensorView v;
    if (layer == -1) {
      v = (pool.*e.all)();
    } else {
      KDA_CHECK(e.layer != nullptr, "pool_view: {} has no layer dim, expected layer -1, got {}",
                name, layer);
      KDA_CHECK(layer >= 0 && layer < pool.num_layers(),
                "pool_view: {}: layer {} out of range [-1, {})", name, layer, pool.num_layers());
      v = (pool.*e.layer)(layer);
    }
    KDA_CHECK(v.defined(), "pool_view: {} is absent in {} mode{}", name,
              pool.ring_mode() ? "ring" : "snapshot",
              pool.ring_mode() && !pool.config().deferred_commit ? " (eager commit)" : "");
    return v;
  }
  KDA_FAIL(
      "pool_view: unknown tensor '{}' (conv_state, ssm_state, conv_window, snapshots, ring_rawv, "
      "ring_rawk, ring_g, ring_beta, ring_pending, ring_u, ring_cursor, qkv_act)",
      name);
}

// kda_allocator's callbacks as a kda::Allocator; `release` runs when the last user lets go.
class CAllocator final : public Allocator {
 public:
  explicit CAllocator(const kda_allocator& cb) : cb_(cb) {}
  ~CAllocator() override {
    if (cb_.release != nullptr) {
      cb_.release(cb_.ctx);
    }
  }
  CAllocator(const CAllocator&) = delete;
  CAllocator& operator=(const CAllocator&) = delete;
  void* allocate(int64_t bytes, const Device& device, cudaStream_t stream) override {
    return cb_.alloc(cb_.ctx, bytes, device.is_cuda() ? kDLCUDA : kDLCPU, device.index,
                     static_cast<void*>(stream));
  }
  void deallocate(void* ptr, int64_t bytes, const Device& device,
                  cudaStream_t stream) noexcept override {
    cb_.free(cb_.ctx, ptr, bytes, device.is_cuda() ? kDLCUDA : kDLCPU, device.index,
             static_cast<void*>(stream));
  }
  const char* name() const override { return "engine allocator (kda_allocator)"; }

 private:
  kda_allocator cb_;
};

constexpr std::initializer_list<DType> kStateDTypes = {DType::kBF16, DType::kF32, DType::kI32};

// kda_state_tensors as ops::StateTensors; `prefix` names them ("external_pool", "state").
ops::StateTensors state_of(const kda_state_tensors& s, const std::string& call,
                           const std::string& prefix) {
  ops::StateTensors t;
  const std::pair<const DLTensor*, TensorView ops::StateTensors::*> all[] = {
      {s.conv_state, &ops::StateTensors::conv_state},
      {s.ssm_state, &ops::StateTensors::ssm_state},
      {s.conv_window, &ops::StateTensors::conv_window},
      {s.snapshots, &ops::StateTensors::snapshots},
      {s.ring_rawv, &ops::StateTensors::ring_rawv},
      {s.ring_rawk, &ops::StateTensors::ring_rawk},
      {s.ring_g, &ops::StateTensors::ring_g},
      {s.ring_beta, &ops::StateTensors::ring_beta},
      {s.ring_cursor, &ops::StateTensors::ring_cursor},
      {s.ring_pending, &ops::StateTensors::ring_pending},
      {s.ring_u, &ops::StateTensors::ring_u},
      {s.qkv_act, &ops::StateTensors::qkv_act}};
  const char* names[] = {"conv_state",  "ssm_state",    "conv_window", "snapshots",
                         "ring_rawv",   "ring_rawk",    "ring_g",      "ring_beta",
                         "ring_cursor", "ring_pending", "ring_u",      "qkv_act"};
  for (size_t i = 0; i < std::size(all); ++i) {
    const std::string name = prefix + "." + names[i];
    t.*(all[i].second) = to_view(all[i].first, call, name.c_str(), kStateDTypes, true);
  }
  return t;
}

ops::BatchTensors batch_of(const kda_batch_tensors& b, const std::string& call) {
  ops::BatchTensors t;
  t.T = b.T;
  t.slots = to_view(b.slots, call, "batch.slots", {DType::kI32}, true);
  t.rows = to_view(b.rows, call, "batch.rows", {DType::kI32}, true);
  t.query_start_loc =
      to_view(b.query_start_loc, call, "batch.query_start_loc", {DType::kI32}, true);
  t.parents = to_view(b.parents, call, "batch.parents", {DType::kI32}, true);
  return t;
}

// The ops' kernel set of `device` (made on first use, kept for the process) and its lock.
struct OpsKernels {
  std::mutex mu;
  std::unique_ptr<KernelSet> kernels;
};

OpsKernels& ops_kernels(const Device& device) {
  static std::mutex mu;
  static auto* sets = new std::map<std::pair<int, int>, std::unique_ptr<OpsKernels>>();
  const std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*sets)[{static_cast<int>(device.kind), device.index}];
  if (slot == nullptr) {
    auto k = std::make_unique<OpsKernels>();
    k->kernels = make_kernel_set(device);
    slot = std::move(k);
  }
  return *slot;
}

DLDataType to_dl(DType t) {
  switch (t) {
    case DType::kBF16:
      return DLDataType{kDLBfloat, 16, 1};
    case DType::kF16:
      return DLDataType{kDLFloat, 16, 1};
    case DType::kF32:
      return DLDataType{kDLFloat, 32, 1};
    case DType::kI32:
      return DLDataType{kDLInt, 32, 1};
  }
  return DLDataType{kDLFloat, 32, 1};
}

// What kda_verify and kda_op_verify report (reason names are static strings).
void fill_dispatch_info(const DispatchDecision& d, kda_dispatch_info& info) {
  info.fused = d.fused() ? 1 : 0;
  info.block_v = d.block_v;
  info.reason = dispatch_reason_name(d.reason);
  info.fast_outputs = d.fast_outputs() ? 1 : 0;
  info.numerics_reason = numerics_reason_name(d.numerics_reason);
}

}  // namespace
}  // namespace kda::capi

using kda::capi::guarded;

extern "C" {

int kda_abi_version(void) { return KDA_C_ABI_VERSION; }

const char* kda_last_error(void) { return kda::capi::t_last_error.c_str(); }

int kda_last_error_code(void) { return kda::capi::t_last_status; }

const char* kda_status_name(int status) {
  if (status == KDA_OK) {
    return "ok";
  }
  if (status >= KDA_ERROR_INVALID_ARGUMENT && status <= KDA_ERROR_INTERNAL) {
    return kda::error_code_name(static_cast<kda::ErrorCode>(status - 1));
  }
  return "unknown";
}

int kda_backend_create(const kda_model_config* model, const char* const* flags, int num_flags,
                       const char* device, const kda_backend_options* options, kda_backend** out) {
  if (out != nullptr) {
    *out = nullptr;
  }
  return guarded([&] {
    using namespace kda;
    KDA_CHECK(out != nullptr, "create: out is NULL");
    KDA_CHECK(model != nullptr, "create: model is NULL");
    KDA_CHECK(num_flags >= 0, "create: num_flags = {} is negative, expected >= 0", num_flags);
    KDA_CHECK(num_flags == 0 || flags != nullptr, "create: flags is NULL for {} entries",
              num_flags);
    std::vector<std::string> args;
    for (int i = 0; i < num_flags; ++i) {
      KDA_CHECK(flags[i] != nullptr, "create: flags[{}] is NULL", i);
      args.emplace_back(flags[i]);
    }
    const EngineFlags engine_flags = parse_engine_flags(args);
    KDA_CHECK(args.empty(), "create: flags: '{}' is not a flag of the module (see {})", args[0],
              "backend/flags.h");
    const ModelConfig config = capi::to_model(*model);
    const Device dev = capi::parse_device(device);
    BackendOptions backend_options;
    if (options != nullptr) {
      backend_options.memory_budget_bytes = options->memory_budget_bytes;
      KDA_CHECK(options->extra_slots >= 0, "create: options.extra_slots = {} is negative",
                options->extra_slots);
      backend_options.extra_slots = options->extra_slots;
      backend_options.allocation_stream = static_cast<cudaStream_t>(options->allocation_stream);
      if (options->allocator != nullptr) {
        // First: from here on every way out of create releases the allocator once.
        const kda_allocator& a = *options->allocator;
        if (a.alloc == nullptr || a.free == nullptr) {
          if (a.release != nullptr) {
            a.release(a.ctx);
          }
          KDA_FAIL(
              "create: options.allocator: alloc and free must both be given (alloc {}, free {})",
              a.alloc != nullptr ? "set" : "NULL", a.free != nullptr ? "set" : "NULL");
        }
        backend_options.allocator = std::make_shared<capi::CAllocator>(a);
      }
      if (options->external_pool != nullptr) {
        backend_options.external_pool =
            capi::state_of(*options->external_pool, "create", "external_pool");
      }
    }
    auto handle = std::make_unique<capi::Handle>();
    handle->backend = std::make_unique<KdaAttentionBackend>(config, engine_flags,
                                                            make_kernel_set(dev), backend_options);
    *out = capi::registry().add(std::move(handle));
  });
}

void kda_backend_destroy(kda_backend* backend) {
  guarded([&] {
    if (backend != nullptr) {
      // Outside the registry's lock: freeing a CUDA pool takes a while.
      kda::capi::registry().remove(backend, "destroy").reset();
    }
  });
}

int kda_set_layer_weights(kda_backend* backend, int layer, const DLTensor* A_log,
                          const DLTensor* dt_bias, const DLTensor* conv_weight,
                          const DLTensor* conv_bias) {
  return guarded([&] {
    using namespace kda;
    KdaAttentionBackend& b = capi::backend_of(backend, "set_layer_weights");
    const std::string call = fmt::format("set_layer_weights(layer {})", layer);
    LayerWeights w;
    w.A_log = capi::to_view(A_log, call, "A_log", {DType::kF32});
    w.dt_bias = capi::to_view(dt_bias, call, "dt_bias", {DType::kF32});
    w.conv_weight = capi::to_view(conv_weight, call, "conv_weight", {DType::kF32, DType::kBF16});
    w.conv_bias =
        capi::to_view(conv_bias, call, "conv_bias", {DType::kF32, DType::kBF16}, /*optional=*/true);
    b.set_layer_weights(layer, w);
  });
}

int kda_allocate_slot(kda_backend* backend, void* stream, int32_t* slot) {
  return guarded([&] {
    kda::KdaAttentionBackend& b = kda::capi::backend_of(backend, "allocate_slot");
    KDA_CHECK(slot != nullptr, "allocate_slot: slot is NULL");
    *slot = b.allocate_slot(static_cast<cudaStream_t>(stream));
  });
}

int kda_claim_slot(kda_backend* backend, int32_t slot, int32_t init, void* stream) {
  return guarded([&] {
    kda::KdaAttentionBackend& b = kda::capi::backend_of(backend, "claim_slot");
    KDA_CHECK(init == KDA_SLOT_ZERO || init == KDA_SLOT_KEEP_STATE,
              "claim_slot: init = {} unknown, expected KDA_SLOT_ZERO (0) or KDA_SLOT_KEEP_STATE "
              "(1)",
              init);
    b.claim_slot(slot, init == KDA_SLOT_ZERO ? kda::SlotInit::kZero : kda::SlotInit::kKeepState,
                 static_cast<cudaStream_t>(stream));
  });
}

int kda_release_slot(kda_backend* backend, int32_t slot) {
  return guarded([&] { kda::capi::backend_of(backend, "release_slot").release_slot(slot); });
}

int kda_copy_slot(kda_backend* backend, int32_t src, int32_t dst, void* stream) {
  return guarded([&] {
    kda::capi::backend_of(backend, "copy_slot")
        .copy_slot(src, dst, static_cast<cudaStream_t>(stream));
  });
}

int kda_prepare_shaped(kda_backend* backend, int32_t T, const int32_t* slots, int32_t B,
                       const int32_t* rows, const int32_t* lengths, const int32_t* offsets,
                       const int32_t* parents, void* stream) {
  return guarded([&] {
    kda::KdaAttentionBackend& b = kda::capi::backend_of(backend, "prepare");
    kda::BatchSpec batch;
    batch.T = T;
    batch.slots = kda::capi::host_array(slots, B, "prepare", "slots");
    if (rows != nullptr) {
      batch.rows = kda::capi::host_array(rows, B, "prepare", "rows");
    }
    KDA_CHECK(lengths == nullptr || parents == nullptr,
              "prepare: lengths (a ragged chain) and parents (a tree) were both given; a draft "
              "is one or the other");
    KDA_CHECK(offsets == nullptr || lengths != nullptr,
              "prepare: offsets were given without lengths (offsets describe a ragged chain)");
    if (lengths != nullptr) {
      batch.lengths = kda::capi::host_array(lengths, B, "prepare", "lengths");
    }
    if (offsets != nullptr) {
      KDA_CHECK(B < INT32_MAX, "prepare: B={} leaves no room for B + 1 offsets", B);
      batch.offsets = kda::capi::host_array(offsets, B + 1, "prepare", "offsets");
    }
    if (parents != nullptr) {
      // T first: parents has B*T entries, a count that means nothing for a T out of range.
      KDA_CHECK(T >= 1 && T <= b.pool().T_max(),
                "prepare: T = {} outside [1, {}] (--speculative-num-draft-tokens)", T,
                b.pool().T_max());
      KDA_CHECK(static_cast<int64_t>(B) * T <= INT32_MAX,
                "prepare: parents needs B*T entries, got B={} T={} (expected B*T < 2^31)", B, T);
      batch.parents = kda::capi::host_array(parents, B * T, "prepare", "parents");
    }
    b.prepare(batch, static_cast<cudaStream_t>(stream));
  });
}

int kda_prepare(kda_backend* backend, int32_t T, const int32_t* slots, int32_t B,
                const int32_t* rows, void* stream) {
  return kda_prepare_shaped(backend, T, slots, B, rows, nullptr, nullptr, nullptr, stream);
}

int kda_prepare_extend(kda_backend* backend, int32_t T, const int32_t* slots, int32_t B,
                       const int32_t* track_slots, const int32_t* track_steps, void* stream) {
  return guarded([&] {
    kda::KdaAttentionBackend& b = kda::capi::backend_of(backend, "prepare_extend");
    kda::BatchSpec batch;
    batch.T = T;
    batch.slots = kda::capi::host_array(slots, B, "prepare_extend", "slots");
    KDA_CHECK((track_slots == nullptr) == (track_steps == nullptr),
              "prepare_extend: track_slots and track_steps must be both given or both NULL");
    if (track_slots == nullptr) {
      b.prepare_extend(batch, static_cast<cudaStream_t>(stream));
      return;
    }
    kda::ExtendTrack track;
    track.slots = kda::capi::host_array(track_slots, B, "prepare_extend", "track_slots");
    track.steps = kda::capi::host_array(track_steps, B, "prepare_extend", "track_steps");
    b.prepare_extend(batch, track, static_cast<cudaStream_t>(stream));
  });
}

int kda_verify(kda_backend* backend, int layer, const DLTensor* mixed_qkv, const DLTensor* a,
               const DLTensor* b, const DLTensor* out, void* stream, kda_dispatch_info* info) {
  return guarded([&] {
    using namespace kda;
    KdaAttentionBackend& be = capi::backend_of(backend, "verify");
    const std::string call = fmt::format("verify(layer {})", layer);
    const VerifyInputs in = capi::to_inputs(call, mixed_qkv, a, b);
    const TensorView o = capi::to_view(out, call, "out", {DType::kBF16});
    const DispatchDecision d = be.verify(layer, in, o, static_cast<cudaStream_t>(stream));
    if (info != nullptr) {
      capi::fill_dispatch_info(d, *info);
    }
  });
}

int kda_extend(kda_backend* backend, int layer, const DLTensor* mixed_qkv, const DLTensor* a,
               const DLTensor* b, const DLTensor* out, void* stream) {
  return guarded([&] {
    using namespace kda;
    KdaAttentionBackend& be = capi::backend_of(backend, "extend");
    const std::string call = fmt::format("extend(layer {})", layer);
    const VerifyInputs in = capi::to_inputs(call, mixed_qkv, a, b);
    const TensorView o = capi::to_view(out, call, "out", {DType::kBF16});
    be.extend(layer, in, o, static_cast<cudaStream_t>(stream));
  });
}

int kda_commit(kda_backend* backend, const DLTensor* accepted_lengths, void* stream) {
  return guarded([&] {
    using namespace kda;
    KdaAttentionBackend& b = capi::backend_of(backend, "commit");
    const TensorView acc =
        capi::to_view(accepted_lengths, "commit", "accepted_lengths", {DType::kI32});
    b.commit(acc, static_cast<cudaStream_t>(stream));
  });
}

int kda_commit_tracked(kda_backend* backend, const DLTensor* accepted_lengths,
                       const DLTensor* track_slots, const DLTensor* track_steps, void* stream) {
  return guarded([&] {
    using namespace kda;
    KdaAttentionBackend& b = capi::backend_of(backend, "commit");
    const TensorView acc =
        capi::to_view(accepted_lengths, "commit", "accepted_lengths", {DType::kI32});
    CommitTrack track;
    track.slots = capi::to_view(track_slots, "commit", "track.slots", {DType::kI32});
    track.steps = capi::to_view(track_steps, "commit", "track.steps", {DType::kI32});
    b.commit(acc, track, static_cast<cudaStream_t>(stream));
  });
}

namespace {

// kda_commit_tree, and with `tracked` its prefix-cache tracks (track_slots, track_steps).
int commit_tree(kda_backend* backend, const DLTensor* accepted_lengths,
                const DLTensor* accepted_paths, const DLTensor* track_slots,
                const DLTensor* track_steps, bool tracked, void* stream) {
  return guarded([&] {
    using namespace kda;
    KdaAttentionBackend& b = capi::backend_of(backend, "commit_tree");
    const TensorView acc =
        capi::to_view(accepted_lengths, "commit_tree", "accepted_lengths", {DType::kI32});
    const TensorView paths =
        capi::to_view(accepted_paths, "commit_tree", "accepted_paths", {DType::kI32});
    if (!tracked) {
      b.commit_tree(acc, paths, static_cast<cudaStream_t>(stream));
      return;
    }
    CommitTrack track;
    track.slots = capi::to_view(track_slots, "commit_tree", "track.slots", {DType::kI32});
    track.steps = capi::to_view(track_steps, "commit_tree", "track.steps", {DType::kI32});
    b.commit_tree(acc, paths, track, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace

int kda_commit_tree(kda_backend* backend, const DLTensor* accepted_lengths,
                    const DLTensor* accepted_paths, void* stream) {
  return commit_tree(backend, accepted_lengths, accepted_paths, nullptr, nullptr, false, stream);
}

int kda_commit_tree_tracked(kda_backend* backend, const DLTensor* accepted_lengths,
                            const DLTensor* accepted_paths, const DLTensor* track_slots,
                            const DLTensor* track_steps, void* stream) {
  return commit_tree(backend, accepted_lengths, accepted_paths, track_slots, track_steps, true,
                     stream);
}

int kda_materialize(kda_backend* backend, const int32_t* slots, int32_t n, void* stream) {
  return guarded([&] {
    kda::KdaAttentionBackend& b = kda::capi::backend_of(backend, "materialize");
    b.materialize(kda::capi::host_array(slots, n, "materialize", "slots"),
                  static_cast<cudaStream_t>(stream));
  });
}

int kda_abort_round(kda_backend* backend, void* stream) {
  return guarded([&] {
    kda::capi::backend_of(backend, "abort_round").abort_round(static_cast<cudaStream_t>(stream));
  });
}

int kda_record_graph_verify_round(kda_backend* backend) {
  return guarded([&] {
    kda::capi::backend_of(backend, "record_graph_verify_round").record_graph_verify_round();
  });
}

int kda_check_device_errors(kda_backend* backend, void* stream) {
  return guarded([&] {
    kda::capi::backend_of(backend, "check_device_errors")
        .check_device_errors(static_cast<cudaStream_t>(stream));
  });
}

int kda_backend_info_get(const kda_backend* backend, kda_backend_info* info) {
  return guarded([&] {
    const kda::KdaAttentionBackend& b = kda::capi::backend_of(backend, "backend_info");
    KDA_CHECK(info != nullptr, "backend_info: info is NULL");
    const kda::KdaStatePool& pool = b.pool();
    kda_backend_info r{};
    r.num_layers = b.model().num_layers;
    r.num_slots = pool.num_slots();
    r.num_rows = pool.num_rows();
    r.max_draft_tokens = pool.T_max();
    r.ring_len = pool.ring_len();
    r.record_mode = pool.ring_mode() ? KDA_MODE_RING : KDA_MODE_SNAPSHOT;
    r.deferred_commit = b.deferred_commit() ? 1 : 0;
    r.device_type = b.device().is_cuda() ? kDLCUDA : kDLCPU;
    r.device_id = b.device().index;
    r.free_slots = pool.num_free_slots();
    r.batch_size = b.batch_size();
    r.tokens_per_request = b.tokens_per_request();
    const kda::DraftShape shape =
        b.round_kind() == kda::RoundKind::kVerify ? b.draft_shape() : kda::DraftShape::kDense;
    r.draft_shape = shape == kda::DraftShape::kRagged ? KDA_DRAFT_RAGGED
                    : shape == kda::DraftShape::kTree ? KDA_DRAFT_TREE
                                                      : KDA_DRAFT_DENSE;
    r.batch_tokens = b.batch_tokens();
    *info = r;
  });
}

int kda_round_state(kda_backend* backend, const char** state) {
  return guarded([&] {
    kda::capi::Handle& h = kda::capi::registry().find(backend, "round_state");
    KDA_CHECK(state != nullptr, "round_state: state is NULL");
    h.round_state = h.backend->round_state();
    *state = h.round_state.c_str();
  });
}

int kda_memory_report_get(const kda_backend* backend, kda_memory_report* out) {
  return guarded([&] {
    const kda::KdaAttentionBackend& b = kda::capi::backend_of(backend, "memory_report");
    KDA_CHECK(out != nullptr, "memory_report: out is NULL");
    const kda::PoolMemoryReport& r = b.memory_report();
    kda_memory_report m{};
    m.pool_bytes = r.total_bytes;
    m.conv_state_bytes = r.slots * r.conv_state_per_slot;
    m.ssm_state_bytes = r.slots * r.ssm_state_per_slot;
    m.ring_bytes = r.ring_mode ? r.slots * r.ring_per_slot : 0;
    m.conv_window_bytes = r.rows * r.conv_window_per_row;
    m.snapshot_bytes = r.ring_mode ? 0 : r.rows * r.snapshot_per_row;
    m.qkv_act_bytes = r.rows * r.qkv_act_per_row;
    m.workspace_bytes = b.workspace_bytes();
    m.total_bytes = m.pool_bytes + m.workspace_bytes;
    m.allocated_bytes = r.allocated_bytes + m.workspace_bytes;
    m.external_bytes = r.external_bytes;
    m.bytes_per_slot = r.bytes_per_slot;
    m.bytes_per_row = r.bytes_per_row;
    m.snapshot_mode_total_bytes = r.snapshot_mode_total_bytes;
    m.ring_mode_total_bytes = r.ring_mode_total_bytes;
    m.from_allocator = r.from_allocator ? 1 : 0;
    *out = m;
  });
}

int kda_op_verify(const kda_verify_op* op, void* stream, kda_dispatch_info* info) {
  return guarded([&] {
    using namespace kda;
    KDA_CHECK(op != nullptr, "ops.verify: op is NULL");
    const std::string call = "ops.verify";
    ops::VerifyArgs a;
    a.mixed_qkv = capi::to_view(op->mixed_qkv, call, "mixed_qkv", {DType::kBF16});
    a.a = capi::to_view(op->a, call, "a", {DType::kBF16});
    a.b = capi::to_view(op->b, call, "b", {DType::kBF16});
    a.out = capi::to_view(op->out, call, "out", {DType::kBF16});
    a.weights.A_log = capi::to_view(op->A_log, call, "A_log", {DType::kF32});
    a.weights.dt_bias = capi::to_view(op->dt_bias, call, "dt_bias", {DType::kF32});
    a.weights.conv_weight =
        capi::to_view(op->conv_weight, call, "conv_weight", {DType::kF32, DType::kBF16});
    a.weights.conv_bias =
        capi::to_view(op->conv_bias, call, "conv_bias", {DType::kF32, DType::kBF16}, true);
    a.state = capi::state_of(op->state, call, "state");
    a.batch = capi::batch_of(op->batch, call);
    KDA_CHECK(op->gate == KDA_GATE_STANDARD || op->gate == KDA_GATE_SAFE,
              "ops.verify: gate = {} unsupported, expected KDA_GATE_STANDARD (0) or KDA_GATE_SAFE "
              "(1)",
              op->gate);
    a.options.gate = op->gate == KDA_GATE_SAFE ? GateKind::kSafe : GateKind::kStandard;
    a.options.lower_bound = op->lower_bound;
    KDA_CHECK(op->fused_verify == 0 || op->fused_verify == 1,
              "ops.verify: fused_verify = {}, expected 0 or 1", op->fused_verify);
    KDA_CHECK(op->numerics >= KDA_NUMERICS_AUTO && op->numerics <= KDA_NUMERICS_FAST,
              "ops.verify: numerics = {} unsupported, expected KDA_NUMERICS_AUTO (0), "
              "KDA_NUMERICS_EXACT (1) or KDA_NUMERICS_FAST (2)",
              op->numerics);
    a.options.dispatch.fused_verify = op->fused_verify != 0;
    a.options.dispatch.fused_ring_max_batch = op->fused_ring_max_batch;
    a.options.dispatch.block_v = op->block_v;
    a.options.dispatch.numerics = static_cast<NumericsRequest>(op->numerics);
    KDA_CHECK(op->lazy == 0 || op->lazy == 1, "ops.verify: lazy = {}, expected 0 or 1", op->lazy);
    a.options.lazy = op->lazy != 0;
    KDA_CHECK(a.state.ssm_state.defined(), "ops.verify: state.ssm_state: NULL DLTensor");
    capi::OpsKernels& k = capi::ops_kernels(a.state.ssm_state.device());
    const std::lock_guard<std::mutex> lock(k.mu);
    const DispatchDecision d = ops::verify(*k.kernels, a, static_cast<cudaStream_t>(stream));
    if (info != nullptr) {
      capi::fill_dispatch_info(d, *info);
    }
  });
}

int kda_op_commit(const kda_commit_op* op, void* stream, kda_commit_info* info) {
  return guarded([&] {
    using namespace kda;
    KDA_CHECK(op != nullptr, "ops.commit: op is NULL");
    const std::string call = "ops.commit";
    ops::CommitArgs a;
    a.state = capi::state_of(op->state, call, "state");
    a.batch = capi::batch_of(op->batch, call);
    a.accepted_lengths =
        capi::to_view(op->accepted_lengths, call, "accepted_lengths", {DType::kI32}, true);
    a.accepted_paths =
        capi::to_view(op->accepted_paths, call, "accepted_paths", {DType::kI32}, true);
    a.track_slots = capi::to_view(op->track_slots, call, "track_slots", {DType::kI32}, true);
    a.track_steps = capi::to_view(op->track_steps, call, "track_steps", {DType::kI32}, true);
    a.checked_accepted =
        capi::to_view(op->checked_accepted, call, "checked_accepted", {DType::kI32}, true);
    a.error_flag = capi::to_view(op->error_flag, call, "error_flag", {DType::kI32}, true);
    KDA_CHECK(op->lazy == 0 || op->lazy == 1, "ops.commit: lazy = {}, expected 0 or 1", op->lazy);
    a.lazy = op->lazy != 0;
    a.lazy_fold_interval = op->lazy_fold_interval;
    KDA_CHECK(a.state.ssm_state.defined(), "ops.commit: state.ssm_state: NULL DLTensor");
    capi::OpsKernels& k = capi::ops_kernels(a.state.ssm_state.device());
    const std::lock_guard<std::mutex> lock(k.mu);
    const ops::CommitDecision d = ops::commit(*k.kernels, a, static_cast<cudaStream_t>(stream));
    if (info != nullptr) {
      info->deferred = d.kind == CommitKind::kDeferred || d.kind == CommitKind::kLazy ? 1 : 0;
      info->reason = d.reason;
    }
  });
}

int kda_op_materialize(const kda_state_tensors* state, const DLTensor* slots, void* stream) {
  return guarded([&] {
    using namespace kda;
    KDA_CHECK(state != nullptr, "ops.materialize: state is NULL");
    const std::string call = "ops.materialize";
    ops::MaterializeArgs a;
    a.state = capi::state_of(*state, call, "state");
    a.slots = capi::to_view(slots, call, "slots", {DType::kI32});
    // Pending counts without u records: the lazy write-back's state (its folds compute u).
    a.lazy = a.state.ring_pending.defined() && !a.state.ring_u.defined();
    KDA_CHECK(a.state.ssm_state.defined(), "ops.materialize: state.ssm_state: NULL DLTensor");
    capi::OpsKernels& k = capi::ops_kernels(a.state.ssm_state.device());
    const std::lock_guard<std::mutex> lock(k.mu);
    ops::materialize(*k.kernels, a, static_cast<cudaStream_t>(stream));
  });
}

int kda_pool_view(kda_backend* backend, const char* name, int layer, DLTensor* out) {
  return guarded([&] {
    using namespace kda;
    capi::Handle& h = capi::registry().find(backend, "pool_view");
    KDA_CHECK(name != nullptr, "pool_view: name is NULL");
    KDA_CHECK(out != nullptr, "pool_view: out is NULL");
    const TensorView v = capi::pool_tensor(h.backend->pool(), name, layer);
    auto& dims = h.dims[{name, layer}];
    for (int d = 0; d < v.ndim(); ++d) {
      dims[d] = v.size(d);
      dims[TensorView::kMaxDims + d] = v.stride(d);
    }
    DLTensor t{};
    t.data = v.data();
    t.device = v.device().is_cuda() ? DLDevice{kDLCUDA, v.device().index} : DLDevice{kDLCPU, 0};
    t.ndim = v.ndim();
    t.dtype = capi::to_dl(v.dtype());
    t.shape = dims.data();
    t.strides = dims.data() + TensorView::kMaxDims;
    t.byte_offset = 0;
    *out = t;
  });
}

}  // extern "C"
