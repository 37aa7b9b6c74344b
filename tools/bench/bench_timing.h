// bench_timing.h: one timed configuration's result (plain C++).
#pragma once

#include <vector>

namespace kda::bench {

/// Microseconds per call: median, min and max over the repetitions.
struct Timing {
  double median_us = 0.0, min_us = 0.0, max_us = 0.0;
  std::vector<double> rep_us;  ///< one value per repetition
  int calls_per_graph = 0;
};

}  // namespace kda::bench
