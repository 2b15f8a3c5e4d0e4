// Per-item work of the K-ary sum tree, shared by every build.
//
// The C++ (CPU) backend and the CUDA kernels both call these functions, so the
// CPU tests exercise exactly the arithmetic that runs on the GPU. Nothing here
// allocates, throws or touches the host: plain arithmetic on raw pointers.
//
// Numerical contract (the NumPy reference backend follows it to the bit):
//   * the prefix sums of a sibling group are float64 sums taken left to right;
//     a parent's value is the last one, rounded once to the tree's value type.
//     Parents are recomputed from their children on every update, never
//     adjusted by deltas, so rounding error never accumulates;
//   * a child "has mass" when its prefix sum exceeds the one before it; a
//     descent picks the first child whose prefix sum exceeds the remaining
//     mass (so never a child without mass) and carries the remainder in
//     float64. Where rounding leaves the mass at or past a group's end, it
//     takes the last child with mass.
//   * internal levels keep each group's prefix sums (float64) next to the node
//     values, so a descent through them is a vector compare, no scan; the leaf
//     level is scanned on the fly.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HR_HD __host__ __device__ __forceinline__
#else
#define HR_HD inline
#endif

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#define HR_SSE2 1
#endif

namespace hetero_replay {

constexpr int kMaxLevels = 40;

// One tree as raw pointers. Level 0 holds the leaves; level `num_levels - 1`
// is the single top sibling group. `prefix[l]` (1 <= l < num_levels) holds,
// for every sibling group of level l, the float64 inclusive prefix sums of its
// node values.
template <typename T>
struct TreeView {
  const T* leaves;
  const double* prefix[kMaxLevels];
  int num_levels;
};

// Number of k in [0, K) with prefix[k] <= mass.
template <int K>
HR_HD int count_at_or_below(const double* prefix, double mass) {
#ifdef HR_SSE2
  if constexpr (K >= 4) {  // two independent accumulators of 64-bit -1/0 masks
    const __m128d m = _mm_set1_pd(mass);
    __m128i a = _mm_setzero_si128(), b = _mm_setzero_si128();
    for (int k = 0; k < K; k += 4) {
      a = _mm_sub_epi64(a, _mm_castpd_si128(_mm_cmple_pd(_mm_loadu_pd(prefix + k), m)));
      b = _mm_sub_epi64(b, _mm_castpd_si128(_mm_cmple_pd(_mm_loadu_pd(prefix + k + 2), m)));
    }
    a = _mm_add_epi64(a, b);
    return static_cast<int>(_mm_cvtsi128_si64(a) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(a, a)));
  }
#endif
  int j = 0;
  for (int k = 0; k < K; ++k) j += (prefix[k] <= mass) ? 1 : 0;
  return j;
}

// Chooses the child of a sibling group, given the group's prefix sums, that
// holds `mass`; leaves in `mass` the remainder relative to that child.
template <int K>
HR_HD int choose_in_prefix(const double* prefix, double& mass) {
  int j = count_at_or_below<K>(prefix, mass);
  if (j == K) {  // at or past the end (rounding): the last child with mass
    j = K - 1;
    while (j > 0 && !(prefix[j] > prefix[j - 1])) --j;
    mass = prefix[j] - (j > 0 ? prefix[j - 1] : 0.0);
    return j;
  }
  mass -= (j > 0) ? prefix[j - 1] : 0.0;
  if (mass < 0.0) mass = 0.0;
  return j;
}

template <typename T, int K>
HR_HD void group_prefix(const T* c, double* prefix) {
  double s = 0.0;
  for (int k = 0; k < K; ++k) {
    s += static_cast<double>(c[k]);
    prefix[k] = s;
  }
}

// The same choice made from the node values themselves: the prefix sums are
// taken on the fly (same order, same bits), counting as they grow, so nothing
// goes through memory.
template <typename T, int K>
HR_HD int choose_child(const T* c, double& mass) {
  double s = 0.0, below = 0.0;
  int j = 0;
  for (int k = 0; k < K; ++k) {
    s += static_cast<double>(c[k]);
    const bool le = s <= mass;
    j += le ? 1 : 0;
    below = le ? s : below;  // prefix sums never decrease: the last one <= mass
  }
  if (j == K) {  // at or past the end (rounding): the rare path takes the prefix sums
    double prefix[K];
    group_prefix<T, K>(c, prefix);
    return choose_in_prefix<K>(prefix, mass);
  }
  mass -= below;
  if (mass < 0.0) mass = 0.0;
  return j;
}

// One full descent from the top group to a leaf. Returns the leaf index.
template <typename T, int K>
HR_HD int64_t descend(const TreeView<T>& tree, double mass) {
  int64_t node = 0;
  for (int l = tree.num_levels - 1; l >= 1; --l) {
    const int64_t base = node * K;
    node = base + choose_in_prefix<K>(tree.prefix[l] + base, mass);
  }
  const int64_t base = node * K;
  return base + choose_child<T, K>(tree.leaves + base, mass);
}

// Mass of draw `i` of `n` from a uniform `u` in [0, 1): stratified draws take
// one point in each of n equal slices of the total mass.
HR_HD double draw_mass(int64_t i, int64_t n, double u, double total, bool stratified) {
  return stratified ? (static_cast<double>(i) + u) * (total / static_cast<double>(n)) : u * total;
}

// The IS weight at `beta` of a weight at beta 1 (ratio = p_min / p_i, float32): the power in float32.
HR_HD float raised_ratio(float ratio, double beta) {
  if (beta == 0.0) return 1.0f;
  if (beta == 1.0) return ratio;
  return powf(ratio, static_cast<float>(beta));
}

// Importance-sampling weight normalised by the largest weight in the buffer:
// (N P(i))^-beta / max_j (N P(j))^-beta = (p_min / p_i)^beta.
// The ratio is taken in float64, the power in float32 (the weight's type).
template <typename T>
HR_HD float is_weight(T priority, double min_priority, double beta) {
  return raised_ratio(static_cast<float>(min_priority / static_cast<double>(priority)), beta);
}

// Smallest positive value of a group; zeros cannot be sampled and do not
// count, so an all-zero group gives +inf. Internal minima are already
// positive-or-inf.
template <typename T, int K>
HR_HD T group_min(const T* c, bool children_are_leaves) {
  T m = static_cast<T>(INFINITY);
  for (int k = 0; k < K; ++k) {
    const T v = (children_are_leaves && !(c[k] > T(0))) ? static_cast<T>(INFINITY) : c[k];
    m = v < m ? v : m;
  }
  return m;
}

}  // namespace hetero_replay
