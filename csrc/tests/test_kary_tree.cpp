// KaryTree (through make_kary_tree, as the bindings build it) against a
// brute-force reference: updates, find, sample, minimum, validation, bounds.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "hetero_replay/descent.hpp"
#include "hetero_replay/priority_transform.hpp"
#include "tree_util.hpp"

using namespace hr_test;
using hetero_replay::draw_mass;
using hetero_replay::is_weight;

namespace {

const int kFanouts[] = {2, 4, 8, 16, 32, 64};

// Everything a query can see of a tree, to check that a refused call left it as it was.
template <typename T>
struct Snapshot {
  std::vector<T> leaves;
  double total, min;
  std::vector<int64_t> found;

  explicit Snapshot(const Tree<T>& tree) : leaves(tree.leaves()), total(tree.t->total()), min(tree.t->min()) {
    if (total > 0.0) {
      std::vector<double> mass;
      for (int i = 0; i < 64; ++i) mass.push_back(total * (i + 0.5) / 64.0);
      found = tree.find(mass);
    }
  }
  bool operator==(const Snapshot& o) const {
    return same_bits(leaves, o.leaves) && same_bits(total, o.total) && same_bits(min, o.min) &&
           found == o.found;
  }
};

// Checks every query of `tree` against `ref` (integer leaves: exact answers).
template <typename T>
void check_against_reference(const Tree<T>& tree, const Reference<T>& ref, std::mt19937_64& rng,
                             const std::string& where) {
  CHECK(same_bits(tree.leaves(), ref.leaves));
  const double total = ref.total();
  CHECK_EQ(tree.t->total(), total);
  CHECK_EQ(tree.t->min(), ref.min());
  if (!(total > 0.0)) return;

  // Masses: random ones and every interval boundary, where off-by-one errors live.
  std::vector<double> mass;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int i = 0; i < 200; ++i) mass.push_back(unit(rng) * total);
  const std::vector<double> prefix = ref.prefix();
  for (double p : prefix)
    if (p < total) mass.push_back(p);
  mass.push_back(std::nextafter(total, 0.0));
  const std::vector<int64_t> found = tree.find(mass);
  for (size_t i = 0; i < mass.size(); ++i) {
    const int64_t want = ref.find(mass[i]);
    if (found[i] != want) {
      fail(__FILE__, __LINE__,
           where + ": find(" + std::to_string(mass[i]) + ") = " + std::to_string(found[i]) + ", want " +
               std::to_string(want));
      return;
    }
  }

  // Samples: the same masses as the tree draws, answered by the reference.
  for (bool stratified : {true, false}) {
    const double beta = 0.4;
    std::vector<double> u(300);
    for (double& x : u) x = unit(rng);
    std::vector<int64_t> idx;
    std::vector<float> w;
    tree.sample(u, stratified, beta, idx, w);
    const int64_t n = static_cast<int64_t>(u.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t want = ref.find(draw_mass(i, n, u[i], total, stratified));
      const float want_w = is_weight(ref.leaves[want], ref.min(), beta);
      if (idx[i] != want || !same_bits(w[i], want_w) || !(w[i] > 0.0f && w[i] <= 1.0f)) {
        fail(__FILE__, __LINE__,
             where + ": sample " + std::to_string(i) + " gave leaf " + std::to_string(idx[i]) + " weight " +
                 std::to_string(w[i]) + ", want leaf " + std::to_string(want) + " weight " +
                 std::to_string(want_w));
        return;
      }
    }
  }
}

