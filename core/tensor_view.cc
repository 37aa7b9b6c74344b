#include "core/tensor_view.h"

#include <fmt/format.h>

#include <cstdint>

namespace kda {

std::string device_name(const Device& d) {
  return d.kind == DeviceKind::kHost ? std::string("host") : fmt::format("cuda:{}", d.index);
}

TensorView::TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides)
    : data_(data), dtype_(dtype), device_(device) {
  KDA_CHECK(shape.size() == strides.size(), "TensorView: shape has {} dims but strides has {}",
            shape.size(), strides.size());
  KDA_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "TensorView: {} dims, at most {}",
            shape.size(), kMaxDims);
  ndim_ = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    KDA_CHECK(s >= 0, "TensorView: negative extent {} in dim {}", s, i);
    shape_[i++] = s;
  }
  i = 0;
  for (int64_t s : strides) {
    stride_[i++] = s;
  }
}

TensorView TensorView::contiguous(void* data, DType dtype, Device device,
                                  std::initializer_list<int64_t> shape) {
  return contiguous(data, dtype, device, shape.begin(), static_cast<int>(shape.size()));
}

TensorView TensorView::contiguous(void* data, DType dtype, Device device, const int64_t* shape,
                                  int ndim) {
  KDA_CHECK(ndim >= 0 && ndim <= kMaxDims, "TensorView: {} dims, at most {}", ndim, kMaxDims);
  int64_t strides[kMaxDims] = {};
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strided(data, dtype, device, shape, strides, ndim);
}

TensorView TensorView::strided(void* data, DType dtype, Device device, const int64_t* shape,
                               const int64_t* strides, int ndim) {
  KDA_CHECK(ndim >= 0 && ndim <= kMaxDims, "TensorView: {} dims, at most {}", ndim, kMaxDims);
  TensorView v;
  v.data_ = data;
  v.dtype_ = dtype;
  v.device_ = device;
  v.ndim_ = ndim;
  for (int d = 0; d < ndim; ++d) {
    KDA_CHECK(shape[d] >= 0, "TensorView: negative extent {} in dim {}", shape[d], d);
    v.shape_[d] = shape[d];
    v.stride_[d] = strides[d];
  }
  return v;
}

int TensorView::check_dim(int d) const {
  KDA_CHECK(d >= 0 && d < ndim_, "TensorView: dim {} out of range for a {}-d view", d, ndim_);
  return d;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) {
    n *= shape_[d];
  }
  return n;
}

int64_t TensorView::span_bytes() const {
  if (numel() == 0) {
    return 0;
  }
  int64_t last = 0;
  for (int d = 0; d < ndim_; ++d) {
    last += (shape_[d] - 1) * stride_[d];
  }
  return (last + 1) * dtype_size(dtype_);
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && stride_[d] != expect) {
      return false;
    }
    expect *= shape_[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (int d = 0; d < ndim_; ++d) {
    s += fmt::format(d ? ", {}" : "{}", shape_[d]);
  }
  return s + "]";
}

std::string TensorView::strides_str() const {
  std::string s = "(";
  for (int d = 0; d < ndim_; ++d) {
    s += fmt::format(d ? ", {}" : "{}", stride_[d]);
  }
  return s + ")";
}

std::string TensorView::describe() const {
  return fmt::format("{}{} strides {} on {}", dtype_name(dtype_), shape_str(), strides_str(),
                     device_name(device_));
}

TensorView TensorView::select(int d, int64_t index) const {
  check_dim(d);
  KDA_CHECK(index >= 0 && index < shape_[d],
            "TensorView::select: index {} out of [0, {}) in dim {}", index, shape_[d], d);
  TensorView v = *this;
  v.data_ = static_cast<char*>(data_) + index * stride_[d] * dtype_size(dtype_);
  for (int i = d; i + 1 < ndim_; ++i) {
    v.shape_[i] = shape_[i + 1];
    v.stride_[i] = stride_[i + 1];
  }
  v.ndim_ = ndim_ - 1;
  v.shape_[v.ndim_] = 0;
  v.stride_[v.ndim_] = 0;
  return v;
}

TensorView TensorView::narrow(int d, int64_t start, int64_t length) const {
  check_dim(d);
  KDA_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
            "TensorView::narrow: [{}, {}) out of [0, {}) in dim {}", start, start + length,
            shape_[d], d);
  TensorView v = *this;
  v.data_ = static_cast<char*>(data_) + start * stride_[d] * dtype_size(dtype_);
  v.shape_[d] = length;
  return v;
}

namespace {
std::string shape_list(std::initializer_list<int64_t> want) {
  std::string s = "[";
  bool first = true;
  for (int64_t w : want) {
    s += first ? "" : ", ";
    s += w < 0 ? std::string("*") : std::to_string(w);
    first = false;
  }
  return s + "]";
}
}  // namespace

void expect_shape(const TensorView& t, std::string_view name, std::initializer_list<int64_t> want) {
  bool ok = t.ndim() == static_cast<int>(want.size());
  int d = 0;
  for (int64_t w : want) {
    if (!ok) {
      break;
    }
    ok = w < 0 || t.size(d) == w;
    ++d;
  }
  KDA_CHECK(ok, "{}: expected shape {}, got {}", name, shape_list(want), t.shape_str());
}

void expect_dtype(const TensorView& t, std::string_view name, DType want) {
  KDA_CHECK(t.dtype() == want, "{}: expected dtype {}, got {}", name, dtype_name(want),
            dtype_name(t.dtype()));
}

void expect_device(const TensorView& t, std::string_view name, const Device& want) {
  KDA_CHECK(t.device() == want, "{}: expected memory on {}, got {}", name, device_name(want),
            device_name(t.device()));
}

void expect_inner_contiguous(const TensorView& t, std::string_view name) {
  KDA_CHECK(t.ndim() > 0 && (t.size(t.ndim() - 1) <= 1 || t.stride(t.ndim() - 1) == 1),
            "{}: expected the innermost dim contiguous (stride 1), got strides {}", name,
            t.strides_str());
}

void expect_contiguous(const TensorView& t, std::string_view name) {
  KDA_CHECK(t.is_contiguous(),
            "{}: expected a contiguous (row-major packed) tensor, got {} strides {}", name,
            t.shape_str(), t.strides_str());
}

void expect_aligned(const TensorView& t, std::string_view name, int64_t bytes) {
  KDA_CHECK(reinterpret_cast<uintptr_t>(t.data()) % static_cast<uintptr_t>(bytes) == 0,
            "{}: expected data aligned to {} bytes, got address {}", name, bytes, t.data());
}

void expect_tensor(const TensorView& t, std::string_view name, DType dtype, const Device& device,
                   std::initializer_list<int64_t> shape) {
  KDA_CHECK(t.defined(), "{}: expected a tensor, got none (null data)", name);
  expect_dtype(t, name, dtype);
  expect_device(t, name, device);
  expect_shape(t, name, shape);
}

}  // namespace kda
