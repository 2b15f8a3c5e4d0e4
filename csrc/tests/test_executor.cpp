// The relaxed pipeline's native executor: jobs run on its thread give the same
// bits as the same jobs run serially (updates with the epoch rule and undo
// snapshots, draws, gathers), failed steps change nothing, and waiting after
// stop() runs the queued jobs on the caller. Under TSan this also checks that
// the executor's thread and the submitting thread share no unsynchronised data.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "check.hpp"
#include "hetero_replay/executor.hpp"
#include "tree_util.hpp"

using namespace hr_test;
using hetero_replay::Executor;
using hetero_replay::Job;
using hetero_replay::JobContext;
using hetero_replay::JobError;
using hetero_replay::RowField;
using hetero_replay::UpdateTask;

namespace {

constexpr int64_t kCapacity = 5000, kRowBytes = 24;

// Everything one run of jobs reads and writes: a tree, rows, write epochs and per-job buffers.
struct Run {
  Tree<float> tree{kCapacity, 16};
  std::vector<char> rows = std::vector<char>(kCapacity * kRowBytes);
  std::vector<int64_t> written_at = std::vector<int64_t>(kCapacity, 0);
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<std::vector<double>> uniforms, tds;
  std::vector<std::vector<int64_t>> idxs, idx_out, undo_idx;
  std::vector<std::vector<float>> w_out, undo_leaves;
  std::vector<std::vector<char>> rows_out;

  Run() {
    for (int64_t i = 0; i < kCapacity * kRowBytes; ++i) rows[i] = static_cast<char>(i * 7 + 3);
    std::vector<int64_t> all(kCapacity);
    std::vector<float> ones(kCapacity, 1.0f);
    for (int64_t i = 0; i < kCapacity; ++i) all[i] = i;
    tree.update(all, ones);
    for (int64_t i = 0; i < kCapacity; i += 3) written_at[i] = 5;  // rewritten after epoch 4
  }

  JobContext context() {
    JobContext c;
    c.tree = tree.t.get();
    c.fields = {RowField{rows.data(), kRowBytes, 16}, RowField{rows.data() + 16, kRowBytes, 8}};
    c.written_at = written_at.data();
    c.capacity = kCapacity;
    return c;
  }

  // Job j: one update (a NaN TD error in job 7: refused), epoch 4 or 9, undo kept on odd jobs; then a draw of
  // n.
  Job* make_job(int j, int64_t n) {
    std::mt19937_64 rng(static_cast<uint64_t>(j));
    std::uniform_int_distribution<int64_t> slot(0, kCapacity - 1);
    std::uniform_real_distribution<double> mag(0.0, 3.0);
    const int64_t m = 200 + j;
    idxs.emplace_back(m);
    tds.emplace_back(m);
    for (int64_t i = 0; i < m; ++i) {
      idxs.back()[i] = slot(rng);
      tds.back()[i] = mag(rng);
    }
    if (j == 7) tds.back()[5] = std::numeric_limits<double>::quiet_NaN();
    undo_idx.emplace_back(m);
    undo_leaves.emplace_back(m);
    uniforms.emplace_back(n);
    for (double& u : uniforms.back()) u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    idx_out.emplace_back(n);
    w_out.emplace_back(n);
    rows_out.emplace_back(n * kRowBytes);
    auto job = std::make_unique<Job>();
    job->alpha = 0.6;
    job->eps = 1e-6;
    job->limit = kCapacity;
    UpdateTask u;
    u.idx = idxs.back().data();
    u.td = tds.back().data();
    u.n = m;
    u.epoch = j % 2 ? 4 : 9;
    if (j % 2) {
      u.undo_idx = undo_idx.back().data();
      u.undo_leaves = undo_leaves.back().data();
    }
    job->updates.push_back(u);
    job->draw.n = n;
    job->draw.uniforms = uniforms.back().data();
    job->draw.idx_out = idx_out.back().data();
    job->draw.weight_out = w_out.back().data();
    job->draw.field_out = {rows_out.back().data(), rows_out.back().data() + n * 16};
    jobs.push_back(std::move(job));
    return jobs.back().get();
  }
};

constexpr int kJobs = 24;
int64_t batch(int j) { return j % 3 == 0 ? 2048 : 64; }

void check_same(Run& a, Run& b, int jobs = kJobs) {
  CHECK(same_bits(a.tree.leaves(), b.tree.leaves()));
  for (int j = 0; j < jobs; ++j) {
    const UpdateTask &ua = a.jobs[j]->updates[0], &ub = b.jobs[j]->updates[0];
    CHECK_EQ(ua.dropped, ub.dropped);
    CHECK_EQ(ua.kept, ub.kept);
    CHECK_EQ(ua.max_raw, ub.max_raw);
    CHECK(ua.error == ub.error);
    CHECK(a.idx_out[j] == b.idx_out[j]);
    CHECK(same_bits(a.w_out[j], b.w_out[j]));
    CHECK(a.rows_out[j] == b.rows_out[j]);
    CHECK(same_bits(a.undo_leaves[j], b.undo_leaves[j]));
  }
}

}  // namespace

