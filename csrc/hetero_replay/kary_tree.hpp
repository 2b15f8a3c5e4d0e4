// K-ary sum tree with an exact positive-minimum, for prioritized replay on the CPU.
//
// Layout: one array per level, level 0 = leaves. Every level is padded to a
// multiple of K and aligned so that each sibling group starts a cache line: for
// float32 and K = 16 a group is exactly one 64-byte line; for float64 and
// K = 16 a group is two adjacent lines in a 128-byte-aligned pair (which the
// adjacent-line prefetcher fetches together); K = 8 gives one line for float64.
// The minimum tree stores only internal levels: its leaves are the sum tree's.
//
// Batch operations release no lock on the data they read: callers (the
// bindings) serialise writers against readers with `mutex()`. Every tree's
// mutex is taken around fork(), so a child never inherits one held by a
// thread that does not exist there (see ForkGuard).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "descent.hpp"
#include "format.hpp"
#include "group_simd.hpp"
#include "priority_transform.hpp"
#include "task_pool.hpp"

namespace hetero_replay {

// ---- threads ---------------------------------------------------------------

inline int num_threads() { return TaskPool::instance().threads(); }
inline void set_num_threads(int n) { TaskPool::instance().set_threads(n); }
inline void use_default_threads() { TaskPool::instance().use_default(); }

// Below these batch sizes handing work to other threads costs more than it
// saves (measured on 2-core x86 machines, see benchmarks/).
constexpr int64_t kParallelMinSearches = 512;
constexpr int64_t kParallelMinUpdates = 512;
// Descents in flight per thread: enough independent cache misses to hide
// memory latency, few enough that their state stays in registers and L1.
constexpr int kInterleave = 16;

// ---- storage ---------------------------------------------------------------

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
std::unique_ptr<T[], AlignedFree> aligned_array(int64_t n, T fill) {
  constexpr size_t kAlign = 128;
  size_t bytes = static_cast<size_t>(n) * sizeof(T);
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  T* p = static_cast<T*>(std::aligned_alloc(kAlign, bytes));
  if (!p) throw std::bad_alloc();
  std::fill(p, p + n, fill);
  return std::unique_ptr<T[], AlignedFree>(p);
}

// ---- limits ----------------------------------------------------------------

// Largest capacity: 2^40 leaves (4 TiB of float32 priorities) is far beyond
// any replay buffer, and keeps every level-size computation far from int64
// overflow.
constexpr int64_t kMaxCapacity = int64_t{1} << 40;

// Largest leaf a tree of `capacity` leaves accepts: capacity such leaves sum
// to at most half the type's largest finite value, so no node sum (nor the
// total) can overflow to inf, rounding included.
template <typename T>
double largest_leaf(int64_t capacity) {
  return static_cast<double>(std::numeric_limits<T>::max()) / 2.0 / static_cast<double>(capacity);
}

// ---- type-erased interface (what the Python bindings see) -------------------

class SumTreeBase;

// Keeps fork() from copying a tree lock held by another thread into the child
// (where that thread does not exist, so the lock would never be released):
// before fork every live tree's lock is taken, as a writer, so no operation is
// in flight; after it both processes release them. Registered after the
// thread pool's handlers, so it runs first before fork and waits for updates
// that use the pool to finish.
class ForkGuard {
 public:
  static void add(SumTreeBase* tree);
  static void remove(SumTreeBase* tree);

 private:
  static ForkGuard& instance();
  static void before_fork();
  static void after_fork_parent();
  static void after_fork_child();

  std::mutex mutex_;
  std::unordered_set<SumTreeBase*> trees_;
};

class SumTreeBase {
 public:
  SumTreeBase() { ForkGuard::add(this); }
  SumTreeBase(const SumTreeBase&) = delete;
  SumTreeBase& operator=(const SumTreeBase&) = delete;
  virtual ~SumTreeBase() { ForkGuard::remove(this); }
  virtual int64_t capacity() const = 0;
  virtual int fanout() const = 0;
  virtual int value_bytes() const = 0;  // 4: float32, 8: float64
  virtual int num_levels() const = 0;
  virtual double total() const = 0;
  virtual double min() const = 0;  // over leaves > 0; +inf if none
  virtual double max_leaf() const = 0;  // largest leaf accepted

