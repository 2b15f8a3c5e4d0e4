// ForkGuard: fork() while another thread updates a tree under the tree's lock.
// The child must get an unlocked tree in a consistent state (no update half
// applied) and be able to lock it, update it and sample from it.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "tree_util.hpp"

using namespace hr_test;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

constexpr int64_t kCapacity = 4096;

// In the child: checks the tree and uses it; the exit status says what failed.
int child_main(Tree<float>& tree) {
  {
    // Would block forever if the parent's updating thread held the lock at
    // fork and the child had inherited it locked.
    std::unique_lock<std::shared_mutex> lock(tree.t->mutex(), std::try_to_lock);
    if (!lock.owns_lock()) return 10;
    // Every update writes whole batches of integers: the total must equal the
    // sum of the leaves exactly, or fork caught an update half applied.
    double sum = 0.0;
    for (float v : tree.leaves()) sum += static_cast<double>(v);
    if (sum != tree.t->total()) return 11;
    tree.update({0, 1, 2}, {1.0f, 2.0f, 3.0f});  // small: serial
    // A batch large enough for the thread pool. TSan does not support new
    // threads after a multi-threaded fork, so its build stays serial here.
    if (kThreadSanitizer) hetero_replay::set_num_threads(1);
    std::vector<int64_t> idx;
    std::vector<float> v;
    for (int64_t i = 0; i < kCapacity; ++i) {
      idx.push_back(i);
      v.push_back(static_cast<float>(i % 3));
    }
    tree.update(idx, v);
    if (tree.t->total() != static_cast<double>(kCapacity / 3 * 3)) return 12;
  }
  std::shared_lock<std::shared_mutex> reader(tree.t->mutex());
  std::vector<int64_t> idx;
  std::vector<float> w;
  tree.sample(std::vector<double>(1000, 0.5), true, 0.4, idx, w);
  for (int64_t i : idx)
    if (i % 3 == 0) return 13;  // zero leaves are never drawn
  return 0;
}

// Waits up to `seconds` for `pid`; kills it on timeout. Returns its wait status, or -1.
int wait_with_timeout(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

TEST_CASE(fork_guard, fork_while_another_thread_updates) {
  ThreadsScope threads(2);
  Tree<float> tree(kCapacity, 16);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> updates{0};
  std::thread updater([&] {
    std::vector<int64_t> idx(2048);
    std::vector<float> v(2048);
    for (int64_t round = 0; !stop.load(); ++round) {
      for (size_t i = 0; i < idx.size(); ++i) {
        idx[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(round)) % kCapacity);
        v[i] = static_cast<float>((i + static_cast<size_t>(round)) % 50);
      }
      std::unique_lock<std::shared_mutex> lock(tree.t->mutex());
      tree.update(idx, v);  // >= 512 items: the parallel update, on the pool
      updates.fetch_add(1);
    }
  });
  while (updates.load() < 3) std::this_thread::yield();

  const int kForks = kThreadSanitizer ? 5 : 20;
  for (int k = 0; k < kForks; ++k) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) _exit(child_main(tree));
    CHECK(pid > 0);
    if (pid < 0) break;
    const int status = wait_with_timeout(pid, 60.0);
    if (status == -1) {
      fail(__FILE__, __LINE__, "fork " + std::to_string(k) + ": the child hung (deadlock) and was killed");
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fail(__FILE__, __LINE__,
           "fork " + std::to_string(k) + ": child " +
               (WIFEXITED(status) ? "exited with " + std::to_string(WEXITSTATUS(status))
                                  : "killed by signal " + std::to_string(WTERMSIG(status))));
    }
    // The parent's tree is still usable, and the updater still runs.
    const int64_t seen = updates.load();
    while (updates.load() == seen) std::this_thread::yield();
  }
  stop.store(true);
  updater.join();
  std::shared_lock<std::shared_mutex> lock(tree.t->mutex());
  double sum = 0.0;
  for (float v : tree.leaves()) sum += static_cast<double>(v);
  CHECK_EQ(sum, tree.t->total());
}