TEST_CASE(executor, thread_gives_the_serial_bits) {
  Run serial, threaded;
  const JobContext sc = serial.context();
  for (int j = 0; j < kJobs; ++j) hetero_replay::run_job(sc, *serial.make_job(j, batch(j)));
  {
    Executor ex(threaded.context());
    std::vector<Job*> jobs;
    for (int j = 0; j < kJobs; ++j) {
      jobs.push_back(threaded.make_job(j, batch(j)));
      ex.submit(jobs.back());
      if (j % 4 == 3) ex.wait(jobs[j - 2]);  // the submitter waits now and then, as the learner does
    }
    for (Job* job : jobs) ex.wait(job);
  }
  check_same(serial, threaded);
  // The epoch rule dropped the entries of rewritten slots (epoch 4 jobs), and the NaN job failed whole.
  CHECK(serial.jobs[1]->updates[0].dropped > 0);
  CHECK_EQ(serial.jobs[2]->updates[0].dropped, 0);
  CHECK(serial.jobs[7]->updates[0].error == JobError::kValue);
  CHECK_EQ(serial.jobs[7]->updates[0].dropped, 0);
  // A gathered row is the source row of its index.
  const Job& j0 = *serial.jobs[0];
  for (int64_t i = 0; i < j0.draw.n; ++i)
    CHECK(std::memcmp(serial.rows_out[0].data() + i * 16, serial.rows.data() + j0.draw.idx_out[i] * kRowBytes,
                      16) == 0);
}

TEST_CASE(executor, after_stop_wait_runs_the_queued_jobs) {
  Run serial, stopped;
  const JobContext sc = serial.context();
  for (int j = 0; j < kJobs; ++j) hetero_replay::run_job(sc, *serial.make_job(j, batch(j)));
  Executor ex(stopped.context());
  std::vector<Job*> jobs;
  for (int j = 0; j < kJobs; ++j) {
    jobs.push_back(stopped.make_job(j, batch(j)));
    ex.submit(jobs.back());
    if (j == kJobs / 2) ex.stop();  // later submits start no thread
  }
  CHECK(!ex.thread_alive());
  ex.wait(jobs.back());
  for (Job* job : jobs) CHECK(ex.done(job));
  check_same(serial, stopped);
}

TEST_CASE(executor, unwoken_jobs_run_on_the_thread_or_the_waiter_and_mix_with_woken_ones) {
  Run serial, mixed;
  const JobContext sc = serial.context();
  for (int j = 0; j < kJobs; ++j) hetero_replay::run_job(sc, *serial.make_job(j, batch(j)));
  Executor ex(mixed.context());
  std::vector<Job*> jobs;
  for (int j = 0; j < kJobs / 2; ++j) {
    jobs.push_back(mixed.make_job(j, batch(j)));
    ex.submit(jobs.back(), /*wake=*/false);
  }
  // A thread was started for them only if a core is idle for it; whichever runs them first, the
  // waiter does what is left, in order.
  ex.wait(jobs[1]);
  CHECK(ex.done(jobs[0]) && ex.done(jobs[1]));
  for (int j = kJobs / 2; j < kJobs; ++j) {
    jobs.push_back(mixed.make_job(j, batch(j)));
    ex.submit(jobs.back(), /*wake=*/j % 2 == 0);  // the woken thread takes the queue in order
  }
  for (Job* job : jobs) ex.wait(job);
  check_same(serial, mixed);
}