template <typename T>
void reference_run(int fanout, int64_t capacity, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tree<T> tree(capacity, fanout);
  Reference<T> ref(capacity);
  const std::string where = std::string(sizeof(T) == 4 ? "float32" : "float64") +
                            " K=" + std::to_string(fanout) + " capacity=" + std::to_string(capacity);
  CHECK_EQ(tree.t->fanout(), fanout);
  CHECK_EQ(tree.t->capacity(), capacity);
  CHECK_EQ(tree.t->value_bytes(), static_cast<int>(sizeof(T)));
  CHECK_EQ(tree.t->total(), 0.0);
  CHECK(std::isinf(tree.t->min()));
  std::uniform_int_distribution<int64_t> index(0, capacity - 1);
  std::uniform_int_distribution<int> value(0, 1000);
  for (int batch = 0; batch < 6; ++batch) {
    const int64_t n =
        batch == 0 ? capacity : 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(capacity));
    std::vector<int64_t> idx;
    std::vector<T> v;
    for (int64_t i = 0; i < n; ++i) {
      idx.push_back(batch == 0 ? i : index(rng));
      const int x = value(rng);
      v.push_back(static_cast<T>(x < 300 ? 0 : x));  // ~30% zeros: never sampled
    }
    tree.update(idx, v);
    ref.update(idx, v);
    check_against_reference(tree, ref, rng, where + " batch " + std::to_string(batch));
  }
}

template <typename T>
void rounding_run(int fanout, int64_t capacity, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tree<T> tree(capacity, fanout);
  Reference<T> ref(capacity);
  std::vector<int64_t> idx;
  std::vector<T> v;
  std::uniform_real_distribution<double> value(0.0, 10.0);
  for (int64_t i = 0; i < capacity; ++i) {
    idx.push_back(i);
    v.push_back(i % 7 == 3 ? T(0) : static_cast<T>(std::exp(value(rng)) * 1e-3));
  }
  tree.update(idx, v);
  ref.update(idx, v);
  const std::vector<double> prefix = ref.prefix();
  const double total = tree.t->total();
  const double tol = (sizeof(T) == 4 ? 1e-5 : 1e-12) * total;
  CHECK(std::fabs(total - ref.total()) <= tol);
  std::vector<double> mass;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int i = 0; i < 2000; ++i) mass.push_back(unit(rng) * total);
  mass.push_back(0.0);
  mass.push_back(std::nextafter(total, 0.0));
  const std::vector<int64_t> found = tree.find(mass);
  for (size_t i = 0; i < mass.size(); ++i) {
    const int64_t j = found[i];
    const bool ok = j >= 0 && j < capacity && ref.leaves[static_cast<size_t>(j)] > T(0) &&
                    prefix[static_cast<size_t>(j)] - tol <= mass[i] &&
                    mass[i] < prefix[static_cast<size_t>(j) + 1] + tol;
    if (!ok) {
      fail(__FILE__, __LINE__,
           "find(" + std::to_string(mass[i]) + ") = " + std::to_string(j) + " K=" + std::to_string(fanout) +
               " capacity=" + std::to_string(capacity));
      return;
    }
  }
}

}  // namespace

TEST_CASE(kary_tree, find_and_sample_match_reference) {
  uint64_t seed = 1;
  for (int fanout : kFanouts) {
    for (int64_t capacity :
         {int64_t{1}, int64_t{5}, int64_t{fanout}, int64_t{fanout} + 1, int64_t{1000}, int64_t{3001}}) {
      reference_run<float>(fanout, capacity, seed++);
      reference_run<double>(fanout, capacity, seed++);
    }
  }
}

TEST_CASE(kary_tree, non_integer_priorities_find_within_rounding) {
  uint64_t seed = 100;
  for (int fanout : kFanouts) {
    rounding_run<float>(fanout, 5000, seed++);
    rounding_run<double>(fanout, 5000, seed++);
  }
}

