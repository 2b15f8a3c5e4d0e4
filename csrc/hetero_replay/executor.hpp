// The relaxed pipeline's native executor: its jobs run on one std::thread, with no Python.
//
// A job is what the staleness schedule releases when the learner takes a batch:
// apply the queued priority updates the next batch must see (dropping entries
// whose slot was rewritten since their batch was drawn: the epoch rule), then
// draw that batch from uniforms drawn from the caller's generator, and gather
// its rows into a preallocated output slot. The caller decides everything
// (which updates, which uniforms, where the rows go); the executor only runs
// jobs in submission order, so a job's result never depends on which thread
// ran it or when.
//
// Fork: fork() copies only the calling thread. Before it, every executor waits
// for its running job and starts no other (the child gets whole jobs only);
// in the child the thread is gone, so waiting runs the queued jobs on the
// waiting thread and the next submit starts a new thread.
//
// Whoever waits for a job that has not started runs it (and those before it)
// itself, so a thread the OS keeps off the CPU (a busy machine) costs the
// learner no more than doing the work inline.
//
// A thread that ran a job lately polls its queue instead of sleeping until a
// submit wakes it, where a core is idle for it: a learner submitting a job per
// step then makes no system call.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <pthread.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "gather.hpp"
#include "idle_cores.hpp"
#include "kary_tree.hpp"

