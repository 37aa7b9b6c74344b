#include "memory_pool/kda_state_pool.h"

#include <cstring>
#include <initializer_list>
#include <utility>

#include "core/cuda_check.h"
#include "core/logging.h"

namespace kda {

namespace {

// Makes `device` current for CUDA runtime calls and restores the caller's device after.
class ScopedCudaDevice {
 public:
  explicit ScopedCudaDevice(const Device& device) {
    if (!device.is_cuda()) {
      return;
    }
    KDA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device.index) {
      KDA_CUDA_CHECK(cudaSetDevice(device.index));
      restore_ = true;
    }
  }
  ~ScopedCudaDevice() {
    if (restore_) {
      cudaSetDevice(previous_);  // destructor: nothing sensible to do on failure
    }
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

void zero_bytes(void* ptr, int64_t bytes, const Device& device, cudaStream_t stream) {
  if (bytes == 0) {
    return;
  }
  if (device.is_cuda()) {
    KDA_CUDA_CHECK(cudaMemsetAsync(ptr, 0, static_cast<size_t>(bytes), stream));
  } else {
    std::memset(ptr, 0, static_cast<size_t>(bytes));
  }
}

// Bytes of one packed slot of a [layers, S, inner...] view (dims 2.. packed; its slot pitch may
// be larger: an external tensor's padding is not ours to write).
int64_t slot_payload_bytes(const TensorView& all) {
  int64_t n = dtype_size(all.dtype());
  for (int d = 2; d < all.ndim(); ++d) {
    n *= all.size(d);
  }
  return n;
}

// Zeroes slot `slot` of a [layers, S, ...] view in every layer: `layers` runs of one packed
// slot, one layer pitch apart (one 2-D memset on CUDA).
void zero_slot_in_all_layers(const TensorView& all, int slot, cudaStream_t stream) {
  const int64_t esize = dtype_size(all.dtype());
  const int64_t layer_pitch = all.stride(0) * esize;
  const int64_t slot_bytes = slot_payload_bytes(all);
  char* first = static_cast<char*>(all.data()) + slot * all.stride(1) * esize;
  if (all.device().is_cuda()) {
    KDA_CUDA_CHECK(cudaMemset2DAsync(first, static_cast<size_t>(layer_pitch), 0,
                                     static_cast<size_t>(slot_bytes),
                                     static_cast<size_t>(all.size(0)), stream));
    return;
  }
  for (int64_t layer = 0; layer < all.size(0); ++layer) {
    std::memset(first + layer * layer_pitch, 0, static_cast<size_t>(slot_bytes));
  }
}

// Copies slot `src` of a [layers, S, ...] view onto slot `dst` in every layer (one 2-D copy on
// CUDA, enqueued on `stream`).
void copy_slot_in_all_layers(const TensorView& all, int src, int dst, cudaStream_t stream) {
  const int64_t esize = dtype_size(all.dtype());
  const int64_t layer_pitch = all.stride(0) * esize;
  const int64_t slot_bytes = slot_payload_bytes(all);
  char* base = static_cast<char*>(all.data());
  char* to = base + dst * all.stride(1) * esize;
  const char* from = base + src * all.stride(1) * esize;
  if (all.device().is_cuda()) {
    KDA_CUDA_CHECK(
        cudaMemcpy2DAsync(to, static_cast<size_t>(layer_pitch), from,
                          static_cast<size_t>(layer_pitch), static_cast<size_t>(slot_bytes),
                          static_cast<size_t>(all.size(0)), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  for (int64_t layer = 0; layer < all.size(0); ++layer) {
    std::memcpy(to + layer * layer_pitch, from + layer * layer_pitch,
                static_cast<size_t>(slot_bytes));
  }
}

}  // namespace

KdaStatePool::KdaStatePool(const PoolConfig& config) : KdaStatePool(config, PoolStorage{}) {}

KdaStatePool::KdaStatePool(const PoolConfig& config, const PoolStorage& storage)
    : config_(config), report_(compute_memory_report(config)), slots_(config.num_slots) {
  if (config.memory_budget_bytes > 0) {
    KDA_CHECK_CODE(
        report_.total_bytes <= config.memory_budget_bytes, ErrorCode::kOutOfMemory,
        "KDA state pool: {} mode needs {} bytes, over the memory budget of {} bytes ({} mode "
        "would need {} bytes)",
        config.ring_mode ? "ring" : "snapshot", report_.total_bytes, config.memory_budget_bytes,
        config.ring_mode ? "snapshot" : "ring",
        config.ring_mode ? report_.snapshot_mode_total_bytes : report_.ring_mode_total_bytes);
  }
  validate_external_tensors(config, storage.external);  // before anything is allocated
  const ScopedCudaDevice on_device(config.device);
  const int64_t layers = config.layers, S = config.num_slots, R = config.num_rows;
  const int64_t H = config.H, HV = config.HV, K = config.K, V = config.V;
  const int64_t T = config.T_max, L = config.ring_len, D = config.qkv_dim();
  const ExternalPoolTensors& ext = storage.external;

  buffers_.reserve(12);
  // The engine's tensor when given (used in place, not written), else a zeroed allocation.
  auto take = [&](const TensorView& external, const char* name, DType dtype,
                  std::initializer_list<int64_t> shape) {
    if (external.defined()) {
      TensorView v = external_pool_view(config, name, external);
      report_.external_bytes += v.numel() * dtype_size(dtype);
      return v;
    }
    int64_t numel = 1;
    for (int64_t e : shape) {
      numel *= e;  // cannot overflow: compute_memory_report checked every product
    }
    buffers_.emplace_back(config.device, numel * dtype_size(dtype), storage.allocator,
                          storage.stream);
    zero_bytes(buffers_.back().data(), buffers_.back().bytes(), config.device, storage.stream);
    report_.allocated_bytes += buffers_.back().bytes();
    return buffers_.back().view(dtype, shape);
  };
  conv_state_ = take(ext.conv_state, "conv_state", DType::kBF16, {layers, S, kPoolConvHistory, D});
  ssm_state_ = take(ext.ssm_state, "ssm_state", DType::kF32, {layers, S, HV, V, K});
  conv_window_ =
      take(ext.conv_window, "conv_window", DType::kBF16, {layers, R, T, kPoolConvHistory, D});
  qkv_act_ = take(ext.qkv_act, "qkv_act", DType::kBF16, {R * T, D});
  if (config.ring_mode) {
    ring_rawv_ = take(ext.ring_rawv, "ring_rawv", DType::kBF16, {layers, S, HV, L, V});
    ring_rawk_ = take(ext.ring_rawk, "ring_rawk", DType::kBF16, {layers, S, H, L, K});
    ring_g_ = take(ext.ring_g, "ring_g", DType::kF32, {layers, S, HV, L, K});
    ring_beta_ = take(ext.ring_beta, "ring_beta", DType::kF32, {layers, S, HV, L});
    ring_cursor_ = take(ext.ring_cursor, "ring_cursor", DType::kI32, {S});
    ring_pending_ = take(ext.ring_pending, "ring_pending", DType::kI32, {layers, S});
    if (config.deferred_commit && !config.lazy_commit) {
      ring_u_ = take(ext.ring_u, "ring_u", DType::kF32, {layers, S, HV, L, V});
    }
  } else {
    snapshots_ = take(ext.snapshots, "snapshots", DType::kF32, {layers, R, T, HV, V, K});
  }
  report_.from_allocator = storage.allocator != nullptr && report_.allocated_bytes > 0;
  if (config.device.is_cuda()) {
    // The memsets above must land before any engine stream touches the pool.
    KDA_CUDA_CHECK(cudaStreamSynchronize(storage.stream));
  }
  logger().info("{}", report_.to_string());
}

int KdaStatePool::allocate_slot(cudaStream_t stream) {
  const int slot = slots_.allocate();
  try {
    zero_slot(slot, /*state=*/true, stream);
  } catch (...) {
    slots_.release(slot);  // leave the free list as it was
    throw;
  }
  return slot;
}

void KdaStatePool::claim_slot(int slot, SlotInit init, cudaStream_t stream) {
  slots_.allocate_at(slot);
  try {
    zero_slot(slot, /*state=*/init == SlotInit::kZero, stream);
  } catch (...) {
    slots_.release(slot);
    throw;
  }
}

void KdaStatePool::release_slot(int slot) { slots_.release(slot); }

void KdaStatePool::copy_slot(int src, int dst, SlotCopy what, cudaStream_t stream) {
  for (const auto& [name, slot] : {std::pair<const char*, int>{"src", src}, {"dst", dst}}) {
    KDA_CHECK(slot >= 0 && slot < config_.num_slots && slots_.is_allocated(slot),
              "KdaStatePool::copy_slot: {} = {} is not an allocated slot in [0, {})", name, slot,
              config_.num_slots);
  }
  KDA_CHECK(src != dst, "KdaStatePool::copy_slot: src and dst are both {} (distinct slots)", src);
  KDA_CHECK(what == SlotCopy::kState || config_.ring_mode,
            "KdaStatePool::copy_slot: SlotCopy::kStateAndPending needs ring mode (the pool is in "
            "snapshot mode)");
  const ScopedCudaDevice on_device(config_.device);
  copy_slot_in_all_layers(conv_state_, src, dst, stream);
  copy_slot_in_all_layers(ssm_state_, src, dst, stream);
  if (!config_.ring_mode) {
    return;
  }
  if (what == SlotCopy::kState) {
    zero_slot_in_all_layers(ring_pending_, dst, stream);  // dst's own pending steps go
    return;
  }
  for (const TensorView* all :
       {&ring_rawv_, &ring_rawk_, &ring_g_, &ring_beta_, &ring_pending_, &ring_u_}) {
    if (all->defined()) {
      copy_slot_in_all_layers(*all, src, dst, stream);
    }
  }
  int32_t* cursor = static_cast<int32_t*>(ring_cursor_.data());
  if (config_.device.is_cuda()) {
    KDA_CUDA_CHECK(cudaMemcpyAsync(cursor + dst, cursor + src, sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, stream));
  } else {
    cursor[dst] = cursor[src];
  }
}

void KdaStatePool::zero_slot(int slot, bool state, cudaStream_t stream) {
  const ScopedCudaDevice on_device(config_.device);
  const TensorView* kept[] = {&conv_state_, &ssm_state_, &ring_rawv_, &ring_rawk_,
                              &ring_g_,     &ring_beta_, &ring_u_};
  for (const TensorView* all : kept) {
    if (state && all->defined()) {
      zero_slot_in_all_layers(*all, slot, stream);
    }
  }
  if (ring_pending_.defined()) {
    zero_slot_in_all_layers(ring_pending_, slot, stream);
  }
  if (ring_cursor_.defined()) {
    int32_t* cursor = static_cast<int32_t*>(ring_cursor_.data()) + slot;
    if (config_.device.is_cuda()) {
      KDA_CUDA_CHECK(cudaMemsetAsync(cursor, 0, sizeof(int32_t), stream));
    } else {
      *cursor = 0;
    }
  }
}

TensorView KdaStatePool::layer_view(const TensorView& all, int layer, const char* what) const {
  KDA_CHECK(layer >= 0 && layer < config_.layers, "KdaStatePool::{}: layer {} out of range [0, {})",
            what, layer, config_.layers);
  return all.defined() ? all.select(0, layer) : TensorView();
}

TensorView KdaStatePool::conv_state(int layer) const {
  return layer_view(conv_state_, layer, "conv_state");
}
TensorView KdaStatePool::ssm_state(int layer) const {
  return layer_view(ssm_state_, layer, "ssm_state");
}
TensorView KdaStatePool::conv_window(int layer) const {
  return layer_view(conv_window_, layer, "conv_window");
}
TensorView KdaStatePool::snapshots(int layer) const {
  return layer_view(snapshots_, layer, "snapshots");
}
TensorView KdaStatePool::ring_rawv(int layer) const {
  return layer_view(ring_rawv_, layer, "ring_rawv");
}
TensorView KdaStatePool::ring_rawk(int layer) const {
  return layer_view(ring_rawk_, layer, "ring_rawk");
}
TensorView KdaStatePool::ring_g(int layer) const { return layer_view(ring_g_, layer, "ring_g"); }
TensorView KdaStatePool::ring_beta(int layer) const {
  return layer_view(ring_beta_, layer, "ring_beta");
}
TensorView KdaStatePool::ring_pending(int layer) const {
  return layer_view(ring_pending_, layer, "ring_pending");
}
TensorView KdaStatePool::ring_u(int layer) const { return layer_view(ring_u_, layer, "ring_u"); }

}  // namespace kda
