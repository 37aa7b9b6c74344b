#include "backend/batch_indices.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/cuda_check.h"

namespace kda {

BatchIndices::BatchIndices(const Device& device, int capacity, int max_tokens, int num_slots)
    : BatchIndices(device, capacity, max_tokens, num_slots, nullptr, nullptr) {}

BatchIndices::BatchIndices(const Device& device, int capacity, int max_tokens, int num_slots,
                           std::shared_ptr<Allocator> allocator, cudaStream_t stream)
    : capacity_(capacity),
      max_tokens_(max_tokens),
      num_slots_(num_slots),
      device_(device,
              (kRows * int64_t{capacity} + capacity + 1 + int64_t{capacity} * max_tokens) * 4 +
                  num_slots,
              std::move(allocator), stream),
      slot_table_(static_cast<size_t>(std::max(num_slots, 0)), 0),
      changed_(static_cast<size_t>(std::max(num_slots, 0)), 0) {
  KDA_CHECK(capacity >= 1, "BatchIndices: capacity must be >= 1, got {}", capacity);
  KDA_CHECK(max_tokens >= 1, "BatchIndices: max_tokens must be >= 1, got {}", max_tokens);
  KDA_CHECK(num_slots >= 1, "BatchIndices: num_slots must be >= 1, got {}", num_slots);
  changed_slots_.reserve(static_cast<size_t>(num_slots));  // set_slot_allocated never allocates
  if (!device.is_cuda()) {
    std::fill_n(static_cast<int32_t*>(device_.data()), int_entries(), -1);
    std::fill_n(device_slot_table(), num_slots_, uint8_t{0});
    return;
  }
  KDA_CUDA_CHECK(cudaSetDevice(device.index));
  KDA_CUDA_CHECK(cudaMallocHost(&staging_, static_cast<size_t>(bytes())));
  std::fill_n(static_cast<int32_t*>(staging_), int_entries(), -1);
  std::fill_n(static_cast<uint8_t*>(staging_) + int_entries() * 4, num_slots_, uint8_t{0});
  device_.upload(staging_, bytes());
  const cudaError_t st = cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming);
  if (st != cudaSuccess) {
    cudaFreeHost(staging_);
    KDA_CUDA_CHECK(st);
  }
}

BatchIndices::~BatchIndices() {
  // Destructor: errors cannot be reported. Wait for an in-flight copy before freeing its source.
  if (copied_ != nullptr) {
    if (copy_pending_) {
      cudaEventSynchronize(copied_);
    }
    cudaEventDestroy(copied_);
  }
  if (staging_ != nullptr) {
    cudaFreeHost(staging_);
  }
}

void BatchIndices::upload(const int32_t* slots, const int32_t* rows, int B, cudaStream_t stream,
                          const int32_t* track_slots, const int32_t* track_steps,
                          const Shape& shape) {
  KDA_CHECK(B >= 0 && B <= capacity_, "BatchIndices::upload: B = {} outside [0, {}]", B, capacity_);
  KDA_CHECK(shape.parents == nullptr || (shape.T >= 1 && shape.T <= max_tokens_),
            "BatchIndices::upload: T = {} outside [1, {}]", shape.T, max_tokens_);
  void* base = staging_ != nullptr ? staging_ : device_.data();
  if (copy_pending_) {
    // The previous cudaMemcpyAsync may not have read the staging yet; normally long done.
    KDA_CUDA_CHECK(cudaEventSynchronize(copied_));
    copy_pending_ = false;
  }
  int32_t* dst = static_cast<int32_t*>(base);
  std::fill_n(dst, int_entries(), -1);
  std::copy_n(slots, B, dst);
  std::copy_n(rows, B, dst + capacity_);
  if (track_slots != nullptr && track_steps != nullptr) {
    std::copy_n(track_slots, B, dst + 2 * capacity_);
    std::copy_n(track_steps, B, dst + 3 * capacity_);
  }
  int32_t* const offsets = dst + kRows * capacity_;
  if (shape.offsets != nullptr) {
    std::copy_n(shape.offsets, B + 1, offsets);
  }
  if (shape.parents != nullptr) {
    std::copy_n(shape.parents, int64_t{B} * shape.T, offsets + capacity_ + 1);
  }
  std::copy(slot_table_.begin(), slot_table_.end(),
            static_cast<uint8_t*>(base) + int_entries() * 4);
  for (const int32_t s : changed_slots_) {
    changed_[static_cast<size_t>(s)] = 0;
  }
  changed_slots_.clear();
  if (staging_ == nullptr) {
    return;
  }
  KDA_CUDA_CHECK(cudaMemcpyAsync(device_.data(), staging_, static_cast<size_t>(bytes()),
                                 cudaMemcpyHostToDevice, stream));
  KDA_CUDA_CHECK(cudaEventRecord(copied_, stream));
  copy_pending_ = true;
}

void BatchIndices::set_slot_allocated(int slot, bool allocated) {
  KDA_CHECK(slot >= 0 && slot < num_slots_,
            "BatchIndices::set_slot_allocated: slot {} outside [0, {})", slot, num_slots_);
  slot_table_[static_cast<size_t>(slot)] = allocated ? 1 : 0;
  if (changed_[static_cast<size_t>(slot)] == 0) {
    changed_[static_cast<size_t>(slot)] = 1;
    changed_slots_.push_back(slot);
  }
}

void BatchIndices::flush_slot_table(cudaStream_t stream) {
  uint8_t* table = device_slot_table();
  // Written in order and cleared only once every write is enqueued: a failing call leaves the
  // remaining slots marked, for the next upload or flush.
  for (const int32_t s : changed_slots_) {
    const uint8_t value = slot_table_[static_cast<size_t>(s)];
    if (staging_ != nullptr) {
      KDA_CUDA_CHECK(cudaMemsetAsync(table + s, value, 1, stream));
    } else {
      table[s] = value;
    }
  }
  for (const int32_t s : changed_slots_) {
    changed_[static_cast<size_t>(s)] = 0;
  }
  changed_slots_.clear();
}

}  // namespace kda