namespace hetero_replay {

// What went wrong in a job's step: mapped to a Python exception type by the bindings.
enum class JobError { kNone = 0, kValue = 1, kIndex = 2, kOther = 3 };

// A queued priority update: (|td| + eps)^alpha at idx, for a batch drawn at write `epoch`.
struct UpdateTask {
  const int64_t* idx = nullptr;
  const double* td = nullptr;
  int64_t n = 0;
  int64_t epoch = 0;
  // Refuse indices whose slot holds priority 0 (never written, or cleared): for owners whose
  // filled slots are not a prefix of the tree (then `limit` cannot say which slots are filled).
  bool filled_only = false;
  // Keep what undoes it (an update applied ahead of the batch served next): the
  // kept indices and their leaves before the update, `n` entries of room each.
  int64_t* undo_idx = nullptr;
  void* undo_leaves = nullptr;
  // Results.
  int64_t dropped = 0;  // entries whose slot was rewritten after `epoch`
  int64_t kept = 0;     // entries applied (and snapshotted, with undo)
  double max_raw = 0.0;  // max(|td| + eps) of the kept entries
  JobError error = JobError::kNone;  // then nothing changed
  std::string message;
};

// A batch to draw: n uniforms in [0, 1) -> leaves, IS weights (beta 1; and at `beta`), rows.
struct DrawTask {
  int64_t n = 0;  // 0: no draw
  const double* uniforms = nullptr;
  bool stratified = true;
  int64_t* idx_out = nullptr;
  float* weight_out = nullptr;
  double beta = 1.0;  // the learner's most likely next beta: its weights go to raised_out (if not null)
  float* raised_out = nullptr;
  std::vector<char*> field_out;  // one per field, n * bytes each
  JobError error = JobError::kNone;  // then the outputs are unspecified
  std::string message;
};

struct Job {
  std::vector<UpdateTask> updates;  // applied in order, before the draw
  DrawTask draw;
  double alpha = 1.0, eps = 0.0;
  int64_t limit = 0;  // updates' indices must lie in [0, limit)
  bool done = false;  // guarded by the executor's mutex
  int64_t run_ns =
      0;  // CPU time the job took (set when done) on the thread that ran it: preemption not counted
};

// What every job of one buffer reads and writes.
struct JobContext {
  SumTreeBase* tree = nullptr;
  std::vector<RowField> fields;
  const int64_t* written_at = nullptr;  // per slot, the write epoch of its last write (or null: none tracked)
  int64_t capacity = 0;
};

namespace detail {

inline JobError error_kind(const std::exception_ptr& e, std::string& message) {
  try {
    std::rethrow_exception(e);
  } catch (const std::out_of_range& x) {
    message = x.what();
    return JobError::kIndex;
  } catch (const std::invalid_argument& x) {
    message = x.what();
    return JobError::kValue;
  } catch (const std::exception& x) {
    message = x.what();
    return JobError::kOther;
  }
}

// std::out_of_range naming the first of idx[0..n) outside the tree or whose leaf is 0.
inline void require_filled(const SumTreeBase& tree, const int64_t* idx, int64_t n) {
  std::vector<double> leaves(static_cast<size_t>(n));
  tree.get(idx, n, leaves.data());  // checks the range; float32 leaves fill the first half
  const auto* narrow = reinterpret_cast<const float*>(leaves.data());
  for (int64_t i = 0; i < n; ++i) {
    const double leaf = tree.value_bytes() == 8 ? leaves[i] : static_cast<double>(narrow[i]);
    if (!(leaf > 0.0))
      throw std::out_of_range("index at position " + std::to_string(i) + " is " + std::to_string(idx[i]) +
                              ", which holds no stored transition");
  }
}

inline void apply_update(const JobContext& c, const Job& job, UpdateTask& u) {
  std::vector<int64_t> kept_idx;
  std::vector<double> kept_td;
  const int64_t* idx = u.idx;
  const double* td = u.td;
  int64_t n = u.n;
  if (c.written_at) {  // the epoch rule: entries of slots written after the batch was drawn are dropped
    for (int64_t i = 0; i < u.n; ++i) {
      const int64_t s = u.idx[i];
      if (s >= 0 && s < c.capacity && c.written_at[s] > u.epoch) ++u.dropped;
    }
    if (u.dropped) {
      kept_idx.reserve(static_cast<size_t>(u.n - u.dropped));
      kept_td.reserve(kept_idx.capacity());
      for (int64_t i = 0; i < u.n; ++i) {
        const int64_t s = u.idx[i];
        if (!(s >= 0 && s < c.capacity && c.written_at[s] > u.epoch)) {
          kept_idx.push_back(s);
          kept_td.push_back(u.td[i]);
        }
      }
      idx = kept_idx.data();
      td = kept_td.data();
      n = static_cast<int64_t>(kept_idx.size());
    }
  }
  std::unique_lock<std::shared_mutex> lock(c.tree->mutex());
  try {
    if (u.filled_only) require_filled(*c.tree, idx, n);
    if (u.undo_idx) {
      for (int64_t i = 0; i < n; ++i) {
        if (idx[i] < 0 || idx[i] >= c.capacity)
          throw std::out_of_range("index at position " + std::to_string(i) + " is " + std::to_string(idx[i]) +
                                  ", outside [0, " + std::to_string(c.capacity) + ")");
        u.undo_idx[i] = idx[i];
      }
      c.tree->get(idx, n, u.undo_leaves);
    }
    u.max_raw = c.tree->update_td(idx, td, n, job.alpha, job.eps, job.limit);
    u.kept = n;
  } catch (...) {
    u.error = error_kind(std::current_exception(), u.message);
    u.dropped = 0;  // a failed update changes nothing, and counts nothing
  }
}

inline void draw_batch(const JobContext& c, DrawTask& d) {
  try {
    {
      std::shared_lock<std::shared_mutex> lock(c.tree->mutex());
      if (!(c.tree->total() > 0.0))
        throw std::invalid_argument("the tree holds no priority mass (all priorities are 0)");
      c.tree->sample(d.uniforms, d.n, d.stratified, 1.0, d.idx_out, d.weight_out);
    }
    if (d.raised_out)
      for (int64_t i = 0; i < d.n; ++i) d.raised_out[i] = raised_ratio(d.weight_out[i], d.beta);
    gather_rows(c.fields, d.field_out, d.idx_out, d.n, d.n >= 1024 ? num_threads() : 1);
  } catch (...) {
    d.error = error_kind(std::current_exception(), d.message);
  }
}

}  // namespace detail

// Runs one job on the calling thread.
inline void run_job(const JobContext& c, Job& job) {
  for (UpdateTask& u : job.updates) detail::apply_update(c, job, u);
  if (job.draw.n > 0) detail::draw_batch(c, job.draw);
}

// How often a recently busy executor thread looks at its queue, and for how long after its last job it
// keeps looking before it sleeps until a submit wakes it: both follow the interval between submits
// (smoothed). It looks kPollsPerSubmit times per interval, within [kMin, kMax], every kUnseen until an
// interval was seen; a job is needed one submit after its own, so the thread finds it in time, and pays the
// same few wake-ups per job (each ~15-20 us of CPU on a 2-vCPU VM) whatever the learner's rhythm. With
// a fixed 100 us period, which the default timer slack stretched to ~150-200 us, 45-70% of the jobs
// were not done when a learner with 150 us steps came for them (now <1%), and one with 1 ms steps cost
// the idle core 160-175 us of CPU per step (now 71-74): benchmarks/bench_executor_rhythm.py. It keeps
// looking for kSpanIntervals intervals, within [kMinSpan, kMaxSpan]: a learner whose steps take longer
// than kMinSpan (SAC's ~13 ms) then finds the thread awake, where a fixed 10 ms span had the thread
// look ~20 times and sleep before each submit, whose wake-up cost that learner ~40-60 us with cold
// caches. A gap over kOutlier intervals (a rollout between training phases) or under 1/kOutlier of one
// is left out, unless kOutliersToFollow come in a row: then the rhythm has changed, and the interval
// starts afresh.
class PollRhythm {
 public:
  static constexpr int kPollsPerSubmit = 2;
  static constexpr std::chrono::microseconds kMin{25};
  static constexpr std::chrono::milliseconds kMax{10};
  static constexpr std::chrono::microseconds kUnseen{500};  // the period until an interval was seen
  static constexpr int kSpanIntervals = 3;
  static constexpr std::chrono::milliseconds kMinSpan{10};
  static constexpr std::chrono::milliseconds kMaxSpan{200};
  static constexpr int kOutlier = 8;
  static constexpr int kOutliersToFollow = 3;