TEST_CASE(kary_tree, last_write_wins) {
  for (int threads : {1, 4}) {
    ThreadsScope scope(threads);
    for (int fanout : {2, 16}) {
      Tree<float> tree(4096, fanout);
      tree.update({5, 7, 5, 5, 7}, {1.0f, 2.0f, 3.0f, 4.0f, 0.0f});
      CHECK(tree.get({5, 7}) == (std::vector<float>{4.0f, 0.0f}));
      CHECK_EQ(tree.t->total(), 4.0);
      // A batch large enough for the parallel update: every leaf written many
      // times; its last value must win.
      std::mt19937_64 rng(fanout);
      std::vector<int64_t> idx;
      std::vector<float> v;
      Reference<float> ref(4096);
      for (int i = 0; i < 20000; ++i) {
        idx.push_back(static_cast<int64_t>(rng() % 64) * 64);
        v.push_back(static_cast<float>(i % 1000));
      }
      tree.update(idx, v);
      ref.update(idx, v);
      ref.leaves[5] = 4.0f;
      CHECK(same_bits(tree.leaves(), ref.leaves));
      CHECK_EQ(tree.t->total(), ref.total());
    }
  }
}

TEST_CASE(kary_tree, positive_minimum) {
  for (int fanout : kFanouts) {
    Tree<double> tree(100, fanout);
    CHECK(std::isinf(tree.t->min()));
    tree.update({3, 50, 99}, {0.0, 2.5, 7.0});
    CHECK_EQ(tree.t->min(), 2.5);
    tree.update({50}, {0.0});  // zeros do not count
    CHECK_EQ(tree.t->min(), 7.0);
    tree.update({0}, {1e-300});
    CHECK_EQ(tree.t->min(), 1e-300);
    tree.update({0, 99}, {0.0, 0.0});
    CHECK(std::isinf(tree.t->min()));
    CHECK_EQ(tree.t->total(), 0.0);
  }
}

TEST_CASE(kary_tree, refused_updates_leave_tree_unchanged) {
  for (int fanout : {2, 16, 64}) {
    Tree<float> tree(1000, fanout);
    std::vector<int64_t> all;
    std::vector<float> ones;
    for (int64_t i = 0; i < 1000; ++i) {
      all.push_back(i);
      ones.push_back(static_cast<float>(i % 5));
    }
    tree.update(all, ones);
    const Snapshot<float> before(tree);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    // The bad entry comes last: a tree that wrote as it validated would have
    // changed leaves 0 and 1 already.
    CHECK_THROWS_AS(tree.update({0, 1, -1}, {9.0f, 9.0f, 1.0f}), std::out_of_range);
    CHECK_THROWS_AS(tree.update({0, 1, 1000}, {9.0f, 9.0f, 1.0f}), std::out_of_range);
    CHECK_THROWS_AS(tree.update({0, 1, 2}, {9.0f, 9.0f, nan}), std::invalid_argument);
    CHECK_THROWS_AS(tree.update({0, 1, 2}, {9.0f, 9.0f, -1.0f}), std::invalid_argument);
    CHECK_THROWS_AS(tree.update({0, 1, 2}, {9.0f, 9.0f, inf}), std::invalid_argument);
    // Just above the largest accepted leaf.
    float big = static_cast<float>(tree.t->max_leaf());
    while (static_cast<double>(big) <= tree.t->max_leaf()) big = std::nextafter(big, inf);
    CHECK_THROWS_AS(tree.update({0, 1, 2}, {9.0f, 9.0f, big}), std::invalid_argument);
    // A large batch (the parallel path) with one bad entry at the end.
    std::vector<int64_t> idx(all);
    std::vector<float> v(1000, 3.0f);
    v.back() = nan;
    CHECK_THROWS_AS(tree.update(idx, v), std::invalid_argument);
    idx.back() = 5000;
    v.back() = 1.0f;
    CHECK_THROWS_AS(tree.update(idx, v), std::out_of_range);
    // update_td: bad TD errors, indices past `limit`, priorities too large to sum.
    const std::vector<double> td_ok = {0.5, 0.5, 0.5};
    CHECK_THROWS_AS(tree.update_td({0, 1, 2}, {0.5, 0.5, std::nan("")}, 0.6, 1e-6, 1000),
                    std::invalid_argument);
    CHECK_THROWS_AS(tree.update_td({0, 1, 2}, {0.5, 0.5, -1e-9}, 0.6, 1e-6, 1000), std::invalid_argument);
    CHECK_THROWS_AS(tree.update_td({0, 1, 2}, {0.5, 0.5, HUGE_VAL}, 0.6, 1e-6, 1000), std::invalid_argument);
    CHECK_THROWS_AS(tree.update_td({0, 1, 2}, {0.5, 0.5, 1e300}, 1.0, 1e-6, 1000), std::invalid_argument);
    CHECK_THROWS_AS(tree.update_td({0, 1, 500}, td_ok, 0.6, 1e-6, 500), std::out_of_range);
    CHECK_THROWS_AS(tree.update_td({0, 1, 1000}, td_ok, 0.6, 1e-6, 5000),
                    std::out_of_range);  // limit > capacity
    CHECK_THROWS_AS(tree.update_td({0, 1, -2}, td_ok, 0.6, 1e-6, 1000), std::out_of_range);
    // load_leaves validates all leaves before writing any.
    std::vector<float> load(1000, 2.0f);
    load[999] = -3.0f;
    CHECK_THROWS_AS(tree.load_leaves(load), std::invalid_argument);
    CHECK(Snapshot<float>(tree) == before);
    // Refused queries.
    const double total = tree.t->total();
    CHECK_THROWS_AS(tree.find({0.0, total}), std::invalid_argument);
    CHECK_THROWS_AS(tree.find({-1e-9}), std::invalid_argument);
    CHECK_THROWS_AS(tree.find({std::nan("")}), std::invalid_argument);
    CHECK_THROWS_AS(tree.get({0, 1000}), std::out_of_range);
    CHECK(Snapshot<float>(tree) == before);
  }
}