  // `values` point to the tree's value type. All inputs are validated before
  // anything is written: on error the tree is unchanged.
  virtual void update(const int64_t* idx, const void* values, int64_t n) = 0;
  // Leaves from |TD errors|: (td + eps)^alpha; indices must lie in [0, limit).
  // Returns max(td + eps). Validates everything before writing.
  virtual double update_td(const int64_t* idx, const double* td, int64_t n, double alpha, double eps,
                           int64_t limit) = 0;
  virtual void load_leaves(const void* values) = 0;  // all `capacity` leaves
  virtual void get(const int64_t* idx, int64_t n, void* out) const = 0;
  virtual void leaves(void* out) const = 0;
  virtual void find(const double* mass, int64_t n, int64_t* out) const = 0;
  virtual void sample(const double* u, int64_t n, bool stratified, double beta, int64_t* idx_out,
                      float* weight_out) const = 0;

  std::shared_mutex& mutex() const { return mutex_; }
  // After fork, in the child only: a fresh, unlocked mutex.
  void reset_mutex_in_child() { new (&mutex_) std::shared_mutex(); }

 private:
  mutable std::shared_mutex mutex_;
};

inline ForkGuard& ForkGuard::instance() {
  static ForkGuard* guard = [] {
    TaskPool::instance();  // the pool registers its fork handlers first
    pthread_atfork(&ForkGuard::before_fork, &ForkGuard::after_fork_parent, &ForkGuard::after_fork_child);
    return new ForkGuard();  // never destroyed: trees may outlive static destructors
  }();
  return *guard;
}

inline void ForkGuard::add(SumTreeBase* tree) {
  ForkGuard& g = instance();
  std::lock_guard<std::mutex> lock(g.mutex_);
  g.trees_.insert(tree);
}

inline void ForkGuard::remove(SumTreeBase* tree) {
  ForkGuard& g = instance();
  std::lock_guard<std::mutex> lock(g.mutex_);
  g.trees_.erase(tree);
}

inline void ForkGuard::before_fork() {
  ForkGuard& g = instance();
  g.mutex_.lock();
  for (SumTreeBase* t : g.trees_) t->mutex().lock();
}

inline void ForkGuard::after_fork_parent() {
  ForkGuard& g = instance();
  for (SumTreeBase* t : g.trees_) t->mutex().unlock();
  g.mutex_.unlock();
}

inline void ForkGuard::after_fork_child() {
  ForkGuard& g = instance();
  for (SumTreeBase* t : g.trees_) t->reset_mutex_in_child();
  new (&g.mutex_) std::mutex();
}

// ---- the tree ----------------------------------------------------------------

template <typename T, int K>
class KaryTree final : public SumTreeBase {
  static_assert(K >= 2 && (K & (K - 1)) == 0, "fanout must be a power of two");

 public:
  explicit KaryTree(int64_t capacity) : capacity_(capacity), max_leaf_(largest_leaf<T>(capacity)) {
    if (capacity < 1 || capacity > kMaxCapacity)
      throw std::invalid_argument("capacity must be in [1, 2**40], got " + std::to_string(capacity));
    int64_t n = round_up(capacity);
    while (true) {
      level_size_.push_back(n);
      if (n == K) break;
      n = round_up(n / K);
    }
    if (num_levels() > kMaxLevels) throw std::invalid_argument("capacity too large for fanout");
    // A level is allocated up to the children of its parent level's padding,
    // so every group a parent points at exists (zero mass, +inf minimum).
    for (int l = 0; l < num_levels(); ++l) {
      const int64_t alloc = l + 1 < num_levels() ? level_size_[l + 1] * K : K;
      values_.push_back(aligned_array<T>(alloc, T(0)));
      mins_.push_back(aligned_array<T>(l == 0 ? 1 : alloc, inf()));
      prefix_.push_back(aligned_array<double>(l == 0 ? 1 : alloc, 0.0));
      stamps_.emplace_back(l == 0 ? 0 : level_size_[l], 0u);
    }
  }

  int64_t capacity() const override { return capacity_; }
  int fanout() const override { return K; }
  int value_bytes() const override { return sizeof(T); }
  int num_levels() const override { return static_cast<int>(level_size_.size()); }
  double total() const override { return total_; }
  double min() const override { return static_cast<double>(min_); }
  double max_leaf() const override { return max_leaf_; }

  void update(const int64_t* idx, const void* values, int64_t n) override {
    const T* v = static_cast<const T*>(values);
    validate_indices(idx, n);
    validate_values(v, n);
    apply(idx, v, n);
  }

