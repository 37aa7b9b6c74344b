// batch_indices.h: the prepared batch's slot and row indices in backend-owned device memory.
//
// Layout: one int32 buffer [4, capacity] on the backend's device: slots in row 0, scratch
// rows in row 1, extend's track slots and track steps in rows 2 and 3; entries at and beyond B
// (and the track rows of an upload without tracks) hold -1. The addresses never change, so kernels
// captured in a CUDA graph keep reading the current batch after every upload.
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

class BatchIndices {
 public:
  BatchIndices(const Device& device, int capacity);
  ~BatchIndices();
  BatchIndices(const BatchIndices&) = delete;
  BatchIndices& operator=(const BatchIndices&) = delete;

  /// Copies slots[0..B) and rows[0..B) (B <= capacity), and track_slots / track_steps [0..B)
  /// when given (null: -1), to the device buffer on `stream`.
  void upload(const int32_t* slots, const int32_t* rows, int B, cudaStream_t stream,
              const int32_t* track_slots = nullptr, const int32_t* track_steps = nullptr);

  /// [B] int32 views of the device buffer (valid until the next upload changes B).
  TensorView slots(int B) const { return device_view().select(0, 0).narrow(0, 0, B); }
  TensorView rows(int B) const { return device_view().select(0, 1).narrow(0, 0, B); }
  const int32_t* slots_data() const { return static_cast<const int32_t*>(device_.data()); }
  const int32_t* rows_data() const { return slots_data() + capacity_; }
  const int32_t* track_slots_data() const { return slots_data() + 2 * capacity_; }
  const int32_t* track_steps_data() const { return slots_data() + 3 * capacity_; }
  int capacity() const { return capacity_; }

 private:
  static constexpr int kRows = 4;
  TensorView device_view() const { return device_.view(DType::kI32, {kRows, capacity_}); }

  int capacity_;
  Buffer device_;                 // [kRows, capacity] int32 on the backend's device
  int32_t* staging_ = nullptr;    // CUDA: pinned [kRows, capacity]; host: unused
  cudaEvent_t copied_ = nullptr;  // CUDA: recorded after each upload's copy
  bool copy_pending_ = false;
};

}  // namespace kda