TEST_CASE(kary_tree, largest_accepted_leaf_keeps_sums_finite) {
  for (int fanout : {2, 16}) {
    Tree<float> f(8, fanout);
    const float top = static_cast<float>(f.t->max_leaf());
    float ok = top;
    while (static_cast<double>(ok) > f.t->max_leaf()) ok = std::nextafter(ok, 0.0f);
    f.update({0, 1, 2, 3, 4, 5, 6, 7}, std::vector<float>(8, ok));
    CHECK(std::isfinite(f.t->total()));
    CHECK(f.t->total() > 0.0);
    Tree<double> d(8, fanout);
    d.update({0, 1, 2, 3, 4, 5, 6, 7}, std::vector<double>(8, d.t->max_leaf()));
    CHECK(std::isfinite(d.t->total()));
    std::vector<int64_t> idx;
    std::vector<float> w;
    d.sample({0.0, 0.5, 0.999}, false, 1.0, idx, w);  // masses 0, total / 2, ~total
    CHECK(idx == (std::vector<int64_t>{0, 4, 7}));
  }
}

TEST_CASE(kary_tree, empty_tree_refuses_find_and_sample) {
  Tree<float> tree(10, 4);
  CHECK_THROWS_AS(tree.find({0.0}), std::invalid_argument);
  std::vector<int64_t> idx;
  std::vector<float> w;
  CHECK_THROWS_AS(tree.sample({0.5}, true, 0.4, idx, w), std::invalid_argument);
  tree.update({3}, {0.0f});
  CHECK_THROWS_AS(tree.find({0.0}), std::invalid_argument);
  tree.update({3}, {2.0f});
  CHECK(tree.find({0.0, 1.999}) == (std::vector<int64_t>{3, 3}));
}

