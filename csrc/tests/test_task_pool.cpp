// TaskPool / parallel_for: every item runs exactly once for any item count and
// thread count, exceptions reach the caller (and the pool keeps working), and
// several threads may call at once.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "check.hpp"
#include "hetero_replay/idle_cores.hpp"
#include "hetero_replay/task_pool.hpp"

using namespace hr_test;
using hetero_replay::parallel_for;
using hetero_replay::TaskPool;

namespace {

// Runs parallel_for(n, threads) and checks that each item ran exactly once.
bool covers_once(int64_t n, int threads) {
  std::unique_ptr<std::atomic<int>[]> count(new std::atomic<int>[static_cast<size_t>(n) + 1]);
  for (int64_t i = 0; i <= n; ++i) count[i].store(0);
  parallel_for(n, threads, [&](int64_t i) {
    if (i < 0 || i >= n) {
      count[n].fetch_add(1);  // out of range: recorded in the spare slot
      return;
    }
    count[i].fetch_add(1, std::memory_order_relaxed);
  });
  for (int64_t i = 0; i < n; ++i)
    if (count[i].load() != 1) return false;
  return count[n].load() == 0;
}

struct ItemError : std::runtime_error {
  explicit ItemError(int64_t i) : std::runtime_error("item " + std::to_string(i)), item(i) {}
  int64_t item;
};

}  // namespace

TEST_CASE(task_pool, every_item_exactly_once) {
  for (int threads : {1, 2, 3, 4, 8}) {
    for (int64_t n : {0, 1, 2, 3, 5, 8, 17, 64, 100, 1000, 4097, 20000}) {
      for (int repeat = 0; repeat < 3; ++repeat) {
        if (!covers_once(n, threads)) {
          fail(__FILE__, __LINE__, "n=" + std::to_string(n) + " threads=" + std::to_string(threads));
          break;
        }
      }
    }
  }
}

TEST_CASE(task_pool, back_to_back_jobs) {
  // Many short jobs in a row: a worker still finishing one job must never
  // claim an item of the next.
  std::atomic<int64_t> sum{0};
  int64_t want = 0;
  for (int job = 0; job < 2000; ++job) {
    const int64_t n = 1 + job % 13;
    parallel_for(n, 4, [&](int64_t i) { sum.fetch_add(job * 100 + i, std::memory_order_relaxed); });
    for (int64_t i = 0; i < n; ++i) want += job * 100 + i;
  }
  CHECK_EQ(sum.load(), want);
}

TEST_CASE(task_pool, exceptions_reach_the_caller) {
  for (int threads : {1, 2, 4}) {
    for (int64_t failing : {int64_t{0}, int64_t{1}, int64_t{77}, int64_t{499}}) {
      std::atomic<int64_t> ran{0};
      bool caught = false;
      try {
        parallel_for(500, threads, [&](int64_t i) {
          ran.fetch_add(1);
          if (i == failing) throw ItemError(i);
        });
      } catch (const ItemError& e) {  // the item's own exception type, on this thread
        caught = e.item == failing;
      }
      CHECK(caught);
      CHECK(ran.load() >= 1);
      // The pool works afterwards, and holds no stale error.
      CHECK(covers_once(1000, threads));
      CHECK(covers_once(3, threads));
    }
    // Every item throws: one exception arrives, the others are dropped.
    int caught = 0;
    try {
      parallel_for(200, threads, [](int64_t i) { throw ItemError(i); });
    } catch (const ItemError&) {
      ++caught;
    }
    CHECK_EQ(caught, 1);
    CHECK(covers_once(2000, threads));
  }
}

TEST_CASE(task_pool, workers_take_part) {
  // Items long enough that sleeping workers wake up and claim some.
  TaskPool::instance().set_threads(TaskPool::instance().threads());  // forget a back-off of earlier cases
  std::mutex m;
  std::set<std::thread::id> ids;
  parallel_for(200, 4, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(m);
    ids.insert(std::this_thread::get_id());
  });
  CHECK(ids.size() >= 2);
}

TEST_CASE(task_pool, concurrent_callers) {
  // Several threads submit at once: one holds the pool, the others run their
  // items themselves; each must still see every one of its items once.
  constexpr int kCallers = 4;
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([c, &bad] {
      for (int round = 0; round < 150; ++round) {
        const int64_t n = 1 + (round * 37 + c * 11) % 3000;
        if (!covers_once(n, 1 + (round + c) % 4)) bad.fetch_add(1);
        if (round % 50 == 0) {  // and exceptions, concurrently
          bool caught = false;
          try {
            parallel_for(300, 3, [&](int64_t i) {
              if (i == 150 + c) throw ItemError(i);
            });
          } catch (const ItemError& e) {
            caught = e.item == 150 + c;
          }
          if (!caught) bad.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK_EQ(bad.load(), 0);
}

TEST_CASE(task_pool, thread_count_setting) {
  TaskPool& pool = TaskPool::instance();
  const int saved = pool.threads();
  CHECK(saved >= 1);
  pool.set_threads(3);
  CHECK_EQ(pool.threads(), 3);
  CHECK_THROWS_AS(pool.set_threads(0), std::invalid_argument);
  CHECK_THROWS_AS(pool.set_threads(-4), std::invalid_argument);
  CHECK_EQ(pool.threads(), 3);
  pool.set_threads(saved);
}

// A worker that is slow to finish what it claimed (as one the OS took off the
// CPU is) makes the next calls run on the caller alone.
TEST_CASE(task_pool, a_late_worker_makes_the_next_calls_serial) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> on_workers{0};
  const auto call = [&](bool slow_workers) {
    on_workers.store(0);
    parallel_for(256, 2, [&](int64_t) {
      if (std::this_thread::get_id() == caller) {
        // Long enough for a sleeping worker to wake and claim items (with instant items the caller
        // finished first unless a worker happened to be polling, so the test hung on timing).
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        return;
      }
      on_workers.fetch_add(1);
      if (slow_workers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
    return on_workers.load();
  };
  // Setting the threads forgets a back-off: each attempt starts parallel (on a busy machine the workers
  // may wake too late to claim anything, and a call they did not help backs off too).
  const auto forget = [] { TaskPool::instance().set_threads(TaskPool::instance().threads()); };
  bool late = false;
  for (int attempt = 0; attempt < 200 && !late; ++attempt) {
    forget();
    late = call(true) > 0;  // a worker claimed an item
  }
  CHECK(late);
  CHECK_EQ(call(false), 0);  // backing off: serial
  bool joined = false;
  for (int attempt = 0; attempt < 200 && !joined; ++attempt) {
    forget();
    joined = call(true) > 0;  // after forgetting, workers take part again
  }
  CHECK(joined);
  forget();
}

// Another process busy on a core is seen: the pool's default leaves that core to it.
TEST_CASE(task_pool, idle_cores_count_another_busy_process) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::FILE* stat = std::fopen("/proc/stat", "r");
  if (cores < 2 || stat == nullptr) return;  // nothing to leave, or nothing to read: all cores, always
  std::fclose(stat);
  using Clock = std::chrono::steady_clock;
  hetero_replay::IdleCores idle;
  CHECK(idle.available(Clock::now()) == static_cast<double>(cores));  // no window measured yet
  const pid_t child = fork();
  if (child == 0) {
    const auto end = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < end) {
    }
    _exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double available = idle.available(Clock::now());
  int status = 0;
  waitpid(child, &status, 0);
  // The child kept one core busy for the whole window (other processes only add to that).
  CHECK(available <= static_cast<double>(cores) - 0.6);
}
