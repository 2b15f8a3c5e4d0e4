// Row gather for transition storage: out[f][i] = source[f][idx[i]] for every field f.
//
// Sampled rows are random, so each one is a cache miss per field; a plain loop
// takes those misses one after another. Here the rows kAhead samples ahead are
// prefetched for every field, so many misses are in flight at once, and large
// batches are split across threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "task_pool.hpp"

namespace hetero_replay {

// One field: row r of the source starts at source + r * stride and holds
// `bytes` contiguous bytes (stride > bytes when fields share a record).
struct RowField {
  const char* source;
  int64_t stride;
  int64_t bytes;
};

template <int64_t Bytes>
inline void copy_fixed(char* dst, const char* src) {
  std::memcpy(dst, src, Bytes);  // constant size: inlined as a few moves
}

inline void copy_row(char* dst, const char* src, int64_t bytes) {
  switch (bytes) {
    case 4: return copy_fixed<4>(dst, src);
    case 8: return copy_fixed<8>(dst, src);
    case 16: return copy_fixed<16>(dst, src);
    case 32: return copy_fixed<32>(dst, src);
    case 64: return copy_fixed<64>(dst, src);
    default: std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
}

// out[f] receives n * fields[f].bytes bytes.
inline void gather_rows(const std::vector<RowField>& fields, const std::vector<char*>& out,
                        const int64_t* idx, int64_t n, int threads) {
  constexpr int64_t kAhead = 16, kChunk = 512;
  const size_t nf = fields.size();
  parallel_for((n + kChunk - 1) / kChunk, threads, [&](int64_t c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) {
      if (i + kAhead < end) {
        for (const RowField& f : fields) {
          const char* row = f.source + idx[i + kAhead] * f.stride;
          __builtin_prefetch(row);
          if (f.bytes > 64) __builtin_prefetch(row + 64);
        }
      }
      for (size_t k = 0; k < nf; ++k) {
        const RowField& f = fields[k];
        copy_row(out[k] + i * f.bytes, f.source + idx[i] * f.stride, f.bytes);
      }
    }
  });
}

}  // namespace hetero_replay
