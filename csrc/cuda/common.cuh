// What every kernel file shares: the thread's item index and the list of
// (value type, fanout) pairs the CI compile check instantiates.
//
// Compiled two ways: by NVRTC at run time through CuPy (hetero_replay/trees/
// cupy_tree.py, with -I csrc and -I csrc/cuda/nvrtc_std) and by nvcc in CI
// (tests/test_cuda_compile.py, with -DHR_INSTANTIATE_ALL so every template is
// compiled for sm_80 and sm_90).
#pragma once

#include "hetero_replay/batch_items.hpp"

namespace hetero_replay {

__device__ __forceinline__ int64_t thread_item() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// True once the update's check has found a bad entry: later kernels of the
// update then write nothing, so bad input leaves the tree as it was.
__device__ __forceinline__ bool update_failed(const unsigned long long* status) {
  return (status[kStatusBadIndex] | status[kStatusBadValue]) != 0ull;
}

}  // namespace hetero_replay

// X(T, K) for every value type and fanout a tree can have (FANOUTS).
// clang-format off
#define HR_FOR_EACH_TREE(X) \
  X(float, 2) X(float, 4) X(float, 8) X(float, 16) X(float, 32) X(float, 64) \
  X(double, 2) X(double, 4) X(double, 8) X(double, 16) X(double, 32) X(double, 64)
// clang-format on
#define HR_FOR_EACH_TYPE(X) X(float) X(double)
