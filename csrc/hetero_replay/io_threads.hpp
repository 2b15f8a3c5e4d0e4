// Tasks that wait on a disk, run on short-lived threads of their own (the disk storage's reads).
//
// Not the batch TaskPool: reads wait on the disk, and a pool busy with a tree operation would
// serialise them. Used by read_records (csrc/ring.cpp) and the record log's gathers from a file
// (csrc/record_log.cpp).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <thread>
#include <vector>

namespace hetero_replay {

// Runs task(k) for k in [0, n) on `threads` threads (the caller's included), each taking the next k.
// A task returns 0, or an error code; the first error stops the others from taking more, and is returned.
template <class Task>
int run_io_tasks(int64_t n, int threads, Task&& task) {
  std::atomic<int64_t> next{0};
  std::atomic<int> error{0};
  auto work = [&] {
    for (int64_t k; error.load() == 0 && (k = next.fetch_add(1)) < n;) {
      const int e = task(k);
      if (e != 0) {
        int expected = 0;
        error.compare_exchange_strong(expected, e);
        return;
      }
    }
  };
  std::vector<std::thread> helpers;
  const int64_t extra = std::min<int64_t>(threads, n) - 1;
  for (int64_t i = 0; i < extra; ++i) helpers.emplace_back(work);
  work();
  for (auto& t : helpers) t.join();
  return error.load();
}

// Reads n bytes at `offset` of file `fd` into `out`: 0, errno of a failed read, or -1 if the file ends first.
inline int pread_all(int fd, uint8_t* out, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, static_cast<size_t>(n - done), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got < 0 ? errno : -1;
    done += got;
  }
  return 0;
}

// Writes n bytes of `src` at `offset` of file `fd`: 0, or errno of a failed write.
inline int pwrite_all(int fd, const uint8_t* src, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t put = ::pwrite(fd, src + done, static_cast<size_t>(n - done), offset + done);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return errno;
    done += put;
  }
  return 0;
}

}  // namespace hetero_replay
