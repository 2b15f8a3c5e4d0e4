// Batch search and the fused sample of the sum tree: thin __global__ wrappers
// over descent.hpp / batch_items.hpp. The tree reaches a kernel as its leaves
// plus a table of level addresses (prefix_table[l] = the float64 prefix sums
// of level l, entry 0 unused), rebuilt into a TreeView per thread.
#include "common.cuh"

using namespace hetero_replay;

template <typename T, int K>
__global__ void hr_find(int64_t n, const double* mass, const T* leaves, const uint64_t* prefix_table,
                        int64_t num_levels, int64_t* out) {
  const int64_t i = thread_item();
  if (i >= n) return;
  const TreeView<T> tree = view_from_table<T>(leaves, prefix_table, static_cast<int>(num_levels));
  out[i] = descend<T, K>(tree, mass[i]);
}

template <typename T, int K>
__global__ void hr_sample(int64_t n, const double* uniforms, int64_t stratified, double total,
                          double min_value, double beta, const T* leaves, const uint64_t* prefix_table,
                          int64_t num_levels, int64_t* idx_out, float* weight_out) {
  const int64_t i = thread_item();
  if (i >= n) return;
  const TreeView<T> tree = view_from_table<T>(leaves, prefix_table, static_cast<int>(num_levels));
  sample_item<T, K>(i, n, tree, uniforms, stratified != 0, total, min_value, beta, idx_out, weight_out);
}

// hr_sample plus the gather of each sampled row of `num_fields` fields, in one
// launch (the caller picks the block size: the rows a block gathers
// together). fields[3 f .. 3 f + 2] = (source address, output address, row
// bytes) of field f; rows are contiguous. Each block first draws its rows,
// then copies them together (4-byte words where the row size allows, bytes
// otherwise).
template <typename T, int K>
__global__ void hr_sample_gather(int64_t n, const double* uniforms, int64_t stratified, double total,
                                 double min_value, double beta, const T* leaves, const uint64_t* prefix_table,
                                 int64_t num_levels, int64_t* idx_out, float* weight_out, int64_t num_fields,
                                 const long long* fields) {
  const int64_t i = thread_item();
  if (i < n) {
    const TreeView<T> tree = view_from_table<T>(leaves, prefix_table, static_cast<int>(num_levels));
    sample_item<T, K>(i, n, tree, uniforms, stratified != 0, total, min_value, beta, idx_out, weight_out);
  }
  __syncthreads();  // the block's idx_out entries are now visible to the whole block
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x;
  const int64_t count = min(static_cast<int64_t>(blockDim.x), n - first);
  for (int64_t f = 0; f < num_fields; ++f) {
    const char* source = reinterpret_cast<const char*>(fields[3 * f]);
    char* out = reinterpret_cast<char*>(fields[3 * f + 1]);
    const int64_t bytes = fields[3 * f + 2];
    if (bytes % 4 == 0) {
      const int64_t words = bytes / 4;
      for (int64_t t = threadIdx.x; t < count * words; t += blockDim.x)
        gather_word<uint32_t>(t, idx_out + first, first, reinterpret_cast<const uint32_t*>(source),
                              reinterpret_cast<uint32_t*>(out), words);
    } else {
      for (int64_t t = threadIdx.x; t < count * bytes; t += blockDim.x)
        gather_word<uint8_t>(t, idx_out + first, first, reinterpret_cast<const uint8_t*>(source),
                             reinterpret_cast<uint8_t*>(out), bytes);
    }
  }
}

#ifdef HR_INSTANTIATE_ALL
#define HR_TREE_KERNELS(T, K)                                                                              \
  template __global__ void hr_find<T, K>(int64_t, const double*, const T*, const uint64_t*, int64_t,       \
                                         int64_t*);                                                        \
  template __global__ void hr_sample<T, K>(int64_t, const double*, int64_t, double, double, double,        \
                                           const T*, const uint64_t*, int64_t, int64_t*, float*);          \
  template __global__ void hr_sample_gather<T, K>(int64_t, const double*, int64_t, double, double, double, \
                                                  const T*, const uint64_t*, int64_t, int64_t*, float*,    \
                                                  int64_t, const long long*);
HR_FOR_EACH_TREE(HR_TREE_KERNELS)
#endif
