// tensor_view.h: a non-owning, strided view of host or CUDA memory.
//
// Ownership: a TensorView never owns or frees memory; whoever made the pointer (a
// kda::Buffer, the memory pool, the engine) keeps it alive for as long as views are used.
// Shapes and strides are in *elements* (int64_t); up to kMaxDims dims. Thread safety: a
// view is a value; copying it is free.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"

namespace kda {

enum class DeviceKind : uint8_t { kHost, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int index = 0;  ///< CUDA ordinal; 0 for host

  static Device host() { return Device{DeviceKind::kHost, 0}; }
  static Device cuda(int index = 0) { return Device{DeviceKind::kCuda, index}; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

/// "host" or "cuda:N".
std::string device_name(const Device& d);

class TensorView {
 public:
  static constexpr int kMaxDims = 6;

  TensorView() = default;
  /// A view with explicit strides (elements).
  TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides);
  /// A row-major contiguous view.
  static TensorView contiguous(void* data, DType dtype, Device device,
                               std::initializer_list<int64_t> shape);
  static TensorView contiguous(void* data, DType dtype, Device device, const int64_t* shape,
                               int ndim);
  /// A view with explicit strides (elements) from arrays of `ndim` entries (foreign tensors,
  /// e.g. DLPack); throws for ndim outside [0, kMaxDims] or a negative extent.
  static TensorView strided(void* data, DType dtype, Device device, const int64_t* shape,
                            const int64_t* strides, int ndim);

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  /// Typed pointer; throws if T does not match dtype().
  template <typename T>
  T* data_as() const {
    KDA_CHECK(dtype_of<T> == dtype_, "TensorView::data_as: view has dtype {}, asked for {}",
              dtype_name(dtype_), dtype_name(dtype_of<T>));
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int d) const { return shape_[check_dim(d)]; }
  int64_t stride(int d) const { return stride_[check_dim(d)]; }
  int64_t numel() const;
  /// Bytes from the first to one past the last addressable element (0 if empty).
  int64_t span_bytes() const;
  /// Row-major packed (strides of size-1 dims are ignored).
  bool is_contiguous() const;
  /// "[2, 3, 4]"
  std::string shape_str() const;
  /// "(12, 4, 1)"
  std::string strides_str() const;
  /// "bf16[2, 3, 4] strides (12, 4, 1) on cuda:0"
  std::string describe() const;

  /// The sub-view with dimension `d` fixed at `index` (one dim fewer).
  TensorView select(int d, int64_t index) const;
  /// The sub-view with dimension `d` restricted to [start, start + length).
  TensorView narrow(int d, int64_t start, int64_t length) const;

 private:
  int check_dim(int d) const;

  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_{};
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> stride_{};
};

// ---- Boundary validation helpers: each throws kda::Error naming `name`. ----

/// Shape must equal `want`; an entry of -1 accepts any extent.
void expect_shape(const TensorView& t, std::string_view name, std::initializer_list<int64_t> want);
void expect_dtype(const TensorView& t, std::string_view name, DType want);
void expect_device(const TensorView& t, std::string_view name, const Device& want);
/// Innermost dim has stride 1 (or extent <= 1).
void expect_inner_contiguous(const TensorView& t, std::string_view name);
void expect_contiguous(const TensorView& t, std::string_view name);
/// Data pointer aligned to `bytes`.
void expect_aligned(const TensorView& t, std::string_view name, int64_t bytes);
/// All-in-one: defined, dtype, device, shape (with -1 wildcards).
void expect_tensor(const TensorView& t, std::string_view name, DType dtype, const Device& device,
                   std::initializer_list<int64_t> shape);

}  // namespace kda