TEST_CASE(executor, a_recently_busy_thread_takes_jobs_unwoken_and_sleeps_when_idle) {
  Run serial, polled;
  const JobContext sc = serial.context();
  for (int j = 0; j < kJobs; ++j) hetero_replay::run_job(sc, *serial.make_job(j, batch(j)));
  Executor ex(polled.context());
  // The first submit starts the thread; after each job it polls the queue for the rhythm's span.
  auto run_on_thread = [&](Job* job) {
    ex.submit(job);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!ex.done(job) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // never wait(): that would run it here
    CHECK(ex.done(job));
  };
  hetero_replay::IdleCores idle;  // what the thread sees: it polls only with two cores to itself
  idle.available(std::chrono::steady_clock::now());
  for (int j = 0; j < kJobs - 1; ++j) run_on_thread(polled.make_job(j, batch(j)));
  std::this_thread::sleep_for(std::chrono::milliseconds(120));  // a whole window of IdleCores
  if (idle.available(std::chrono::steady_clock::now()) >= 1.95) {
    // Each job came within the span of the one before (unless this thread was kept off the CPU that
    // long, which a loaded machine may do now and then): the polling thread took it with no wake-up.
    CHECK(ex.wakeups() <= 3);
  }
  const int64_t before = ex.wakeups();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ex.sleeping() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(ex.poll_span());
  CHECK(ex.sleeping());  // idle past its span: it stopped polling
  run_on_thread(polled.make_job(kJobs - 1, batch(kJobs - 1)));
  CHECK_EQ(ex.wakeups(), before + 1);  // and the next submit woke it
  check_same(serial, polled);
}

TEST_CASE(executor, the_thread_polls_twice_per_interval_between_submits_for_three_intervals_within_bounds) {
  using std::chrono::microseconds;
  using std::chrono::milliseconds;
  using Rhythm = hetero_replay::PollRhythm;
  Rhythm rhythm;
  CHECK(rhythm.period() == Rhythm::kUnseen);  // nothing seen yet
  CHECK(rhythm.span() == Rhythm::kMinSpan);
  auto t = std::chrono::steady_clock::time_point{} + std::chrono::seconds(1);
  rhythm.submitted(t);
  CHECK(rhythm.period() == Rhythm::kUnseen);  // one submit is no interval
  for (int i = 0; i < 40; ++i) rhythm.submitted(t += microseconds(200));
  CHECK(rhythm.period() == microseconds(100));
  CHECK(rhythm.span() == Rhythm::kMinSpan);  // three intervals are less
  rhythm.submitted(t += milliseconds(50));  // a rollout: left out
  CHECK(rhythm.period() == microseconds(100));
  rhythm.submitted(t += microseconds(10));  // and a burst (two draws released at once)
  CHECK(rhythm.period() == microseconds(100));
  rhythm.submitted(t += microseconds(600));  // smoothed: one gap moves it a quarter
  CHECK(rhythm.period() == microseconds(150));
  for (int i = 0; i < 40; ++i) rhythm.submitted(t += microseconds(10));  // bursts in a row: a new rhythm
  CHECK(rhythm.period() == Rhythm::kMin);
  for (int i = 0; i < 40; ++i) rhythm.submitted(t += milliseconds(5));  // a slower learner
  CHECK(rhythm.period() == microseconds(2500));
  CHECK(rhythm.span() == milliseconds(15));
  for (int i = 0; i < 40; ++i) rhythm.submitted(t += milliseconds(13));  // SAC's gradient steps
  const auto near = [](auto a, auto b) { return a > b * 0.99 && a < b * 1.01; };
  CHECK(near(rhythm.period(), std::chrono::nanoseconds(microseconds(6500))));
  CHECK(near(rhythm.span(), std::chrono::nanoseconds(milliseconds(39))));
  CHECK(rhythm.follows_within_span(t + milliseconds(30)));  // the thread is still polling then
  CHECK(!rhythm.follows_within_span(t + milliseconds(40)));
  for (int i = 0; i < 40; ++i) rhythm.submitted(t += milliseconds(150));
  CHECK(rhythm.period() == Rhythm::kMax);
  CHECK(rhythm.span() == Rhythm::kMaxSpan);
}

