#include "backend/batch_indices.h"

#include <algorithm>
#include <cstring>

#include "core/cuda_check.h"

namespace kda {

BatchIndices::BatchIndices(const Device& device, int capacity, int max_tokens)
    : capacity_(capacity),
      max_tokens_(max_tokens),
      device_(device,
              (kRows * int64_t{capacity} + capacity + 1 + int64_t{capacity} * max_tokens) * 4) {
  KDA_CHECK(capacity >= 1, "BatchIndices: capacity must be >= 1, got {}", capacity);
  KDA_CHECK(max_tokens >= 1, "BatchIndices: max_tokens must be >= 1, got {}", max_tokens);
  if (!device.is_cuda()) {
    std::fill_n(static_cast<int32_t*>(device_.data()), entries(), -1);
    return;
  }
  KDA_CUDA_CHECK(cudaSetDevice(device.index));
  void* pinned = nullptr;
  KDA_CUDA_CHECK(cudaMallocHost(&pinned, static_cast<size_t>(entries()) * 4));
  staging_ = static_cast<int32_t*>(pinned);
  std::fill_n(staging_, entries(), -1);
  device_.upload(staging_, device_.bytes());
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
  int32_t* dst = staging_ != nullptr ? staging_ : static_cast<int32_t*>(device_.data());
  if (copy_pending_) {
    // The previous cudaMemcpyAsync may not have read the staging yet; normally long done.
    KDA_CUDA_CHECK(cudaEventSynchronize(copied_));
    copy_pending_ = false;
  }
  std::fill_n(dst, entries(), -1);
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
  if (staging_ == nullptr) {
    return;
  }
  KDA_CUDA_CHECK(cudaMemcpyAsync(device_.data(), staging_, static_cast<size_t>(device_.bytes()),
                                 cudaMemcpyHostToDevice, stream));
  KDA_CUDA_CHECK(cudaEventRecord(copied_, stream));
  copy_pending_ = true;
}

}  // namespace kda