  double update_td(const int64_t* idx, const double* td, int64_t n, double alpha, double eps,
                   int64_t limit) override {
    validate_indices(idx, n, std::min(limit, capacity_));
    std::vector<T> priorities(static_cast<size_t>(n));
    const int threads = n >= kParallelMinUpdates ? num_threads() : 1;
    const double max_raw = priorities_from_td(td, n, alpha, eps, priorities.data(), threads);
    for (int64_t i = 0; i < n; ++i) {
      if (!(static_cast<double>(priorities[i]) <= max_leaf_))
        throw std::invalid_argument("TD error at position " + std::to_string(i) + " is " + exact(td[i]) +
                                    ": its priority (td + eps) ** alpha = " + exact(priorities[i]) +
                                    " exceeds the largest priority this tree can sum, " + exact(max_leaf_) +
                                    " (the largest " + (sizeof(T) == 4 ? "float32" : "float64") +
                                    " / (2 * capacity " + std::to_string(capacity_) + "))");
    }
    apply(idx, priorities.data(), n);
    return max_raw;
  }

  void load_leaves(const void* values) override {
    const T* v = static_cast<const T*>(values);
    validate_values(v, capacity_);
    std::copy(v, v + capacity_, values_[0].get());
    for (int l = 1; l < num_levels(); ++l) {
      const int64_t n = level_size_[l];
      constexpr int64_t kChunk = 4096;
      parallel_for((n + kChunk - 1) / kChunk, num_threads(), [&](int64_t c) {
        for (int64_t node = c * kChunk; node < std::min(n, (c + 1) * kChunk); ++node) recompute(l, node);
      });
    }
    refresh_root();
  }

  void get(const int64_t* idx, int64_t n, void* out) const override {
    validate_indices(idx, n);
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = values_[0][idx[i]];
  }

  void leaves(void* out) const override {
    std::copy(values_[0].get(), values_[0].get() + capacity_, static_cast<T*>(out));
  }

  void find(const double* mass, int64_t n, int64_t* out) const override {
    require_mass();
    for (int64_t i = 0; i < n; ++i) {
      if (!(mass[i] >= 0.0 && mass[i] < total_))
        throw std::invalid_argument("mass at position " + std::to_string(i) + " is " + exact(mass[i]) +
                                    ", outside [0, total=" + exact(total_) + ")");
    }
    run_batched(n, [&](int64_t i) { return mass[i]; }, out, nullptr, 0.0);
  }

  void sample(const double* u, int64_t n, bool stratified, double beta, int64_t* idx_out,
              float* weight_out) const override {
    require_mass();
    const double total = total_;
    const auto mass_of = [=](int64_t i) { return draw_mass(i, n, u[i], total, stratified); };
    run_batched(n, mass_of, idx_out, weight_out, beta);
  }

 private:
  static constexpr T inf() { return std::numeric_limits<T>::infinity(); }
  static int64_t round_up(int64_t n) { return std::max<int64_t>(K, (n + K - 1) / K * K); }

  static void prefetch_group(const void* p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(p) + off);
  }

  TreeView<T> view() const {
    TreeView<T> v{};
    v.leaves = values_[0].get();
    v.num_levels = num_levels();
    for (int l = 1; l < v.num_levels; ++l) v.prefix[l] = prefix_[l].get();
    return v;
  }

  void require_mass() const {
    if (!(total_ > 0.0))
      throw std::invalid_argument("the tree holds no priority mass (all priorities are 0)");
  }

  void validate_indices(const int64_t* idx, int64_t n) const { validate_indices(idx, n, capacity_); }

  static void validate_indices(const int64_t* idx, int64_t n, int64_t limit) {
    for (int64_t i = 0; i < n; ++i) {
      if (idx[i] < 0 || idx[i] >= limit)
        throw std::out_of_range("index at position " + std::to_string(i) + " is " + std::to_string(idx[i]) +
                                ", outside [0, " + std::to_string(limit) + ")");
    }
  }

