// |TD error| -> stored priority (|delta| + eps)^alpha, validated in one pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "format.hpp"
#include "task_pool.hpp"

namespace hetero_replay {

// Writes (td[i] + eps)^alpha to out[i] and returns max_i (td[i] + eps), the raw
// priority that new transitions inherit. Throws before writing anything if an
// entry is NaN, infinite or negative.
// Large batches split the powers across `threads`.
template <typename T>
double priorities_from_td(const double* td, int64_t n, double alpha, double eps, T* out, int threads = 1) {
  for (int64_t i = 0; i < n; ++i) {
    if (!(td[i] >= 0.0) || std::isinf(td[i])) {
      const std::string what = std::isnan(td[i]) ? "nan" : exact(td[i]);
      throw std::invalid_argument("TD error at position " + std::to_string(i) + " is " + what +
                                  "; pass finite magnitudes |TD error| >= 0");
    }
  }
  double max_raw = 0.0;
  for (int64_t i = 0; i < n; ++i) max_raw = td[i] > max_raw ? td[i] : max_raw;
  constexpr int64_t kChunk = 1024;
  parallel_for((n + kChunk - 1) / kChunk, threads, [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
      const double raw = td[i] + eps;
      // float32 trees take the power in float32: 2x faster, and the value is
      // stored as float32 anyway.
      if constexpr (sizeof(T) == 4) out[i] = powf(static_cast<float>(raw), static_cast<float>(alpha));
      else out[i] = std::pow(raw, alpha);
    }
  });
  return n > 0 ? max_raw + eps : 0.0;
}

}  // namespace hetero_replay
