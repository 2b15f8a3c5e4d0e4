// Per-item work of the batch kernels (CUDA, csrc/cuda/*.cu) that descent.hpp
// does not already hold: validating an update entry, writing a leaf (last
// write wins), recomputing a parent, refreshing the root, sampling and finding
// one item, copying one word of a gathered row.
//
// Each function is what one CUDA thread does for one item. The __global__
// wrappers in csrc/cuda/ only compute the item index, skip work after a
// failed validation and do the atomics; the CPU build runs the same functions
// in plain loops (csrc/kernel_items_host.cpp), which is how the tests check on
// the CPU, to the bit, the arithmetic that runs on the GPU.
//
// An update runs as a sequence of launches, each over the batch:
//   1. check:   validate entry i, write its sort key leaf * n + i (and, from
//               TD errors, its priority);
//   2. sort the keys (CuPy / NumPy): runs of one leaf become contiguous, in
//               batch order, and so do runs of one parent at every level;
//   3. write:   the last item of each leaf's run writes the leaf;
//   4. refresh: per level, the first item of each parent's run recomputes that
//               parent from its children (written by the previous launch);
//   5. root:    one thread refreshes the top group, the total and the minimum.
// No two threads write the same node, nothing is accumulated with atomics,
// and the result does not depend on the order threads run in.
#pragma once

#include "descent.hpp"