  void validate_values(const T* v, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) {
      if (!(v[i] >= T(0) && static_cast<double>(v[i]) <= max_leaf_)) {
        const std::string what = std::isnan(v[i]) ? "nan" : exact(v[i]);
        throw std::invalid_argument("priority at position " + std::to_string(i) + " is " + what +
                                    "; priorities must be >= 0 and <= " + exact(max_leaf_) +
                                    " (the largest " + (sizeof(T) == 4 ? "float32" : "float64") +
                                    " / (2 * capacity " + std::to_string(capacity_) +
                                    "), so the tree's sums stay finite)");
      }
    }
  }

  void next_epoch() {
    if (++epoch_ == 0) {  // wrapped after 2^32 updates: forget old stamps
      for (auto& s : stamps_) std::fill(s.begin(), s.end(), 0u);
      epoch_ = 1;
    }
  }

  // Node `node` of level l >= 1 from its child group at level l - 1: the
  // group's prefix sums (kept for descents above the leaves), the node's value
  // (the last prefix sum) and its positive minimum.
  void recompute(int l, int64_t node) {
    const int64_t base = node * K;
    if (l == 1) {
      const T* c = values_[0].get() + base;
      if constexpr (sizeof(T) == 4) {
        values_[1][node] = static_cast<T>(leaf_group_sum_min<K>(c, &mins_[1][node]));
      } else {
        double pre[K];
        group_prefix<T, K>(c, pre);
        values_[1][node] = pre[K - 1];
        mins_[1][node] = group_min<T, K>(c, true);
      }
    } else {
      double* pre = prefix_[l - 1].get() + base;
      group_prefix<T, K>(values_[l - 1].get() + base, pre);
      values_[l][node] = static_cast<T>(pre[K - 1]);
      mins_[l][node] = inner_group_min<T, K>(mins_[l - 1].get() + base);
    }
  }

  // Writes validated leaves and refreshes their ancestors.
  void apply(const int64_t* idx, const T* v, int64_t n) {
    if (n == 0) return;
    next_epoch();
    const int top = num_levels() - 1;
    const int threads = (n >= kParallelMinUpdates && top > 0) ? num_threads() : 1;
    if (threads == 1) {
      update_range(idx, v, n, 0, level_size_[0], top);
    } else {
      // Owner computes: each part owns a contiguous run of the nodes of a
      // split level and everything below them, so no two parts write the
      // same node and each keeps batch order (last write wins) for its leaves.
      // One part per thread: the caller claims part 0 first and a running
      // worker the next, so from call to call the same core tends to write
      // the same subtrees and fewer written cache lines move between the
      // cores' private caches (2 threads, sample + update, N <= 1e6: ~5%
      // faster than two parts per thread). Random leaves spread evenly
      // enough; the few nodes above the split level are refreshed serially.
      const int parts = threads;
      const int split = split_level(parts);
      int64_t span = 1;
      for (int l = 0; l < split; ++l) span *= K;
      const int64_t nodes = real_nodes(split);
      parallel_for(parts, threads, [&](int64_t p) {
        update_range(idx, v, n, nodes * p / parts * span, nodes * (p + 1) / parts * span, split);
      });
      for (int l = split + 1; l <= top; ++l)
        for (int64_t node = 0; node < real_nodes(l); ++node) recompute(l, node);
    }
    refresh_root();
  }

  // Nodes of level l that cover real leaves (the rest is padding).
  int64_t real_nodes(int l) const {
    int64_t n = capacity_;
    for (int i = 0; i < l; ++i) n = (n + K - 1) / K;
    return n;
  }

  // Highest level with enough real nodes to share among `parts` evenly.
  int split_level(int parts) const {
    int l = num_levels() - 1;
    while (l > 0 && real_nodes(l) < 4 * parts) --l;
    return l;
  }

  // Applies the batch entries whose leaf lies in [lo, hi), then refreshes
  // their ancestors up to level `max_level`.
  void update_range(const int64_t* idx, const T* v, int64_t n, int64_t lo, int64_t hi, int max_level) {
    T* leaves = values_[0].get();
    if (max_level == 0) {  // the leaves are the top group
      for (int64_t i = 0; i < n; ++i)
        if (idx[i] >= lo && idx[i] < hi) leaves[idx[i]] = v[i];
      return;
    }
    constexpr size_t kAhead = 16;  // prefetch distance: hides misses on random leaves
    std::vector<int64_t> mine, touched, parents;  // batch positions in range, nodes to refresh
    mine.reserve(static_cast<size_t>(std::min<int64_t>(n, hi - lo)));
    for (int64_t i = 0; i < n; ++i)
      if (idx[i] >= lo && idx[i] < hi) mine.push_back(i);
    touched.reserve(mine.size());
    for (size_t k = 0; k < mine.size(); ++k) {
      if (k + kAhead < mine.size()) {
        const uint64_t ahead = static_cast<uint64_t>(idx[mine[k + kAhead]]);
        __builtin_prefetch(leaves + ahead, 1);
        __builtin_prefetch(stamps_[1].data() + ahead / K, 1);
      }
      const int64_t i = mine[k];
      leaves[idx[i]] = v[i];  // batch order: the last write of a repeated index wins
      mark(1, static_cast<uint64_t>(idx[i]) / K, touched);
    }
    for (int l = 1; l <= max_level; ++l) {
      parents.clear();
      const size_t count = touched.size();
      for (size_t i = 0; i < count; ++i) {
        if (i + kAhead < count) prefetch_node(l, touched[i + kAhead]);
        const int64_t node = touched[i];
        recompute(l, node);
        if (l < max_level) mark(l + 1, node / K, parents);
      }
      touched.swap(parents);
    }
  }

  // What recompute(l, node) and mark(l + 1, ...) will touch.
  void prefetch_node(int l, int64_t node) const {
    __builtin_prefetch(values_[l].get() + node, 1);
    __builtin_prefetch(mins_[l].get() + node, 1);
    if (l + 1 < num_levels()) __builtin_prefetch(stamps_[l + 1].data() + node / K, 1);
    if (l >= 2) {
      prefetch_group(prefix_[l - 1].get() + node * K, K * sizeof(double));
      prefetch_group(values_[l - 1].get() + node * K, K * sizeof(T));
      prefetch_group(mins_[l - 1].get() + node * K, K * sizeof(T));
    }
  }

  // Adds `node` of level l to `list` unless this update already did.
  void mark(int l, int64_t node, std::vector<int64_t>& list) {
    uint32_t& stamp = stamps_[l][node];
    if (stamp != epoch_) {
      stamp = epoch_;
      list.push_back(node);
    }
  }

  void refresh_root() {
    const int top = num_levels() - 1;
    if (top == 0) {
      double pre[K];
      group_prefix<T, K>(values_[0].get(), pre);
      total_ = pre[K - 1];
      min_ = group_min<T, K>(values_[0].get(), true);
    } else {
      group_prefix<T, K>(values_[top].get(), prefix_[top].get());
      total_ = prefix_[top][K - 1];
      min_ = group_min<T, K>(mins_[top].get(), false);
    }
  }

  // Descents for n masses, kInterleave at a time per thread: each level of all
  // in-flight descents is taken before the next, and the next group of each is
  // prefetched, so cache misses overlap instead of forming one long chain.
  template <typename MassFn>
  void run_batched(int64_t n, MassFn mass_of, int64_t* idx_out, float* weight_out, double beta) const {
    const TreeView<T> tree = view();
    const int top = tree.num_levels - 1;
    const double min_value = min();
    const int64_t groups = (n + kInterleave - 1) / kInterleave;
    const int threads = n >= kParallelMinSearches ? num_threads() : 1;
    constexpr int64_t kGroupsPerItem = 4;  // work items of 64 descents: few atomic claims
    parallel_for((groups + kGroupsPerItem - 1) / kGroupsPerItem, threads, [&](int64_t item) {
      for (int64_t c = item * kGroupsPerItem; c < std::min(groups, (item + 1) * kGroupsPerItem); ++c) {
        const int64_t start = c * kInterleave;
        const int g = static_cast<int>(std::min<int64_t>(kInterleave, n - start));
        double m[kInterleave];
        int64_t node[kInterleave];
        for (int q = 0; q < g; ++q) {
          m[q] = mass_of(start + q);
          node[q] = 0;
        }
        for (int l = top; l >= 1; --l) {
          for (int q = 0; q < g; ++q) {
            const int64_t base = node[q] * K;
            node[q] = base + choose_in_prefix<K>(tree.prefix[l] + base, m[q]);
            if (l > 1) prefetch_group(tree.prefix[l - 1] + node[q] * K, K * sizeof(double));
            else prefetch_group(tree.leaves + node[q] * K, K * sizeof(T));
          }
        }
        for (int q = 0; q < g; ++q) {
          const int64_t base = node[q] * K;
          const int64_t leaf = base + choose_child<T, K>(tree.leaves + base, m[q]);
          idx_out[start + q] = leaf;
          if (weight_out) weight_out[start + q] = is_weight(tree.leaves[leaf], min_value, beta);
        }
      }
    });
  }

  int64_t capacity_;
  double max_leaf_;
  std::vector<int64_t> level_size_;
  // Per level: node values (level 0 = leaves), positive minima and the prefix
  // sums of each sibling group (both unused at level 0).
  std::vector<std::unique_ptr<T[], AlignedFree>> values_;
  std::vector<std::unique_ptr<T[], AlignedFree>> mins_;
  std::vector<std::unique_ptr<double[], AlignedFree>> prefix_;
  std::vector<std::vector<uint32_t>> stamps_;  // dedupes touched nodes per update
  uint32_t epoch_ = 0;
  double total_ = 0.0;
  T min_ = inf();
};

// Builds a tree for a runtime fanout and value width.
std::unique_ptr<SumTreeBase> make_kary_tree(int64_t capacity, int fanout, bool float64);

}  // namespace hetero_replay