  // A submit at `now`.
  void submitted(std::chrono::steady_clock::time_point now) {
    if (last_) {
      const auto gap = std::chrono::duration_cast<std::chrono::nanoseconds>(now - *last_);
      if (!interval_.count()) {
        interval_ = gap;
      } else if (gap <= kOutlier * interval_ && kOutlier * gap >= interval_) {
        interval_ = (3 * interval_ + gap) / 4;
        outliers_ = 0;
      } else if (++outliers_ >= kOutliersToFollow) {
        interval_ = gap;
        outliers_ = 0;
      }
    }
    last_ = now;
  }

  // Whether a submit at `now` comes within the span() of the last one (a thread woken now keeps looking).
  bool follows_within_span(std::chrono::steady_clock::time_point now) const {
    return last_ && now - *last_ < span();
  }

  std::chrono::nanoseconds period() const {
    if (!interval_.count()) return kUnseen;
    return std::clamp<std::chrono::nanoseconds>(interval_ / kPollsPerSubmit, kMin, kMax);
  }

  // For how long after its last job the thread looks at its queue rather than sleeps.
  std::chrono::nanoseconds span() const {
    return std::clamp<std::chrono::nanoseconds>(interval_ * kSpanIntervals, kMinSpan, kMaxSpan);
  }

 private:
  std::optional<std::chrono::steady_clock::time_point> last_;
  std::chrono::nanoseconds interval_{0};  // between submits, smoothed (0: none seen yet)
  int outliers_ = 0;  // gaps left out in a row
};

class Executor {
 public:
  explicit Executor(JobContext context) : context_(std::move(context)) { Registry::add(this); }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor() {
    stop();
    Registry::remove(this);
  }

