// Batch priority update and rebuild of the sum tree: thin __global__ wrappers
// over the per-item functions of hetero_replay/batch_items.hpp (see its header
// comment for the launch sequence). One thread per batch item, or per node for
// a rebuild. All pointers are device pointers; `status` is the update's
// status array (kStatusWords uint64, zeroed by the caller).
#include "common.cuh"

using namespace hetero_replay;

template <typename T>
__global__ void hr_check_priorities(int64_t n, const int64_t* idx, const T* values, int64_t limit,
                                    double max_leaf, int64_t* keys, unsigned long long* status) {
  const int64_t i = thread_item();
  if (i >= n) return;
  const int bad = check_priority_item<T>(i, n, idx, values, limit, max_leaf, keys);
  if (bad & kBadIndex) atomicMax(status + kStatusBadIndex, static_cast<unsigned long long>(n - i));
  if (bad & kBadValue) atomicMax(status + kStatusBadValue, static_cast<unsigned long long>(n - i));
}

template <typename T>
__global__ void hr_check_td(int64_t n, const int64_t* idx, const double* td, int64_t limit, double alpha,
                            double eps, double max_leaf, int64_t* keys, T* priorities,
                            unsigned long long* status) {
  const int64_t i = thread_item();
  if (i >= n) return;
  const int bad = check_td_item<T>(i, n, idx, td, limit, alpha, eps, max_leaf, keys, priorities);
  if (bad & kBadIndex) atomicMax(status + kStatusBadIndex, static_cast<unsigned long long>(n - i));
  if (bad & kBadValue) atomicMax(status + kStatusBadValue, static_cast<unsigned long long>(n - i));
  else atomicMax(status + kStatusMaxRaw, static_cast<unsigned long long>(double_bits(td[i] + eps)));
}

template <typename T>
__global__ void hr_write_leaves(int64_t n, const int64_t* sorted_keys, const T* values, T* leaves,
                                const unsigned long long* status) {
  const int64_t i = thread_item();
  if (i >= n || update_failed(status)) return;
  write_leaf_item<T>(i, n, sorted_keys, values, leaves);
}

// child_mins / child_prefix are null (0) when the children are leaves.
template <typename T, int K>
__global__ void hr_refresh_level(int64_t n, const int64_t* sorted_keys, int64_t span, const T* child_values,
                                 const T* child_mins, double* child_prefix, T* values, T* mins,
                                 const unsigned long long* status) {
  const int64_t i = thread_item();
  if (i >= n || update_failed(status)) return;
  refresh_item<T, K>(i, n, sorted_keys, span, child_values, child_mins, child_prefix, values, mins);
}

// One node per thread: a full rebuild of one level (load_leaves).
template <typename T, int K>
__global__ void hr_rebuild_level(int64_t nodes, const T* child_values, const T* child_mins,
                                 double* child_prefix, T* values, T* mins) {
  const int64_t node = thread_item();
  if (node >= nodes) return;
  recompute_node<T, K>(node, child_values, child_mins, child_prefix, values, mins);
}

// One thread. top_mins / top_prefix are null when the top group holds the leaves.
template <typename T, int K>
__global__ void hr_refresh_root(const T* top_values, const T* top_mins, double* top_prefix,
                                unsigned long long* status) {
  if (thread_item() != 0 || update_failed(status)) return;
  double total;
  T min_value;
  refresh_root<T, K>(top_values, top_mins, top_prefix, &total, &min_value);
  status[kStatusTotal] = double_bits(total);
  status[kStatusMin] = double_bits(static_cast<double>(min_value));
}

#ifdef HR_INSTANTIATE_ALL
#define HR_TYPE_KERNELS(T)                                                                                 \
  template __global__ void hr_check_priorities<T>(int64_t, const int64_t*, const T*, int64_t, double,      \
                                                  int64_t*, unsigned long long*);                          \
  template __global__ void hr_check_td<T>(int64_t, const int64_t*, const double*, int64_t, double, double, \
                                          double, int64_t*, T*, unsigned long long*);                      \
  template __global__ void hr_write_leaves<T>(int64_t, const int64_t*, const T*, T*,                       \
                                              const unsigned long long*);
#define HR_TREE_KERNELS(T, K)                                                                           \
  template __global__ void hr_refresh_level<T, K>(int64_t, const int64_t*, int64_t, const T*, const T*, \
                                                  double*, T*, T*, const unsigned long long*);          \
  template __global__ void hr_rebuild_level<T, K>(int64_t, const T*, const T*, double*, T*, T*);        \
  template __global__ void hr_refresh_root<T, K>(const T*, const T*, double*, unsigned long long*);
HR_FOR_EACH_TYPE(HR_TYPE_KERNELS)
HR_FOR_EACH_TREE(HR_TREE_KERNELS)
#endif
