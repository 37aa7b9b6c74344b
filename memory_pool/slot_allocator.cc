#include "memory_pool/slot_allocator.h"

#include <cstddef>

#include "core/error.h"

namespace kda {

SlotAllocator::SlotAllocator(int capacity) {
  KDA_CHECK(capacity >= 1, "SlotAllocator: capacity must be >= 1, got {}", capacity);
  allocated_.assign(static_cast<size_t>(capacity), 0);
  free_.reserve(static_cast<size_t>(capacity));
  for (int s = capacity - 1; s >= 0; --s) {
    free_.push_back(s);
  }
}

int SlotAllocator::allocate() {
  KDA_CHECK_CODE(!free_.empty(), ErrorCode::kOutOfMemory,
                 "allocate_slot: all {} state slots are in use (raise --max-running-requests or "
                 "release finished requests)",
                 capacity());
  const int slot = free_.back();
  free_.pop_back();
  allocated_[static_cast<size_t>(slot)] = 1;
  return slot;
}

void SlotAllocator::allocate_at(int slot) {
  KDA_CHECK(slot >= 0 && slot < capacity(),
            "claim_slot: slot {} is not a slot of this pool (expected in [0, {}))", slot,
            capacity());
  KDA_CHECK(allocated_[static_cast<size_t>(slot)] == 0,
            "claim_slot: slot {} is already allocated (release it first)", slot);
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i] == slot) {
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));  // keeps the others' order
      break;
    }
  }
  allocated_[static_cast<size_t>(slot)] = 1;
}

void SlotAllocator::release(int slot) {
  KDA_CHECK(slot >= 0 && slot < capacity(),
            "release_slot: slot {} is not a slot of this pool (expected in [0, {}))", slot,
            capacity());
  KDA_CHECK(allocated_[static_cast<size_t>(slot)] != 0,
            "release_slot: slot {} is not allocated (double release?)", slot);
  allocated_[static_cast<size_t>(slot)] = 0;
  free_.push_back(slot);
}

bool SlotAllocator::is_allocated(int slot) const {
  return slot >= 0 && slot < capacity() && allocated_[static_cast<size_t>(slot)] != 0;
}

}  // namespace kda