TEST_CASE(executor, where_a_core_is_idle_an_unwoken_job_goes_to_the_thread) {
  hetero_replay::IdleCores idle;
  idle.available(std::chrono::steady_clock::now());
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  if (idle.available(std::chrono::steady_clock::now()) < 1.95) return;  // a busy machine: the caller's, maybe
  Run run;
  Executor ex(run.context());
  Job* job = run.make_job(0, batch(0));
  ex.submit(job, /*wake=*/false);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ex.done(job) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // never wait(): that would run it here
  CHECK(ex.done(job));
  CHECK(ex.thread_alive());
}

TEST_CASE(executor, an_unwoken_job_wakes_a_sleeping_thread_only_within_the_poll_span_of_the_last) {
  using Rhythm = hetero_replay::PollRhythm;
  hetero_replay::IdleCores idle;
  idle.available(std::chrono::steady_clock::now());
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  if (idle.available(std::chrono::steady_clock::now()) < 1.95) return;  // a busy machine: never woken anyway
  Run serial, run;
  const JobContext sc = serial.context();
  for (int j = 0; j < 3; ++j) hetero_replay::run_job(sc, *serial.make_job(j, batch(j)));
  Executor ex(run.context());
  Job* first = run.make_job(0, batch(0));
  ex.submit(first);  // starts the thread
  ex.wait(first);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ex.sleeping() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(ex.poll_span());
  CHECK(ex.sleeping());
  // Long after the last submit (a slow learner): the job waits for the caller.
  const int64_t before = ex.wakeups();
  Job* slow = run.make_job(1, batch(1));
  ex.submit(slow, /*wake=*/false);
  CHECK_EQ(ex.wakeups(), before);  // (only a spurious wake-up of the thread would run it now)
  // Right after it (a steady learner): the thread is woken, and polls for the jobs that follow.
  const auto after_slow = std::chrono::steady_clock::now();
  Job* steady = run.make_job(2, batch(2));
  ex.submit(steady, /*wake=*/false);
  const bool soon = std::chrono::steady_clock::now() - after_slow < Rhythm::kMinSpan / 2;
  CHECK(ex.wakeups() <= before + 1);
  // (Unless this thread was kept off the CPU that long, or the machine got busy meanwhile.)
  if (soon && idle.available(std::chrono::steady_clock::now()) >= 1.95) CHECK_EQ(ex.wakeups(), before + 1);
  ex.wait(steady);
  CHECK(ex.done(slow));
  check_same(serial, run, 3);
}

TEST_CASE(executor, a_draw_from_an_empty_tree_fails_and_writes_nothing) {
  Run run;
  std::vector<int64_t> all(kCapacity);
  for (int64_t i = 0; i < kCapacity; ++i) all[i] = i;
  run.tree.update(all, std::vector<float>(kCapacity, 0.0f));
  Job* job = run.make_job(0, 8);
  job->updates.clear();
  std::vector<int64_t> before = run.idx_out.back();
  Executor ex(run.context());
  ex.submit(job);
  ex.wait(job);
  CHECK(job->draw.error == JobError::kValue);
  CHECK(run.idx_out.back() == before);
}

TEST_CASE(executor, a_filled_only_update_refuses_an_empty_slot_and_changes_nothing) {
  Run run;
  run.tree.update(std::vector<int64_t>{7}, std::vector<float>{0.0f});  // slot 7: cleared
  const std::vector<float> before = run.tree.leaves();
  Job job;
  job.alpha = 1.0;
  job.eps = 0.5;
  job.limit = kCapacity;
  std::vector<int64_t> idx{1, 7, 2};
  std::vector<double> td{1.0, 2.0, 3.0};
  UpdateTask u;
  u.idx = idx.data();
  u.td = td.data();
  u.n = 3;
  u.epoch = 9;
  u.filled_only = true;
  hetero_replay::detail::apply_update(run.context(), job, u);
  CHECK(u.error == JobError::kIndex);
  CHECK(u.message.find("position 1 is 7, which holds no stored transition") != std::string::npos);
  CHECK(same_bits(run.tree.leaves(), before));
  idx[1] = 4;  // filled: the update lands, the epoch rule still applies (slot 1 not rewritten, 2 neither)
  UpdateTask ok = u;
  ok.error = JobError::kNone;
  ok.message.clear();
  hetero_replay::detail::apply_update(run.context(), job, ok);
  CHECK(ok.error == JobError::kNone && ok.kept == 3 && ok.max_raw == 3.5);
  CHECK(run.tree.leaves()[4] == 2.5f);
}