namespace hetero_replay {

// Words of an update's status array (uint64, zeroed before the update).
// A bad entry at position i records n - i with an atomic max, so the word
// ends as n - (first bad position), or 0 if there is none.
constexpr int kStatusBadIndex = 0;
constexpr int kStatusBadValue = 1;
constexpr int kStatusMaxRaw = 2;  // bits of max(td + eps); non-negative doubles order like their bits
constexpr int kStatusTotal = 3;   // bits of the total (float64)
constexpr int kStatusMin = 4;     // bits of the positive minimum (as float64)
constexpr int kStatusWords = 5;

// Flags returned by the check functions.
constexpr int kBadIndex = 1;
constexpr int kBadValue = 2;

HR_HD uint64_t double_bits(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t b;
  __builtin_memcpy(&b, &x, sizeof b);
  return b;
#endif
}

// Finite and >= 0 (NaN fails both comparisons).
template <typename T>
HR_HD bool valid_priority(T v) {
  return v >= T(0) && v < static_cast<T>(INFINITY);
}

// Entry i of `update(idx, values)`: its flags and its sort key. A value must
// also be at most `max_leaf`, so the tree's sums stay finite.
template <typename T>
HR_HD int check_priority_item(int64_t i, int64_t n, const int64_t* idx, const T* values, int64_t limit,
                              double max_leaf, int64_t* keys) {
  const bool index_ok = idx[i] >= 0 && idx[i] < limit;
  keys[i] = index_ok ? idx[i] * n + i : i;  // a bad entry's key is never used
  const bool value_ok = valid_priority(values[i]) && static_cast<double>(values[i]) <= max_leaf;
  return (index_ok ? 0 : kBadIndex) | (value_ok ? 0 : kBadValue);
}

// (td + eps)^alpha in the tree's type; float32 trees take the power in float32
// (as the C++ tree does).
template <typename T>
HR_HD T priority_from_td(double td, double alpha, double eps) {
  const double raw = td + eps;
  if (sizeof(T) == 4) return static_cast<T>(powf(static_cast<float>(raw), static_cast<float>(alpha)));
  return static_cast<T>(pow(raw, alpha));
}

// Entry i of `update_td(idx, td)`: its flags, its sort key and its priority
// (bad when the TD error is not a finite magnitude or its priority exceeds
// `max_leaf`).
template <typename T>
HR_HD int check_td_item(int64_t i, int64_t n, const int64_t* idx, const double* td, int64_t limit,
                        double alpha, double eps, double max_leaf, int64_t* keys, T* priorities) {
  const bool index_ok = idx[i] >= 0 && idx[i] < limit;
  keys[i] = index_ok ? idx[i] * n + i : i;
  const bool td_ok = valid_priority(td[i]);
  priorities[i] = td_ok ? priority_from_td<T>(td[i], alpha, eps) : T(0);
  const bool value_ok = td_ok && static_cast<double>(priorities[i]) <= max_leaf;
  return (index_ok ? 0 : kBadIndex) | (value_ok ? 0 : kBadValue);
}

// Item i of the sorted keys: the last entry for its leaf writes it.
template <typename T>
HR_HD void write_leaf_item(int64_t i, int64_t n, const int64_t* sorted_keys, const T* values, T* leaves) {
  const int64_t leaf = sorted_keys[i] / n;
  if (i + 1 < n && sorted_keys[i + 1] / n == leaf) return;  // a later write to this leaf wins
  leaves[leaf] = values[sorted_keys[i] % n];
}

// Node `node` of a level >= 1 from its child group: its value (the group's
// float64 sum taken left to right, rounded once), its positive minimum, and,
// when the children are not leaves, the group's prefix sums (kept for
// descents). `child_mins` is null when the children are leaves.
template <typename T, int K>
HR_HD void recompute_node(int64_t node, const T* child_values, const T* child_mins, double* child_prefix,
                          T* values, T* mins) {
  const int64_t base = node * K;
  double s = 0.0;
  for (int k = 0; k < K; ++k) {
    s += static_cast<double>(child_values[base + k]);
    if (child_prefix) child_prefix[base + k] = s;
  }
  values[node] = static_cast<T>(s);
  mins[node] =
      child_mins ? group_min<T, K>(child_mins + base, false) : group_min<T, K>(child_values + base, true);
}

// Item i of the sorted keys at one level: the first entry under each parent
// (leaf / span, span = K^level) recomputes that parent.
template <typename T, int K>
HR_HD void refresh_item(int64_t i, int64_t n, const int64_t* sorted_keys, int64_t span, const T* child_values,
                        const T* child_mins, double* child_prefix, T* values, T* mins) {
  const int64_t node = sorted_keys[i] / n / span;
  if (i > 0 && sorted_keys[i - 1] / n / span == node) return;
  recompute_node<T, K>(node, child_values, child_mins, child_prefix, values, mins);
}

// The top group: its prefix sums (null when the top group holds the leaves),
// the total and the positive minimum.
template <typename T, int K>
HR_HD void refresh_root(const T* top_values, const T* top_mins, double* top_prefix, double* total,
                        T* min_value) {
  double prefix[K];
  group_prefix<T, K>(top_values, prefix);
  if (top_prefix)
    for (int k = 0; k < K; ++k) top_prefix[k] = prefix[k];
  *total = prefix[K - 1];
  *min_value = top_mins ? group_min<T, K>(top_mins, false) : group_min<T, K>(top_values, true);
}

// A TreeView from a table of level addresses (entry l: the prefix sums of
// level l; entry 0 unused), the form in which a kernel receives it.
template <typename T>
HR_HD TreeView<T> view_from_table(const T* leaves, const uint64_t* prefix_table, int num_levels) {
  TreeView<T> view;
  view.leaves = leaves;
  view.num_levels = num_levels;
  for (int l = 1; l < num_levels; ++l) view.prefix[l] = reinterpret_cast<const double*>(prefix_table[l]);
  return view;
}

// Draw i of a batch: its leaf and its importance weight.
template <typename T, int K>
HR_HD void sample_item(int64_t i, int64_t n, const TreeView<T>& tree, const double* uniforms, bool stratified,
                       double total, double min_value, double beta, int64_t* idx_out, float* weight_out) {
  const int64_t leaf = descend<T, K>(tree, draw_mass(i, n, uniforms[i], total, stratified));
  idx_out[i] = leaf;
  weight_out[i] = is_weight(tree.leaves[leaf], min_value, beta);
}

// Word t of the rows rows[0..count) of one field, copied from `source` (rows
// of `words` words, contiguous) to `out` starting at row `first`. A block of
// threads copies its rows together, consecutive threads taking consecutive
// words, so reads of one row coalesce.
template <typename Word>
HR_HD void gather_word(int64_t t, const int64_t* rows, int64_t first, const Word* source, Word* out,
                       int64_t words) {
  const int64_t r = t / words, w = t % words;
  out[(first + r) * words + w] = source[rows[r] * words + w];
}

}  // namespace hetero_replay
