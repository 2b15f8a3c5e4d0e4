// The CUDA kernels of csrc/cuda/, run on the CPU: hetero_replay._native.kernels.
//
// Each function here is one kernel launch: the same per-item functions of
// hetero_replay/batch_items.hpp that the __global__ wrappers call, in a loop
// over the items instead of across threads, with the atomics done as the
// sequential max they compute. Any thread schedule of these kernels gives the
// same result, so the loop's schedule is as good as the GPU's: the CPU tests
// (and the CPU executor of hetero_replay.trees.cupy_tree) check the GPU
// arithmetic to the bit without a GPU.
//
// Arrays arrive as NumPy arrays of the kernel's parameter types (checked);
// None stands for a null pointer.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "hetero_replay/batch_items.hpp"

namespace py = pybind11;
using namespace hetero_replay;

namespace {

template <typename T>
T* ptr(const py::object& obj, const char* what) {
  if (obj.is_none()) return nullptr;
  if (!py::isinstance<py::array>(obj)) throw py::type_error(std::string(what) + " must be a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().equal(py::dtype::of<T>()))
    throw py::type_error(std::string(what) + ": expected dtype " +
                         py::str(py::dtype::of<T>()).cast<std::string>() + ", got " +
                         py::str(a.dtype()).cast<std::string>());
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(what) + " must be C-contiguous");
  return static_cast<T*>(a.mutable_data());
}

// Calls f(T{}) with T the value type of `values` (float32 or float64).
template <typename F>
void with_type(const py::object& values, F&& f) {
  const py::dtype dt = py::reinterpret_borrow<py::array>(values).dtype();
  if (dt.equal(py::dtype::of<float>())) return f(float{});
  if (dt.equal(py::dtype::of<double>())) return f(double{});
  throw py::type_error("tree values must be float32 or float64");
}

// Calls f(std::integral_constant<int, K>{}) for a runtime fanout.
template <typename F>
void with_fanout(int fanout, F&& f) {
  switch (fanout) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default:
      throw py::value_error("fanout must be one of 2, 4, 8, 16, 32, 64; got " + std::to_string(fanout));
  }
}

using Status = uint64_t;

bool update_failed(const Status* status) { return (status[kStatusBadIndex] | status[kStatusBadValue]) != 0; }

void record_bad(Status* status, int bad, int64_t n, int64_t i) {
  if (bad & kBadIndex) status[kStatusBadIndex] = std::max<Status>(status[kStatusBadIndex], n - i);
  if (bad & kBadValue) status[kStatusBadValue] = std::max<Status>(status[kStatusBadValue], n - i);
}

}  // namespace

