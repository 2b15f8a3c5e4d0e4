// A small caller-runs thread pool for batch operations.
//
// Why not OpenMP: a parallel region ends with a barrier that waits for every
// thread of the team, including one the OS has descheduled because another
// process (a simulator, a SubprocVecEnv actor) holds its core. Measured on
// 2 cores with the other core busy, a 2-thread batch then took 10-200x longer
// than a serial one. Here the calling thread claims work items itself, workers
// join in when they run, and the caller waits only for items a worker has
// actually started: a thread that never woke up delays nothing. One that was
// taken off the CPU after claiming an item still does (a whole time slice), so
// a call uses at most the cores other processes leave idle (idle_cores.hpp,
// from /proc/stat every 0.1 s), and after a call that did not pay the pool runs
// the next calls serially for a while (see back_off_if_late): with the default
// thread count (all hardware threads) a machine with other work then runs about
// as one thread does, a quiet one in parallel.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <pthread.h>

#include "hetero_replay/idle_cores.hpp"

namespace hetero_replay {

class TaskPool {
 public:
  // Never destroyed: at exit, a daemon thread of the interpreter may still be
  // inside run() (it is stopped only when it takes the GIL back), and joining
  // or freeing the workers under it would break it; the process's exit ends them.
  static TaskPool& instance() {
    static TaskPool* pool = new TaskPool();
    return *pool;
  }

  // Threads used by batch operations, the caller included. Default: the
  // machine's hardware threads, of which a call uses those other processes
  // leave idle (usable_threads); a count chosen (HETERO_REPLAY_NUM_THREADS,
  // set_threads) is used as given.
  int threads() const { return threads_.load(std::memory_order_relaxed); }
  // Also forgets a back-off (see back_off_if_late): the caller chose anew.
  void set_threads(int n) {
    if (n < 1) throw std::invalid_argument("num_threads must be >= 1, got " + std::to_string(n));
    choose(n, true);
  }
  // Back to the default (see threads()).
  void use_default() { choose(hardware_threads(), false); }

  // Calls fn(i) for every i in [0, n), using up to `max_threads` threads (the
  // caller included). Returns when all calls have finished. If calls throw,
  // the first exception is rethrown here, on the calling thread: one escaping
  // a worker thread would end the whole process (std::terminate).
  template <typename F>
  void run(int64_t n, int max_threads, F&& fn) {
    int helpers = static_cast<int>(std::min<int64_t>(max_threads, n)) - 1;
    std::unique_lock<std::mutex> submit(submit_mutex_, std::try_to_lock);
    if (helpers > 0 && submit.owns_lock()) helpers = std::min(helpers, usable_threads() - 1);
    if (helpers <= 0 || !submit.owns_lock() || serial_left_ > 0) {  // serial, pool busy, or backing off
      const bool last = helpers > 0 && submit.owns_lock() && --serial_left_ == 0;
      for (int64_t i = 0; i < n; ++i) fn(i);
      if (last) wake_for_next(helpers);
      return;
    }
    ensure_workers(helpers);
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      using Fn = std::remove_reference_t<F>;
      job_.call = [](void* ctx, int64_t i) { (*static_cast<Fn*>(ctx))(i); };
      job_.ctx = const_cast<void*>(static_cast<const void*>(&fn));
      job_.n = n;
      job_.helpers = helpers;
      job_.generation = ++generation_;
      done_.store(0, std::memory_order_relaxed);
      next_.store(pack(job_.generation, 0), std::memory_order_release);
      published_.store(job_.generation, std::memory_order_release);
    }
    wake_.notify_all();
    const auto start = std::chrono::steady_clock::now();
    const Job job = current_job();
    int64_t mine = 0;
    for (int64_t i; (i = claim(job)) >= 0;) {
      call_guarded(job, i);
      ++mine;
    }
    // Wait for the items that workers claimed; they are running now.
    const auto own_done = std::chrono::steady_clock::now();
    const int64_t target = n - mine;
    while (done_.load(std::memory_order_acquire) < target) std::this_thread::yield();
    back_off_if_late(own_done - start, std::chrono::steady_clock::now() - own_done, mine, n);
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(error_mutex_);
      error.swap(error_);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Job {
    void (*call)(void*, int64_t) = nullptr;
    void* ctx = nullptr;
    int64_t n = 0;
    int helpers = 0;
    uint32_t generation = 0;
  };

  TaskPool() {
    const char* env = std::getenv("HETERO_REPLAY_NUM_THREADS");
    threads_.store(std::max(1, env ? std::atoi(env) : hardware_threads()));
    chosen_.store(env != nullptr);
    pthread_atfork(&TaskPool::before_fork, &TaskPool::after_fork_parent, &TaskPool::after_fork_child);
  }

  // fork() copies only the calling thread. Holding job_mutex_ across the fork
  // means no worker holds it; the child then gets fresh synchronisation
  // objects (the old ones may count waiters that do not exist there) and
  // forgets the parent's threads without joining them. SubprocVecEnv forks.
  static void before_fork() { instance().job_mutex_.lock(); }
  static void after_fork_parent() { instance().job_mutex_.unlock(); }
  static void after_fork_child() {
    TaskPool& p = instance();
    new (&p.submit_mutex_) std::mutex();
    new (&p.job_mutex_) std::mutex();
    new (&p.error_mutex_) std::mutex();
    new (&p.wake_) std::condition_variable();
    new std::vector<std::thread>(std::move(p.workers_));  // leaked on purpose: never joined
    p.workers_.clear();
    // A job another thread was running at the fork is not the child's: with
    // no helpers wanted, a new worker waits for the next published job.
    p.job_ = Job();
    p.error_ = nullptr;
    p.backoff_ = p.serial_left_ = 0;
  }

