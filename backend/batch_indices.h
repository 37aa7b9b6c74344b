// batch_indices.h: the prepared batch's slot and row indices in backend-owned device memory.
//
// Layout: one buffer on the backend's device: int32 [4, capacity] with slots in row 0, scratch
// rows in row 1, extend's track slots and track steps in rows 2 and 3; then the draft shape
// (contract §8): token offsets [capacity + 1] and tree parents [capacity, T_max] (request n's at
// n * T of the upload's T); then the slot table: uint8 [num_slots], 1 for an allocated slot
// (CommitParams::slot_allocated: a commit track into a slot marked 0 is invalid). Entries at and
// beyond B (and the track / shape entries of an upload without them) hold -1. The addresses
// never change, so kernels captured in a CUDA graph keep reading the current batch after every
// upload.
//
// The slot table's host copy changes with set_slot_allocated (allocate_slot / release_slot,
// which have no stream to order a device write on); every upload carries it to the device, and
// flush_slot_table writes the slots changed since (a commit's tracks in a round during which
// slots were allocated or released). So the device table is the host's as of the last upload or
// flush, ordered on that call's stream.
//
// CUDA: upload() writes a pinned host staging buffer (cudaMallocHost) and enqueues one
// cudaMemcpyAsync on the caller's stream; before rewriting the staging it waits (event) until
// the previous upload's copy has read it. flush_slot_table enqueues a one-byte cudaMemsetAsync
// per changed slot (no host memory involved, no wait). Host: plain writes. upload is not
// capturable (prepare is the host-side step before a graph replay). Not thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

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

  /// Room for `capacity` requests of up to `max_tokens` draft tokens, and a table of
  /// `num_slots` slots (none allocated).
  BatchIndices(const Device& device, int capacity, int max_tokens, int num_slots);
  /// The same, the device buffer from `allocator` on `stream` (null: cudaMalloc / host memory).
  BatchIndices(const Device& device, int capacity, int max_tokens, int num_slots,
               std::shared_ptr<Allocator> allocator, cudaStream_t stream);
  ~BatchIndices();
  BatchIndices(const BatchIndices&) = delete;
  BatchIndices& operator=(const BatchIndices&) = delete;

  /// Copies slots[0..B) and rows[0..B) (B <= capacity), and track_slots / track_steps [0..B)
  /// when given (null: -1), and the slot table to the device buffer on `stream`.
  void upload(const int32_t* slots, const int32_t* rows, int B, cudaStream_t stream,
              const int32_t* track_slots = nullptr, const int32_t* track_steps = nullptr,
              const Shape& shape = {});

  /// Marks `slot` (in [0, num_slots)) allocated or free in the host table; the device table
  /// follows at the next upload or flush_slot_table.
  void set_slot_allocated(int slot, bool allocated);
  /// Whether the host table changed since the last upload or flush.
  bool slot_table_dirty() const { return !changed_slots_.empty(); }
  /// Writes the slots changed since the last upload or flush to the device table on `stream`
  /// (enqueue only: no allocation, no host synchronisation).
  void flush_slot_table(cudaStream_t stream);
  /// The device slot table, [num_slots] uint8 (CommitParams::slot_allocated).
  const uint8_t* slot_table_data() const {
    return static_cast<const uint8_t*>(device_.data()) + int_entries() * 4;
  }

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
  /// Bytes of the device buffer.
  int64_t device_bytes() const { return device_.bytes(); }

 private:
  static constexpr int kRows = 4;
  TensorView device_view() const { return device_.view(DType::kI32, {kRows, capacity_}); }
  // The int32 entries, then num_slots bytes of the slot table.
  int64_t int_entries() const {
    return kRows * int64_t{capacity_} + capacity_ + 1 + int64_t{capacity_} * max_tokens_;
  }
  int64_t bytes() const { return int_entries() * 4 + num_slots_; }
  uint8_t* device_slot_table() const {
    return static_cast<uint8_t*>(device_.data()) + int_entries() * 4;
  }

  int capacity_;
  int max_tokens_;
  int num_slots_;
  Buffer device_;                 // bytes() on the backend's device
  void* staging_ = nullptr;       // CUDA: pinned bytes(); host: unused
  cudaEvent_t copied_ = nullptr;  // CUDA: recorded after each upload's copy
  bool copy_pending_ = false;
  std::vector<uint8_t> slot_table_;     // host table: 1 = allocated
  std::vector<int32_t> changed_slots_;  // slots set since the last upload or flush
  std::vector<uint8_t> changed_;        // per slot: listed in changed_slots_
};

}  // namespace kda
