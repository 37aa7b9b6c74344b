// batch_indices.h: the prepared batch's slot and row indices in backend-owned device memory.
//
// Layout: one int32 buffer on the backend's device: [4, capacity] with slots in row 0,
// scratch rows in row 1, extend's track slots and track steps in rows 2 and 3; then the draft
// shape (contract §8): token offsets [capacity + 1] and tree parents [capacity, T_max] (request
// n's at n * T of the upload's T). Entries at and beyond B (and the track / shape entries of an
// upload without them) hold -1. The addresses never change, so kernels captured in a CUDA graph
// keep reading the current batch after every upload.
//
// CUDA: upload() writes a pinned host staging buffer (cudaMallocHost) and enqueues one
// cudaMemcpyAsync on the caller's stream; before rewriting the staging it waits (event) until
// the previous upload's copy has read it. Host: a plain memcpy. Not capturable (prepare
// is the host-side step before a graph replay). Not thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/buffer.h"
#include "core/tensor_view.h"

namespace kda {

/// The draft shape of an upload (both null: a dense chain): offsets [B + 1], parents [B * T].
struct BatchIndexShape {
  const int32_t* offsets = nullptr;
  const int32_t* parents = nullptr;
  int T = 0;
};

class BatchIndices {
 public:
  using Shape = BatchIndexShape;

  /// Room for `capacity` requests of up to `max_tokens` draft tokens.
  BatchIndices(const Device& device, int capacity, int max_tokens);
  ~BatchIndices();
  BatchIndices(const BatchIndices&) = delete;
  BatchIndices& operator=(const BatchIndices&) = delete;

  /// Copies slots[0..B) and rows[0..B) (B <= capacity), and track_slots / track_steps [0..B)
  /// when given (null: -1), to the device buffer on `stream`.
  void upload(const int32_t* slots, const int32_t* rows, int B, cudaStream_t stream,
              const int32_t* track_slots = nullptr, const int32_t* track_steps = nullptr,
              const Shape& shape = {});

  /// [B] int32 views of the device buffer (valid until the next upload changes B).
  TensorView slots(int B) const { return device_view().select(0, 0).narrow(0, 0, B); }
  TensorView rows(int B) const { return device_view().select(0, 1).narrow(0, 0, B); }
  const int32_t* slots_data() const { return static_cast<const int32_t*>(device_.data()); }
  const int32_t* rows_data() const { return slots_data() + capacity_; }
  const int32_t* track_slots_data() const { return slots_data() + 2 * capacity_; }
  const int32_t* track_steps_data() const { return slots_data() + 3 * capacity_; }
  const int32_t* offsets_data() const { return slots_data() + kRows * capacity_; }
  const int32_t* parents_data() const { return offsets_data() + capacity_ + 1; }
  int capacity() const { return capacity_; }

 private:
  static constexpr int kRows = 4;
  TensorView device_view() const { return device_.view(DType::kI32, {kRows, capacity_}); }
  int64_t entries() const {
    return kRows * int64_t{capacity_} + capacity_ + 1 + int64_t{capacity_} * max_tokens_;
  }

  int capacity_;
  int max_tokens_;
  Buffer device_;                 // entries() int32 on the backend's device
  int32_t* staging_ = nullptr;    // CUDA: pinned entries(); host: unused
  cudaEvent_t copied_ = nullptr;  // CUDA: recorded after each upload's copy
  bool copy_pending_ = false;
};

}  // namespace kda