  // The claim counter packs the job's generation with the next item, so a
  // worker holding a finished job's description can never claim an item of
  // the next job.
  static uint64_t pack(uint32_t generation, uint32_t item) {
    return (static_cast<uint64_t>(generation) << 32) | item;
  }

  // Whether the call paid: the caller's own items took `own`, then it waited
  // `waited` for the workers' (`mine` of `n` items were the caller's). Had it
  // run every item alone it would have taken about own * n / mine. A worker
  // the OS took off the CPU after claiming an item (another process busy on
  // its core: a simulator, a SubprocVecEnv actor) costs the caller a whole
  // time slice; one that woke too late to help costs its wake-up. Either way,
  // when the call took 90% of the serial estimate or more, the next calls run
  // serially: 8, then twice as many each time it happens again (up to 1024);
  // a call that paid resets that. Called holding submit_mutex_.
  void back_off_if_late(std::chrono::nanoseconds own, std::chrono::nanoseconds waited, int64_t mine,
                        int64_t n) {
    const double took = static_cast<double>((own + waited).count());
    const double serial = static_cast<double>(own.count()) * static_cast<double>(n) /
                          static_cast<double>(std::max<int64_t>(mine, 1));
    if (took >= 0.9 * serial) {
      backoff_ = std::min<int64_t>(backoff_ ? 2 * backoff_ : 8, 1024);
      serial_left_ = backoff_;
    } else {
      backoff_ = 0;
    }
  }

  static int hardware_threads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

  void choose(int n, bool chosen) {
    threads_.store(n, std::memory_order_relaxed);
    chosen_.store(chosen, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(submit_mutex_);
    backoff_ = serial_left_ = 0;
  }

  // Threads a call may use now: a chosen count as it is; by default the cores other processes leave
  // to this one (idle_cores.hpp), rounded down unless nearly whole (1.7 cores is 2). Called holding
  // submit_mutex_.
  int usable_threads() {
    if (chosen_.load(std::memory_order_relaxed)) return threads();
    const double cores = idle_.available(std::chrono::steady_clock::now());
    return std::max(1, static_cast<int>(cores + 0.3));
  }

  // The back-off ends with this call: the next one decides whether running in parallel pays, so its
  // workers must be awake for it. Asleep after the serial calls, they would take longer to wake than a
  // small job lasts, that call would not pay, and the pool would stay serial on a quiet machine (seen
  // as runs whose batch calls all ran at one thread's speed). An empty job wakes them; they then spin
  // (kSpin) until the next job. Called holding submit_mutex_.
  void wake_for_next(int helpers) {
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      job_ = Job();
      job_.helpers = helpers;
      job_.generation = ++generation_;
      next_.store(pack(job_.generation, 0), std::memory_order_release);
      published_.store(job_.generation, std::memory_order_release);
    }
    wake_.notify_all();
  }

  // Runs one item; keeps the job's first exception for the caller to rethrow.
  void call_guarded(const Job& job, int64_t i) noexcept {
    try {
      job.call(job.ctx, i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  int64_t claim(const Job& job) {
    uint64_t cur = next_.load(std::memory_order_acquire);
    while (true) {
      if (static_cast<uint32_t>(cur >> 32) != job.generation) return -1;
      const int64_t item = static_cast<uint32_t>(cur);
      if (item >= job.n) return -1;
      if (next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) return item;
    }
  }

  Job current_job() {
    std::lock_guard<std::mutex> lock(job_mutex_);
    return job_;
  }

  void ensure_workers(int count) {
    std::lock_guard<std::mutex> lock(job_mutex_);
    while (static_cast<int>(workers_.size()) < count) {
      const int rank = static_cast<int>(workers_.size());
      workers_.emplace_back([this, rank] { work(rank); });
    }
  }

  void work(int rank) {
    uint32_t seen = 0;
    while (true) {
      // Batch calls come in bursts (sample, gather, update): spin a little
      // before sleeping, so the next job finds this thread awake.
      const auto spin_until = std::chrono::steady_clock::now() + kSpin;
      while (published_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < spin_until)
        for (int i = 0; i < 16; ++i) pause();
      Job job;
      {
        std::unique_lock<std::mutex> lock(job_mutex_);
        wake_.wait(lock, [&] { return generation_ != seen && rank < job_.helpers; });
        seen = generation_;
        job = job_;
      }
      for (int64_t i; (i = claim(job)) >= 0;) {
        call_guarded(job, i);
        done_.fetch_add(1, std::memory_order_acq_rel);
      }
    }
  }

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  // How long an idle worker keeps polling before it sleeps: a learner step's
  // sample, gather and update come within this; waking a sleeping thread
  // takes about as long as a whole batch operation.
  static constexpr std::chrono::microseconds kSpin{200};

  std::atomic<int> threads_{1};
  std::atomic<bool> chosen_{false};  // threads_ was chosen (not the default): no idle-core cap
  std::atomic<uint32_t> published_{0};
  std::mutex submit_mutex_;  // one job at a time
  int64_t backoff_ = 0;      // guarded by submit_mutex_: see back_off_if_late
  int64_t serial_left_ = 0;
  std::mutex job_mutex_;
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the running job's first exception
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  Job job_;
  uint32_t generation_ = 0;
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> done_{0};
  IdleCores idle_;  // guarded by submit_mutex_
};

// Calls fn(i) for i in [0, n) on up to num_threads() threads.
template <typename F>
void parallel_for(int64_t n, int threads, F&& fn) {
  TaskPool::instance().run(n, threads, fn);
}

}  // namespace hetero_replay