void register_kernel_items(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "kernels", "The CUDA kernels of csrc/cuda/, run on the CPU (same per-item code; for tests).");

  m.def("check_priorities", [](int64_t n, py::object idx, py::object values, int64_t limit, double max_leaf,
                               py::object keys, py::object status) {
    with_type(values, [&](auto tag) {
      using T = decltype(tag);
      const int64_t* ix = ptr<int64_t>(idx, "idx");
      const T* v = ptr<T>(values, "values");
      int64_t* k = ptr<int64_t>(keys, "keys");
      Status* st = ptr<Status>(status, "status");
      for (int64_t i = 0; i < n; ++i)
        record_bad(st, check_priority_item<T>(i, n, ix, v, limit, max_leaf, k), n, i);
    });
  });

  m.def("check_td", [](int64_t n, py::object idx, py::object td, int64_t limit, double alpha, double eps,
                       double max_leaf, py::object keys, py::object priorities, py::object status) {
    with_type(priorities, [&](auto tag) {
      using T = decltype(tag);
      const int64_t* ix = ptr<int64_t>(idx, "idx");
      const double* d = ptr<double>(td, "td");
      int64_t* k = ptr<int64_t>(keys, "keys");
      T* p = ptr<T>(priorities, "priorities");
      Status* st = ptr<Status>(status, "status");
      for (int64_t i = 0; i < n; ++i) {
        const int bad = check_td_item<T>(i, n, ix, d, limit, alpha, eps, max_leaf, k, p);
        record_bad(st, bad, n, i);
        if (!(bad & kBadValue))
          st[kStatusMaxRaw] = std::max<Status>(st[kStatusMaxRaw], double_bits(d[i] + eps));
      }
    });
  });

  m.def("write_leaves",
        [](int64_t n, py::object sorted_keys, py::object values, py::object leaves, py::object status) {
          with_type(values, [&](auto tag) {
            using T = decltype(tag);
            const int64_t* k = ptr<int64_t>(sorted_keys, "sorted_keys");
            const T* v = ptr<T>(values, "values");
            T* out = ptr<T>(leaves, "leaves");
            if (update_failed(ptr<Status>(status, "status"))) return;
            for (int64_t i = 0; i < n; ++i) write_leaf_item<T>(i, n, k, v, out);
          });
        });

  m.def("refresh_level", [](int fanout, int64_t n, py::object sorted_keys, int64_t span,
                            py::object child_values, py::object child_mins, py::object child_prefix,
                            py::object values, py::object mins, py::object status) {
    with_type(values, [&](auto tag) {
      using T = decltype(tag);
      with_fanout(fanout, [&](auto k) {
        constexpr int K = decltype(k)::value;
        const int64_t* keys = ptr<int64_t>(sorted_keys, "sorted_keys");
        const T* cv = ptr<T>(child_values, "child_values");
        const T* cm = ptr<T>(child_mins, "child_mins");
        double* cp = ptr<double>(child_prefix, "child_prefix");
        T* v = ptr<T>(values, "values");
        T* mn = ptr<T>(mins, "mins");
        if (update_failed(ptr<Status>(status, "status"))) return;
        for (int64_t i = 0; i < n; ++i) refresh_item<T, K>(i, n, keys, span, cv, cm, cp, v, mn);
      });
    });
  });

  m.def("rebuild_level", [](int fanout, int64_t nodes, py::object child_values, py::object child_mins,
                            py::object child_prefix, py::object values, py::object mins) {
    with_type(values, [&](auto tag) {
      using T = decltype(tag);
      with_fanout(fanout, [&](auto k) {
        constexpr int K = decltype(k)::value;
        const T* cv = ptr<T>(child_values, "child_values");
        const T* cm = ptr<T>(child_mins, "child_mins");
        double* cp = ptr<double>(child_prefix, "child_prefix");
        T* v = ptr<T>(values, "values");
        T* mn = ptr<T>(mins, "mins");
        for (int64_t node = 0; node < nodes; ++node) recompute_node<T, K>(node, cv, cm, cp, v, mn);
      });
    });
  });

  m.def("refresh_root",
        [](int fanout, py::object top_values, py::object top_mins, py::object top_prefix, py::object status) {
          with_type(top_values, [&](auto tag) {
            using T = decltype(tag);
            with_fanout(fanout, [&](auto k) {
              constexpr int K = decltype(k)::value;
              Status* st = ptr<Status>(status, "status");
              const T* tv = ptr<T>(top_values, "top_values");
              const T* tm = ptr<T>(top_mins, "top_mins");
              double* tp = ptr<double>(top_prefix, "top_prefix");
              if (update_failed(st)) return;
              double total;
              T min_value;
              refresh_root<T, K>(tv, tm, tp, &total, &min_value);
              st[kStatusTotal] = double_bits(total);
              st[kStatusMin] = double_bits(static_cast<double>(min_value));
            });
          });
        });

  m.def("find", [](int fanout, int64_t n, py::object mass, py::object leaves, py::object prefix_table,
                   int64_t num_levels, py::object out) {
    with_type(leaves, [&](auto tag) {
      using T = decltype(tag);
      with_fanout(fanout, [&](auto k) {
        constexpr int K = decltype(k)::value;
        const double* m = ptr<double>(mass, "mass");
        int64_t* o = ptr<int64_t>(out, "out");
        const TreeView<T> tree =
            view_from_table<T>(ptr<T>(leaves, "leaves"), ptr<uint64_t>(prefix_table, "prefix_table"),
                               static_cast<int>(num_levels));
        for (int64_t i = 0; i < n; ++i) o[i] = descend<T, K>(tree, m[i]);
      });
    });
  });

  // hr_sample_gather with `block` threads per block (num_fields = 0: hr_sample).
  auto sample_gather = [](int fanout, int64_t n, py::object uniforms, int64_t stratified, double total,
                          double min_value, double beta, py::object leaves, py::object prefix_table,
                          int64_t num_levels, py::object idx_out, py::object weight_out, int64_t num_fields,
                          py::object fields, int64_t block) {
    with_type(leaves, [&](auto tag) {
      using T = decltype(tag);
      with_fanout(fanout, [&](auto k) {
        constexpr int K = decltype(k)::value;
        const double* u = ptr<double>(uniforms, "uniforms");
        int64_t* io = ptr<int64_t>(idx_out, "idx_out");
        float* wo = ptr<float>(weight_out, "weight_out");
        const int64_t* table = num_fields ? ptr<int64_t>(fields, "fields") : nullptr;
        const TreeView<T> tree =
            view_from_table<T>(ptr<T>(leaves, "leaves"), ptr<uint64_t>(prefix_table, "prefix_table"),
                               static_cast<int>(num_levels));
        if (block < 1) throw py::value_error("block must be >= 1");
        for (int64_t first = 0; first < n; first += block) {  // one block at a time, as the kernel
          const int64_t count = std::min(block, n - first);
          for (int64_t i = first; i < first + count; ++i)
            sample_item<T, K>(i, n, tree, u, stratified != 0, total, min_value, beta, io, wo);
          for (int64_t f = 0; f < num_fields; ++f) {
            const char* source = reinterpret_cast<const char*>(table[3 * f]);
            char* out = reinterpret_cast<char*>(table[3 * f + 1]);
            const int64_t bytes = table[3 * f + 2];
            if (bytes % 4 == 0) {
              for (int64_t t = 0; t < count * (bytes / 4); ++t)
                gather_word<uint32_t>(t, io + first, first, reinterpret_cast<const uint32_t*>(source),
                                      reinterpret_cast<uint32_t*>(out), bytes / 4);
            } else {
              for (int64_t t = 0; t < count * bytes; ++t)
                gather_word<uint8_t>(t, io + first, first, reinterpret_cast<const uint8_t*>(source),
                                     reinterpret_cast<uint8_t*>(out), bytes);
            }
          }
        }
      });
    });
  };
  m.def("sample_gather", sample_gather);
  m.def("sample",
        [sample_gather](int fanout, int64_t n, py::object uniforms, int64_t stratified, double total,
                        double min_value, double beta, py::object leaves, py::object prefix_table,
                        int64_t num_levels, py::object idx_out, py::object weight_out) {
          sample_gather(fanout, n, uniforms, stratified, total, min_value, beta, leaves, prefix_table,
                        num_levels, idx_out, weight_out, 0, py::none(), 1);
        });
}
