// How many cores other processes leave to this one, from /proc/stat and this
// process's own CPU time.
//
// Why: the thread pool splits a batch call across threads, and with another
// process busy on a core (a simulator, a SubprocVecEnv worker) the helper it
// wakes shares a core with that process or with the caller. Measured on the
// 2-core VM with one core busy, the default thread count (2) was 1.3-1.6x
// slower than one thread, whatever the pool's back-off did, because idle
// helpers poll for the next job; on a quiet machine that polling is what makes
// small jobs pay. So the pool asks first how many cores are there to use.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>

namespace hetero_replay {

class IdleCores {
 public:
  // Cores this process may use: the online cores minus what other processes
  // used over the last window (refreshed at most every `kWindow`). All of them
  // where /proc/stat cannot be read (not Linux, a restricted sandbox).
  double available(std::chrono::steady_clock::time_point now) {
    if (now - last_ >= kWindow) refresh(now);
    return available_;
  }

 private:
  void refresh(std::chrono::steady_clock::time_point now) {
    uint64_t busy = 0, total = 0;
    const int64_t self = process_cpu_ns();
    const bool ok = read_stat(busy, total);
    if (ok && total_ != 0 && total > total_) {
      const double cores = static_cast<double>(cores_online());
      const double machine = cores * static_cast<double>(busy - busy_) / static_cast<double>(total - total_);
      const double wall =
          static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count());
      const double mine = static_cast<double>(self - self_) / wall;
      const double others = machine - mine;
      available_ = others > 0 ? cores - others : cores;
    }
    if (ok) busy_ = busy, total_ = total;
    self_ = self;
    last_ = now;
  }

  // Busy and total jiffies of all cores (busy: all but idle and iowait). Time a
  // hypervisor stole from this machine is left out of both: it is not another
  // process here, and a shared cloud host steals 10-30% from a quiet machine.
  static bool read_stat(uint64_t& busy, uint64_t& total) {
    std::FILE* f = std::fopen("/proc/stat", "re");
    if (f == nullptr) return false;
    unsigned long long v[8] = {};  // user nice system idle iowait irq softirq steal
    const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                                &v[4], &v[5], &v[6], &v[7]);
    std::fclose(f);
    if (got < 4) return false;
    total = 0;
    for (int i = 0; i < 7; ++i) total += v[i];
    busy = total - v[3] - v[4];
    return true;
  }

  static int64_t process_cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }

  static long cores_online() {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
  }

  static constexpr std::chrono::milliseconds kWindow{100};

  std::chrono::steady_clock::time_point last_{};
  uint64_t busy_ = 0, total_ = 0;
  int64_t self_ = 0;
  double available_ = static_cast<double>(cores_online());
};

}  // namespace hetero_replay
