// Helpers shared by the tree tests: a typed wrapper over the type-erased tree
// (SumTreeBase, as the bindings use it) and a brute-force reference that keeps
// the leaves in a vector and answers with prefix sums over them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "hetero_replay/kary_tree.hpp"

namespace hr_test {

using hetero_replay::SumTreeBase;

template <typename T>
struct Tree {
  std::unique_ptr<SumTreeBase> t;

  Tree(int64_t capacity, int fanout) : t(hetero_replay::make_kary_tree(capacity, fanout, sizeof(T) == 8)) {}

  int64_t capacity() const { return t->capacity(); }
  void update(const std::vector<int64_t>& idx, const std::vector<T>& v) {
    t->update(idx.data(), v.data(), static_cast<int64_t>(idx.size()));
  }
  double update_td(const std::vector<int64_t>& idx, const std::vector<double>& td, double alpha, double eps,
                   int64_t limit) {
    return t->update_td(idx.data(), td.data(), static_cast<int64_t>(idx.size()), alpha, eps, limit);
  }
  void load_leaves(const std::vector<T>& v) { t->load_leaves(v.data()); }
  std::vector<T> leaves() const {
    std::vector<T> out(static_cast<size_t>(t->capacity()));
    t->leaves(out.data());
    return out;
  }
  std::vector<T> get(const std::vector<int64_t>& idx) const {
    std::vector<T> out(idx.size());
    t->get(idx.data(), static_cast<int64_t>(idx.size()), out.data());
    return out;
  }
  std::vector<int64_t> find(const std::vector<double>& mass) const {
    std::vector<int64_t> out(mass.size());
    t->find(mass.data(), static_cast<int64_t>(mass.size()), out.data());
    return out;
  }
  void sample(const std::vector<double>& u, bool stratified, double beta, std::vector<int64_t>& idx,
              std::vector<float>& w) const {
    idx.assign(u.size(), -1);
    w.assign(u.size(), -1.0f);
    t->sample(u.data(), static_cast<int64_t>(u.size()), stratified, beta, idx.data(), w.data());
  }
};

// Leaves plus brute-force answers. With small integer leaves every sum is
// exact in float32 and float64, so the tree must agree exactly.
template <typename T>
struct Reference {
  std::vector<T> leaves;

  explicit Reference(int64_t capacity) : leaves(static_cast<size_t>(capacity), T(0)) {}

  void update(const std::vector<int64_t>& idx, const std::vector<T>& v) {
    for (size_t i = 0; i < idx.size(); ++i) leaves[static_cast<size_t>(idx[i])] = v[i];  // last write wins
  }
  double total() const {
    double s = 0.0;
    for (T v : leaves) s += static_cast<double>(v);
    return s;
  }
  double min() const {
    double m = std::numeric_limits<double>::infinity();
    for (T v : leaves)
      if (v > T(0) && static_cast<double>(v) < m) m = static_cast<double>(v);
    return m;
  }
  // prefix[i] = sum of leaves[0..i).
  std::vector<double> prefix() const {
    std::vector<double> p(leaves.size() + 1, 0.0);
    for (size_t i = 0; i < leaves.size(); ++i) p[i + 1] = p[i] + static_cast<double>(leaves[i]);
    return p;
  }
  // The leaf whose interval [prefix[i], prefix[i + 1]) holds `mass`.
  int64_t find(double mass) const {
    double s = 0.0;
    for (size_t i = 0; i < leaves.size(); ++i) {
      s += static_cast<double>(leaves[i]);
      if (s > mass) return static_cast<int64_t>(i);
    }
    return -1;
  }
};

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Sets the pool's thread count for a scope.
struct ThreadsScope {
  int saved;
  explicit ThreadsScope(int n) : saved(hetero_replay::num_threads()) { hetero_replay::set_num_threads(n); }
  ~ThreadsScope() { hetero_replay::set_num_threads(saved); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;
};

}  // namespace hr_test
