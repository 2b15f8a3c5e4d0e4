// The parallel update (batches of >= 512 items, several threads) must give the
// serial update's tree bit for bit: same leaves, total, minimum, and the same
// answers to every find and sample.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "tree_util.hpp"

using namespace hr_test;

namespace {

template <typename T>
void compare(const Tree<T>& serial, const Tree<T>& parallel, std::mt19937_64& rng, const std::string& where) {
  const bool leaves_ok = same_bits(serial.leaves(), parallel.leaves());
  const bool total_ok = same_bits(serial.t->total(), parallel.t->total());
  const bool min_ok = same_bits(serial.t->min(), parallel.t->min());
  if (!(leaves_ok && total_ok && min_ok)) {
    fail(__FILE__, __LINE__, where + ": leaves/total/min differ");
    return;
  }
  if (!(serial.t->total() > 0.0)) return;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> mass(3000), u(3000);
  for (double& m : mass) m = unit(rng) * serial.t->total();
  for (double& x : u) x = unit(rng);
  // The internal nodes are compared through the descents that read them.
  if (serial.find(mass) != parallel.find(mass)) fail(__FILE__, __LINE__, where + ": find differs");
  std::vector<int64_t> si, pi;
  std::vector<float> sw, pw;
  serial.sample(u, true, 0.5, si, sw);
  parallel.sample(u, true, 0.5, pi, pw);
  if (si != pi || !same_bits(sw, pw)) fail(__FILE__, __LINE__, where + ": sample differs");
}

template <typename T>
void run(int fanout, int64_t capacity, int threads, uint64_t seed) {
  const std::string where = std::string(sizeof(T) == 4 ? "float32" : "float64") +
                            " K=" + std::to_string(fanout) + " capacity=" + std::to_string(capacity) +
                            " threads=" + std::to_string(threads);
  std::mt19937_64 rng(seed);
  Tree<T> serial(capacity, fanout), parallel(capacity, fanout);
  std::uniform_real_distribution<double> value(0.0, 3.0);
  std::uniform_real_distribution<double> td(0.0, 2.0);
  for (int64_t n : {int64_t{512}, int64_t{513}, int64_t{2000}, capacity / 2, 2 * capacity}) {
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::vector<T> v(static_cast<size_t>(n));
    // Random leaves (repeats included), or a run of the first leaves.
    const bool clustered = n == 2000;
    for (int64_t i = 0; i < n; ++i) {
      idx[static_cast<size_t>(i)] =
          clustered ? i % std::min<int64_t>(capacity, 700) : static_cast<int64_t>(rng() % capacity);
      v[static_cast<size_t>(i)] = rng() % 5 == 0 ? T(0) : static_cast<T>(std::exp(value(rng)));
    }
    {
      ThreadsScope one(1);
      serial.update(idx, v);
    }
    {
      ThreadsScope many(threads);
      parallel.update(idx, v);
    }
    compare(serial, parallel, rng, where + " update n=" + std::to_string(n));

    std::vector<double> errors(static_cast<size_t>(n));
    for (double& e : errors) e = td(rng);
    double max_s, max_p;
    {
      ThreadsScope one(1);
      max_s = serial.update_td(idx, errors, 0.6, 1e-6, capacity);
    }
    {
      ThreadsScope many(threads);
      max_p = parallel.update_td(idx, errors, 0.6, 1e-6, capacity);
    }
    CHECK(same_bits(max_s, max_p));
    compare(serial, parallel, rng, where + " update_td n=" + std::to_string(n));
  }
}

}  // namespace

TEST_CASE(parallel_update, parallel_equals_serial_bit_for_bit) {
  uint64_t seed = 11;
  for (int threads : {2, 3, 4}) {
    // Deep and shallow trees; small capacities split at a low level (or at the leaves).
    run<float>(16, 100000, threads, seed++);
    run<double>(16, 30000, threads, seed++);
    run<float>(2, 20000, threads, seed++);
    run<double>(4, 5000, threads, seed++);
    run<float>(64, 600, threads, seed++);
    run<double>(8, 100, threads, seed++);
    run<float>(32, 33, threads, seed++);
  }
}
