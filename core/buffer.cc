#include "core/buffer.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/cuda_check.h"

namespace kda {

namespace {
constexpr int64_t kHostAlign = 256;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

Buffer::Buffer(Device device, int64_t bytes) : bytes_(bytes), device_(device) {
  KDA_CHECK(bytes >= 0, "Buffer: negative size {}", bytes);
  if (bytes == 0) {
    return;
  }
  if (device.is_cuda()) {
    KDA_CUDA_CHECK(cudaSetDevice(device.index));
    const cudaError_t st = cudaMalloc(&data_, static_cast<size_t>(bytes));
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      KDA_THROW(ErrorCode::kOutOfMemory, "Buffer: cudaMalloc of {} bytes on {} failed", bytes,
                device_name(device));
    }
    KDA_CUDA_CHECK(st);
  } else {
    data_ = std::aligned_alloc(kHostAlign, static_cast<size_t>(round_up(bytes, kHostAlign)));
    KDA_CHECK_CODE(data_ != nullptr, ErrorCode::kOutOfMemory,
                   "Buffer: host allocation of {} bytes failed", bytes);
  }
}

Buffer::Buffer(Device device, int64_t bytes, std::shared_ptr<Allocator> allocator,
               cudaStream_t stream) {
  if (allocator == nullptr) {
    *this = Buffer(device, bytes);
    return;
  }
  KDA_CHECK(bytes >= 0, "Buffer: negative size {}", bytes);
  device_ = device;
  if (bytes == 0) {
    return;
  }
  void* p = allocator->allocate(bytes, device, stream);
  KDA_CHECK_CODE(p != nullptr, ErrorCode::kOutOfMemory,
                 "Buffer: the {} returned no memory for {} bytes on {}", allocator->name(), bytes,
                 device_name(device));
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(kAllocatorAlignment) != 0) {
    allocator->deallocate(p, bytes, device, stream);
    KDA_FAIL(
        "Buffer: the {} returned address {} for {} bytes on {}, expected one aligned to {} bytes",
        allocator->name(), p, bytes, device_name(device), kAllocatorAlignment);
  }
  if (device.is_cuda()) {
    // A stream-ordered allocator (PyTorch's) may hand out a block that work still queued on
    // `stream` uses; set-up copies into it (upload, cudaMemset) do not order on that stream.
    const cudaError_t st = cudaStreamSynchronize(stream);
    if (st != cudaSuccess) {
      allocator->deallocate(p, bytes, device, stream);
      KDA_CUDA_CHECK(st);
    }
  }
  data_ = p;
  bytes_ = bytes;
  allocator_ = std::move(allocator);
  stream_ = stream;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      allocator_(std::move(other.allocator_)),
      stream_(other.stream_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    allocator_ = std::move(other.allocator_);
    stream_ = other.stream_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (data_ == nullptr) {
    return;
  }
  if (allocator_ != nullptr) {
    allocator_->deallocate(data_, bytes_, device_, stream_);
    allocator_.reset();
  } else if (device_.is_cuda()) {
    cudaFree(data_);  // destructor: errors cannot be reported; the context may be gone
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

TensorView Buffer::view(DType dtype, std::initializer_list<int64_t> shape) const {
  TensorView v = TensorView::contiguous(data_, dtype, device_, shape);
  KDA_CHECK(v.numel() * dtype_size(dtype) <= bytes_,
            "Buffer::view: {} of {} needs {} bytes, buffer has {}", dtype_name(dtype),
            v.shape_str(), v.numel() * dtype_size(dtype), bytes_);
  return v;
}

void Buffer::upload(const void* src, int64_t bytes, int64_t offset) {
  KDA_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= bytes_,
            "Buffer::upload: [{}, {}) outside the buffer's {} bytes", offset, offset + bytes,
            bytes_);
  copy_bytes(static_cast<char*>(data_) + offset, device_, src, Device::host(), bytes);
}

void Buffer::download(void* dst, int64_t bytes, int64_t offset) const {
  KDA_CHECK(offset >= 0 && bytes >= 0 && offset + bytes <= bytes_,
            "Buffer::download: [{}, {}) outside the buffer's {} bytes", offset, offset + bytes,
            bytes_);
  copy_bytes(dst, Device::host(), static_cast<const char*>(data_) + offset, device_, bytes);
}

void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                int64_t bytes) {
  if (bytes == 0) {
    return;
  }
  if (!dst_device.is_cuda() && !src_device.is_cuda()) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  KDA_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault));
}

namespace {
// Walks every element of a strided view in row-major order, calling f(element offset, i).
template <typename F>
void for_each_offset(const TensorView& v, F&& f) {
  const int nd = v.ndim();
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) {
      off += idx[static_cast<size_t>(d)] * v.stride(d);
    }
    f(off, i);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < v.size(d)) {
        break;
      }
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}
}  // namespace

template <typename T>
std::vector<T> to_host_vector(const TensorView& v) {
  KDA_CHECK(v.dtype() == dtype_of<T>, "to_host_vector: view has dtype {}, asked for {}",
            dtype_name(v.dtype()), dtype_name(dtype_of<T>));
  std::vector<T> out(static_cast<size_t>(v.numel()));
  if (v.is_contiguous()) {
    copy_bytes(out.data(), Device::host(), v.data(), v.device(),
               v.numel() * static_cast<int64_t>(sizeof(T)));
    return out;
  }
  // Strided: copy the whole span, then gather on the host.
  const int64_t span = v.span_bytes();
  std::vector<char> raw(static_cast<size_t>(span));
  copy_bytes(raw.data(), Device::host(), v.data(), v.device(), span);
  const T* base = reinterpret_cast<const T*>(raw.data());
  for_each_offset(v, [&](int64_t off, int64_t i) { out[static_cast<size_t>(i)] = base[off]; });
  return out;
}

template <typename T>
void from_host_vector(const std::vector<T>& src, const TensorView& v) {
  KDA_CHECK(v.dtype() == dtype_of<T>, "from_host_vector: view has dtype {}, given {}",
            dtype_name(v.dtype()), dtype_name(dtype_of<T>));
  KDA_CHECK(static_cast<int64_t>(src.size()) == v.numel(),
            "from_host_vector: {} values for a view of {} elements", src.size(), v.numel());
  if (v.is_contiguous()) {
    copy_bytes(v.data(), v.device(), src.data(), Device::host(),
               v.numel() * static_cast<int64_t>(sizeof(T)));
    return;
  }
  const int64_t span = v.span_bytes();
  std::vector<char> raw(static_cast<size_t>(span));
  copy_bytes(raw.data(), Device::host(), v.data(), v.device(), span);  // keep the gaps
  T* base = reinterpret_cast<T*>(raw.data());
  for_each_offset(v, [&](int64_t off, int64_t i) { base[off] = src[static_cast<size_t>(i)]; });
  copy_bytes(v.data(), v.device(), raw.data(), Device::host(), span);
}

template std::vector<bf16_t> to_host_vector<bf16_t>(const TensorView&);
template std::vector<float> to_host_vector<float>(const TensorView&);
template std::vector<int32_t> to_host_vector<int32_t>(const TensorView&);
template void from_host_vector<bf16_t>(const std::vector<bf16_t>&, const TensorView&);
template void from_host_vector<float>(const std::vector<float>&, const TensorView&);
template void from_host_vector<int32_t>(const std::vector<int32_t>&, const TensorView&);

}  // namespace kda