  // Queues `job` (kept alive by the caller until wait(job) returns) for the thread. A thread that
  // ran a job within the rhythm's span() looks at the queue every poll period by itself where a core is
  // idle for it (cores_free()), so in a steady learner loop the caller wakes nobody: a futex wake-up of
  // another core costs the caller ~15 us warm on a 2-vCPU VM, ~45 us with cold caches, more than a
  // small job. A sleeping thread is started or woken (counted in wakeups()) with `wake`, and
  // without it only where a core is idle for it (then it polls for the jobs that follow); else the
  // job runs in wait() on the caller's thread, unless the thread, busy, reaches it first. Nor does a
  // job without `wake` wake a sleeping thread where it came a span or more after the last submit: the
  // thread would sleep again before the next one, so such a caller would pay a wake-up per job for
  // work it does in less time.
  void submit(Job* job, bool wake = true) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    const bool steady = rhythm_.follows_within_span(now);  // a thread woken now polls for the next
    rhythm_.submitted(now);
    queue_.push_back(job);
    if (stopped_ || (thread_alive_ && !sleeping_)) return;  // running or polling: it takes the job
    if (!wake && !cores_free(now)) return;
    if (!thread_alive_) {
      thread_ = std::thread([this] { loop(); });
      thread_alive_ = true;
      return;  // it looks at the queue first
    }
    if (!wake && !steady) return;
    ++wakeups_;
    lock.unlock();
    work_.notify_one();
  }

