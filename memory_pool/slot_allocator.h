// slot_allocator.h: bookkeeping of which state slots are in use (host only, no memory).
#pragma once

#include <cstdint>
#include <vector>

namespace kda {

/// A free list over slots [0, capacity). Allocation order is deterministic: lowest index
/// first at start, then most recently released first (LIFO keeps hot slots hot in L2).
/// Not thread-safe; the owning pool serialises access.
class SlotAllocator {
 public:
  explicit SlotAllocator(int capacity);

  /// Takes a free slot; throws kda::Error(kOutOfMemory) when all `capacity` are in use.
  int allocate();
  /// Takes `slot` itself (an engine that numbers its slots); throws kda::Error(kInvalidArgument)
  /// if it is out of [0, capacity) or already allocated. Nothing changes on a throw.
  void allocate_at(int slot);
  /// Returns `slot`; throws kda::Error(kInvalidArgument) if it is out of [0, capacity)
  /// ("foreign") or not allocated (double release). Nothing changes on a throw.
  void release(int slot);

  bool is_allocated(int slot) const;
  int capacity() const { return static_cast<int>(allocated_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_allocated() const { return capacity() - num_free(); }

 private:
  std::vector<int> free_;           // stack: back() is the next slot handed out
  std::vector<uint8_t> allocated_;  // per slot: 1 while in use
};

}  // namespace kda
