// policy_table.h: what the auto tables' policies (commit_policy, numerics_policy, lazy_policy)
// share: a card's table serves the devices nearest to it in peak memory bandwidth, and a shape's
// row is the matching row of the largest measured batch not above the engine's.
#pragma once

#include <cmath>
#include <cstddef>

namespace kda::detail {

/// The card of `cards` (each with a `memory_gbps`) nearest by ratio to `memory_gbps`; <= 0 or
/// NaN (unknown): the first. Ties keep the earlier card.
template <typename Card, size_t N>
const Card& nearest_card(const Card (&cards)[N], double memory_gbps) noexcept {
  const Card* best = &cards[0];
  if (!(memory_gbps > 0.0)) {
    return *best;
  }
  const auto distance = [memory_gbps](const Card& c) {
    return std::fabs(std::log(memory_gbps / c.memory_gbps));
  };
  for (const Card& c : cards) {
    if (distance(c) < distance(*best)) {
      best = &c;
    }
  }
  return *best;
}

/// Of `card`'s rows (each with a `B`) for which `matches(row)` holds, the one with the largest
/// B <= max_batch; null when there is none.
template <typename Card, typename Matches>
auto largest_batch_row(const Card& card, int max_batch, Matches matches) noexcept
    -> decltype(card.rows) {
  decltype(card.rows) best = nullptr;
  for (size_t i = 0; i < card.count; ++i) {
    const auto& r = card.rows[i];
    if (r.B <= max_batch && matches(r) && (best == nullptr || r.B > best->B)) {
      best = &r;
    }
  }
  return best;
}

}  // namespace kda::detail
