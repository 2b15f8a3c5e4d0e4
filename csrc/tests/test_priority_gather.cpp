// priorities_from_td (|TD error| -> (td + eps)^alpha) and gather_rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "hetero_replay/gather.hpp"
#include "hetero_replay/priority_transform.hpp"
#include "tree_util.hpp"

using namespace hr_test;
using hetero_replay::priorities_from_td;

TEST_CASE(priority_transform, values_and_max) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> mag(0.0, 10.0);
  for (int64_t n : {1, 7, 1024, 1025, 5000}) {
    std::vector<double> td(static_cast<size_t>(n));
    for (double& x : td) x = mag(rng);
    td[0] = 0.0;
    const double alpha = 0.7, eps = 1e-6;
    std::vector<float> f(td.size()), f_par(td.size());
    std::vector<double> d(td.size()), d_par(td.size());
    const double max_f = priorities_from_td(td.data(), n, alpha, eps, f.data());
    const double max_d = priorities_from_td(td.data(), n, alpha, eps, d.data());
    double max_raw = 0.0;
    for (size_t i = 0; i < td.size(); ++i) {
      max_raw = std::max(max_raw, td[i]);
      // float32 priorities take the power in float32, float64 ones in float64.
      CHECK(same_bits(f[i], powf(static_cast<float>(td[i] + eps), static_cast<float>(alpha))));
      CHECK(same_bits(d[i], std::pow(td[i] + eps, alpha)));
    }
    CHECK_EQ(max_f, max_raw + eps);
    CHECK_EQ(max_d, max_raw + eps);
    // Split across threads: the same bits.
    CHECK_EQ(priorities_from_td(td.data(), n, alpha, eps, f_par.data(), 3), max_f);
    CHECK_EQ(priorities_from_td(td.data(), n, alpha, eps, d_par.data(), 4), max_d);
    CHECK(same_bits(f, f_par));
    CHECK(same_bits(d, d_par));
  }
  float unused = -1.0f;
  CHECK_EQ(priorities_from_td(static_cast<const double*>(nullptr), 0, 0.6, 1e-6, &unused), 0.0);
  CHECK_EQ(unused, -1.0f);
}

TEST_CASE(priority_transform, bad_td_errors_throw_before_writing) {
  const double bad[] = {std::numeric_limits<double>::quiet_NaN(), -1e-9, -1.0,
                        std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  for (double b : bad) {
    for (int64_t n : {3, 3000}) {
      std::vector<double> td(static_cast<size_t>(n), 0.25);
      td.back() = b;
      std::vector<float> out(td.size(), -7.0f);
      CHECK_THROWS_AS(priorities_from_td(td.data(), n, 0.6, 1e-6, out.data(), 2), std::invalid_argument);
      CHECK(out == std::vector<float>(td.size(), -7.0f));
    }
  }
}

TEST_CASE(gather, rows_match_brute_force) {
  using hetero_replay::gather_rows;
  using hetero_replay::RowField;
  std::mt19937_64 rng(5);
  const int64_t rows = 1000;
  // Row sizes that take each copy path (4, 8, 16, 32, 64 bytes: fixed size;
  // others: memcpy), in separate arrays and interleaved in one record.
  const int64_t sizes[] = {4, 8, 16, 32, 64, 3, 12, 100, 200};
  std::vector<std::vector<char>> sources;
  std::vector<RowField> fields;
  for (int64_t bytes : sizes) {
    const int64_t stride = bytes + (bytes % 3 == 0 ? 5 : 0);  // some fields with padding between rows
    sources.emplace_back(static_cast<size_t>(rows * stride));
    for (char& c : sources.back()) c = static_cast<char>(rng());
    fields.push_back({sources.back().data(), stride, bytes});
  }
  std::vector<char> record(static_cast<size_t>(rows * 24));  // two fields sharing 24-byte records
  for (char& c : record) c = static_cast<char>(rng());
  fields.push_back({record.data(), 24, 8});
  fields.push_back({record.data() + 8, 24, 16});

  for (int threads : {1, 2, 4}) {
    for (int64_t n : {0, 1, 17, 511, 512, 513, 3000}) {
      std::vector<int64_t> idx(static_cast<size_t>(n));
      for (int64_t& i : idx) i = static_cast<int64_t>(rng() % rows);
      std::vector<std::vector<char>> out;
      std::vector<char*> out_ptrs;
      for (const RowField& f : fields) {
        out.emplace_back(static_cast<size_t>(n * f.bytes) + 1);
        out_ptrs.push_back(out.back().data());
      }
      gather_rows(fields, out_ptrs, idx.data(), n, threads);
      for (size_t k = 0; k < fields.size(); ++k) {
        const RowField& f = fields[k];
        bool ok = true;
        for (int64_t i = 0; i < n && ok; ++i)
          ok = std::memcmp(out[k].data() + i * f.bytes, f.source + idx[static_cast<size_t>(i)] * f.stride,
                           static_cast<size_t>(f.bytes)) == 0;
        if (!ok)
          fail(__FILE__, __LINE__,
               "field " + std::to_string(k) + " n=" + std::to_string(n) +
                   " threads=" + std::to_string(threads));
      }
    }
  }
}