  // Returns once `job` is done. A job no thread has started yet runs here (caller
  // runs, as in the task pool: a worker the OS has not scheduled delays
  // nothing); one the thread is running is waited for, spinning briefly first.
  void wait(Job* job) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!job->done) {
      if (!running_ && !queue_.empty()) {
        run_front(lock);
      } else if (std::chrono::steady_clock::now() < spin_until) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      } else {
        done_.wait(lock);
      }
    }
  }

  // Ends the thread after its running job; jobs still queued run in wait().
  void stop() {
    std::lock_guard<std::mutex> one_stopper(stop_mutex_);
    std::unique_lock<std::mutex> lock(mutex_);
    stopped_ = true;
    if (!thread_alive_) return;
    lock.unlock();
    work_.notify_all();
    thread_.join();
    lock.lock();
    thread_alive_ = false;
    done_.notify_all();  // waiters run the queued jobs themselves now
  }

  bool done(const Job* job) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return job->done;
  }

  // Submits that had to wake the thread from its sleep (after a span without a job).
  int64_t wakeups() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return wakeups_;
  }

  // Whether the thread sleeps until a submit wakes it (rather than polling the queue).
  bool sleeping() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return sleeping_;
  }

  // The period the thread polls at now, and for how long after its last job it polls.
  std::chrono::nanoseconds poll_period() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return rhythm_.period();
  }
  std::chrono::nanoseconds poll_span() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return rhythm_.span();
  }

  bool thread_alive() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return thread_alive_;
  }

 private:
  void loop() {
#ifdef __linux__
    // Linux lets a timed wait overrun by the thread's timer slack (50 us by default): a 25 us poll would
    // become 75 us. This thread's own setting only.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
    std::unique_lock<std::mutex> lock(mutex_);
    auto last_job = std::chrono::steady_clock::now();
    while (!stopped_) {
      if (!running_ && !queue_.empty()) {
        run_front(lock);
        last_job = std::chrono::steady_clock::now();
      } else if (polling(last_job)) {
        work_.wait_for(lock, rhythm_.period());
      } else {
        sleeping_ = true;
        work_.wait(lock, [&] { return stopped_ || (!running_ && !queue_.empty()); });
        sleeping_ = false;
        last_job = std::chrono::steady_clock::now();
      }
    }
  }

  // Whether to look at the queue again in a poll period rather than sleep until a submit wakes this thread:
  // within the rhythm's span of its last job, and only while a core is idle for it. Hold mutex_.
  bool polling(std::chrono::steady_clock::time_point last_job) {
    const auto now = std::chrono::steady_clock::now();
    return now - last_job < rhythm_.span() && cores_free(now);
  }

  // Whether other processes leave this one two cores (its caller's and this thread's), as the thread
  // pool decides its threads. With every core busy, a thread waking every poll period shares a core with the
  // learner or the other process: measured on the 2-vCPU VM with another process busy, polling made a
  // small-batch learner loop 0.5-0.75x strict, against 0.84-0.92x waking it per job. Hold mutex_.
  bool cores_free(std::chrono::steady_clock::time_point now) { return idle_.available(now) + 0.3 >= 2.0; }

  // Runs the oldest job, holding `lock` before and after (not during).
  void run_front(std::unique_lock<std::mutex>& lock) {
    Job* job = queue_.front();
    running_ = true;
    lock.unlock();
    const int64_t start = thread_cpu_ns();
    run_job(context_, *job);
    job->run_ns = thread_cpu_ns() - start;
    lock.lock();
    queue_.pop_front();
    job->done = true;
    running_ = false;
    done_.notify_all();
    if (!queue_.empty()) work_.notify_one();
  }

  // This thread's CPU time: a job's cost that a loaded machine's preemptions do not inflate.
  static int64_t thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  }

  // How long a waiter polls a job the thread is running before it sleeps: a
  // learner that finds its batch nearly drawn skips a futex wake-up.
  static constexpr std::chrono::microseconds kSpin{100};

  // Every live executor, for the fork handlers (registered after the trees' ForkGuard,
  // so they run before it: a running job holds a tree's lock).
  class Registry {
   public:
    static void add(Executor* e) {
      Registry& r = instance();
      std::lock_guard<std::mutex> lock(r.mutex_);
      r.live_.insert(e);
    }
    static void remove(Executor* e) {
      Registry& r = instance();
      std::lock_guard<std::mutex> lock(r.mutex_);
      r.live_.erase(e);
    }

   private:
    static Registry& instance() {
      static Registry* registry = [] {
        pthread_atfork(&before_fork, &after_fork_parent, &after_fork_child);
        return new Registry();  // never destroyed: executors may outlive static destructors
      }();
      return *registry;
    }
    static void before_fork() {
      Registry& r = instance();
      r.mutex_.lock();
      for (Executor* e : r.live_) {
        std::unique_lock<std::mutex> lock(e->mutex_);
        e->done_.wait(lock, [&] { return !e->running_; });
        lock.release();  // held across fork: no job starts
      }
    }
    static void after_fork_parent() {
      Registry& r = instance();
      for (Executor* e : r.live_) e->mutex_.unlock();
      r.mutex_.unlock();
    }
    static void after_fork_child() {
      Registry& r = instance();
      for (Executor* e : r.live_) {
        new (&e->mutex_) std::mutex();
        new (&e->work_) std::condition_variable();
        new (&e->done_) std::condition_variable();
        if (e->thread_alive_) new std::thread(std::move(e->thread_));  // not ours here: never joined
        e->thread_alive_ = false;
        e->sleeping_ = false;
        e->running_ = false;
      }
      new (&r.mutex_) std::mutex();
    }

    std::mutex mutex_;
    std::unordered_set<Executor*> live_;
  };

  JobContext context_;
  mutable std::mutex mutex_;
  std::mutex stop_mutex_;
  std::condition_variable work_, done_;
  std::deque<Job*> queue_;  // submitted, not done; the front runs first
  std::thread thread_;
  bool thread_alive_ = false;
  bool running_ = false;
  bool stopped_ = false;
  bool sleeping_ = false;  // the thread waits for a notify (not polling)
  PollRhythm rhythm_;  // guarded by mutex_
  int64_t wakeups_ = 0;
  IdleCores idle_;  // guarded by mutex_
};

}  // namespace hetero_replay
