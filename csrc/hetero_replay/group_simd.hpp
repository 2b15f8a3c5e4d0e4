// SSE2 versions of the per-group reductions the CPU tree runs on every update.
//
// They return exactly what the scalar definitions in descent.hpp return (the
// NumPy reference and the tests check this): a minimum is exact in any order,
// and a float32 group's float64 sum is exact in any order when its positive
// values lie within a factor 2^24 of each other (then every partial sum fits
// in 53 bits), so the vector sum is used only then; otherwise the sequential
// definition runs.
#pragma once

#include <cstdint>

#include "descent.hpp"

namespace hetero_replay {

// Sum (float64) and positive minimum of K float32 leaves.
template <int K>
inline double leaf_group_sum_min(const float* c, float* min_out) {
#ifdef HR_SSE2
  if constexpr (K >= 4) {
    const __m128 zero = _mm_setzero_ps(), inf = _mm_set1_ps(INFINITY);
    __m128 mn = inf, mx = zero;
    __m128d s0 = _mm_setzero_pd(), s1 = _mm_setzero_pd();
    for (int k = 0; k < K; k += 4) {
      const __m128 v = _mm_loadu_ps(c + k);
      const __m128 positive = _mm_cmpgt_ps(v, zero);
      mn = _mm_min_ps(mn, _mm_or_ps(_mm_and_ps(positive, v), _mm_andnot_ps(positive, inf)));
      mx = _mm_max_ps(mx, v);
      s0 = _mm_add_pd(s0, _mm_cvtps_pd(v));
      s1 = _mm_add_pd(s1, _mm_cvtps_pd(_mm_movehl_ps(v, v)));
    }
    mn = _mm_min_ps(mn, _mm_movehl_ps(mn, mn));
    mn = _mm_min_ss(mn, _mm_shuffle_ps(mn, mn, 1));
    mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
    mx = _mm_max_ss(mx, _mm_shuffle_ps(mx, mx, 1));
    const float lo = _mm_cvtss_f32(mn), hi = _mm_cvtss_f32(mx);
    *min_out = lo;
    if (hi <= lo * 16777216.0f) {  // exact in any order (all-zero: lo = inf, sum 0)
      s0 = _mm_add_pd(s0, s1);
      return _mm_cvtsd_f64(_mm_add_sd(s0, _mm_unpackhi_pd(s0, s0)));
    }
    double prefix[K];
    group_prefix<float, K>(c, prefix);
    return prefix[K - 1];
  }
#endif
  *min_out = group_min<float, K>(c, true);
  double prefix[K];
  group_prefix<float, K>(c, prefix);
  return prefix[K - 1];
}

// Minimum of K internal minima (already positive or +inf).
template <typename T, int K>
inline T inner_group_min(const T* c) {
#ifdef HR_SSE2
  if constexpr (sizeof(T) == 4 && K >= 4) {
    __m128 mn = _mm_loadu_ps(c);
    for (int k = 4; k < K; k += 4) mn = _mm_min_ps(mn, _mm_loadu_ps(c + k));
    mn = _mm_min_ps(mn, _mm_movehl_ps(mn, mn));
    mn = _mm_min_ss(mn, _mm_shuffle_ps(mn, mn, 1));
    return _mm_cvtss_f32(mn);
  }
#endif
  return group_min<T, K>(c, false);
}

}  // namespace hetero_replay