TEST_CASE(kary_tree, capacity_and_fanout_bounds) {
  using hetero_replay::kMaxCapacity;
  using hetero_replay::make_kary_tree;
  for (bool f64 : {false, true}) {
    for (int fanout : kFanouts) {
      CHECK_THROWS_AS(make_kary_tree(0, fanout, f64), std::invalid_argument);
      CHECK_THROWS_AS(make_kary_tree(-1, fanout, f64), std::invalid_argument);
      CHECK_THROWS_AS(make_kary_tree(kMaxCapacity + 1, fanout, f64), std::invalid_argument);
      CHECK_THROWS_AS(make_kary_tree(std::numeric_limits<int64_t>::max(), fanout, f64),
                      std::invalid_argument);
      CHECK_EQ(make_kary_tree(1, fanout, f64)->num_levels(), 1);
    }
    for (int fanout : {-2, 0, 1, 3, 12, 128})
      CHECK_THROWS_AS(make_kary_tree(10, fanout, f64), std::invalid_argument);
  }
  CHECK_EQ(kMaxCapacity, int64_t{1} << 40);
  // Level counts: ceil(log_K(capacity)), at least one.
  CHECK_EQ(make_kary_tree(16, 16, false)->num_levels(), 1);
  CHECK_EQ(make_kary_tree(17, 16, false)->num_levels(), 2);
  CHECK_EQ(make_kary_tree(256, 16, false)->num_levels(), 2);
  CHECK_EQ(make_kary_tree(257, 16, false)->num_levels(), 3);
  CHECK_EQ(make_kary_tree(1024, 2, true)->num_levels(), 10);
}

TEST_CASE(kary_tree, update_td_stores_priorities_from_td) {
  for (int fanout : {4, 32}) {
    Tree<float> f(3000, fanout);
    Tree<double> d(3000, fanout);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> mag(0.0, 5.0);
    std::vector<int64_t> idx;
    std::vector<double> td;
    for (int i = 0; i < 2500; ++i) {
      idx.push_back(static_cast<int64_t>(rng() % 2000));
      td.push_back(i % 11 == 0 ? 0.0 : mag(rng));
    }
    const double alpha = 0.6, eps = 1e-6;
    std::vector<float> pf(td.size());
    std::vector<double> pd(td.size());
    const double max_f = hetero_replay::priorities_from_td(td.data(), 2500, alpha, eps, pf.data());
    hetero_replay::priorities_from_td(td.data(), 2500, alpha, eps, pd.data());
    Reference<float> rf(3000);
    Reference<double> rd(3000);
    rf.update(idx, pf);
    rd.update(idx, pd);
    double max_raw = 0.0;
    for (double x : td) max_raw = std::max(max_raw, x);
    CHECK_EQ(f.update_td(idx, td, alpha, eps, 2000), max_raw + eps);
    CHECK_EQ(d.update_td(idx, td, alpha, eps, 2000), max_f);
    CHECK(same_bits(f.leaves(), rf.leaves));
    CHECK(same_bits(d.leaves(), rd.leaves));
    CHECK_EQ(f.update_td({}, {}, alpha, eps, 2000), 0.0);  // empty batch
  }
}

TEST_CASE(kary_tree, load_leaves_equals_updates) {
  for (int threads : {1, 3}) {
    ThreadsScope scope(threads);
    for (int fanout : {2, 16}) {
      const int64_t capacity = 70001;  // > 4096 level-1 nodes for K = 16: chunked rebuild
      std::mt19937_64 rng(fanout);
      std::vector<int64_t> idx;
      std::vector<float> v;
      for (int64_t i = 0; i < capacity; ++i) {
        idx.push_back(i);
        v.push_back(rng() % 4 == 0 ? 0.0f : static_cast<float>(rng() % 100000) * 0.37f);
      }
      Tree<float> loaded(capacity, fanout), updated(capacity, fanout);
      loaded.load_leaves(v);
      updated.update(idx, v);
      CHECK(Snapshot<float>(loaded) == Snapshot<float>(updated));
      std::vector<double> mass;
      for (int i = 0; i < 5000; ++i)
        mass.push_back(loaded.t->total() * (static_cast<double>(rng() % 1000003) / 1000003.0));
      CHECK(loaded.find(mass) == updated.find(mass));
    }
  }
}
