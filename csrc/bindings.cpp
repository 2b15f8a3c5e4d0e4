// pybind11 module hetero_replay._native: the C++ sum tree and hot-path helpers.
//
// Arrays arrive as NumPy arrays (torch/CuPy users pass numpy views); the
// module depends on pybind11 and the standard library only, never on libtorch.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <optional>
#include <shared_mutex>
#include <utility>

#include "hetero_replay/executor.hpp"
#include "hetero_replay/gather.hpp"
#include "hetero_replay/kary_tree.hpp"
#include "numpy_uniforms.hpp"
#include "released_gil.hpp"

namespace py = pybind11;
using namespace hetero_replay;

void register_kernel_items(py::module_& m);  // csrc/kernel_items_host.cpp
void register_ring(py::module_& m);          // csrc/ring.cpp
void register_executor(py::module_& m);      // csrc/executor.cpp
void register_codec(py::module_& m);         // csrc/codec.cpp
void register_record_log(py::module_& m);    // csrc/record_log.cpp
void register_row_stager(py::module_& m);    // csrc/row_stager.cpp

namespace {

using IndexArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;

py::array as_1d(py::handle obj, const char* what) {
  py::array arr = py::array::ensure(obj);
  if (!arr) throw py::type_error(std::string(what) + " must be array-like");
  if (arr.ndim() != 1)
    throw py::value_error(std::string(what) + " must be 1-D, got " + std::to_string(arr.ndim()) + "-D");
  return arr;
}

char kind_of(const py::array& arr) { return arr.dtype().kind(); }

IndexArray as_indices(py::handle obj) {
  py::array arr = as_1d(obj, "indices");
  const char k = kind_of(arr);
  if (arr.size() > 0 && k != 'i' && k != 'u')
    throw py::type_error("indices must be integers, got dtype " + py::str(arr.dtype()).cast<std::string>());
  return IndexArray::ensure(arr);
}

void require_numeric(const py::array& arr, const char* what) {
  const char k = kind_of(arr);
  if (arr.size() > 0 && k != 'f' && k != 'i' && k != 'u')
    throw py::type_error(std::string(what) + " must be real numbers, got dtype " +
                         py::str(arr.dtype()).cast<std::string>());
}

// An update's indices (int64) and TD errors (float64), as many of each, or the error naming the mismatch.
std::pair<IndexArray, DoubleArray> td_inputs(py::handle idx_obj, py::handle td_obj) {
  IndexArray idx = as_indices(idx_obj);
  py::array td_any = as_1d(td_obj, "td_errors");
  require_numeric(td_any, "td_errors");
  DoubleArray td = DoubleArray::ensure(td_any);
  if (td.size() != idx.size())
    throw py::value_error("got " + std::to_string(idx.size()) + " indices but " + std::to_string(td.size()) +
                          " TD errors");
  return {std::move(idx), std::move(td)};
}

// A tree plus what the bindings need around it: the value dtype and the NumPy
// generator that `sample` draws from.
struct PySumTree {
  std::unique_ptr<SumTreeBase> tree;
  NumpyUniforms uniforms;

  bool float64() const { return tree->value_bytes() == 8; }
  py::dtype dtype() const { return float64() ? py::dtype::of<double>() : py::dtype::of<float>(); }

  py::array values_as_dtype(py::handle obj, const char* what) const {
    py::array arr = as_1d(obj, what);
    require_numeric(arr, what);
    if (float64()) return py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr);
    return py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(arr);
  }
};

// Each field: an array whose rows are `stride` bytes apart and whose row
// content is contiguous (e.g. a field view of a record array). Holds
// references so the memory outlives it.
struct PyRowAccess {
  std::vector<py::array> sources;
  std::vector<RowField> fields;
  int64_t rows = 0;

  explicit PyRowAccess(const py::list& arrays) {
    for (py::handle h : arrays) {
      if (!py::isinstance<py::array>(h)) throw py::type_error("RowAccess fields must be numpy arrays");
      py::array a = py::reinterpret_borrow<py::array>(h);
      if (a.ndim() < 1) throw py::value_error("RowAccess fields need a leading row axis");
      int64_t bytes = a.itemsize();
      for (py::ssize_t d = a.ndim() - 1; d >= 1; --d) {  // rows must be contiguous inside
        if (a.shape(d) > 1 && a.strides(d) != bytes)
          throw py::value_error("RowAccess: the rows of each field must be contiguous");
        bytes *= a.shape(d);
      }
      if (!sources.empty() && a.shape(0) != rows)
        throw py::value_error("RowAccess: fields differ in their number of rows");
      rows = a.shape(0);
      sources.push_back(a);
      fields.push_back({static_cast<const char*>(a.data()), a.strides(0), bytes});
    }
  }

  py::list gather(py::handle idx_obj) const {
    IndexArray idx = as_indices(idx_obj);
    const int64_t n = idx.size();
    const int64_t* ix = idx.data();
    for (int64_t i = 0; i < n; ++i)
      if (ix[i] < 0 || ix[i] >= rows)
        throw py::index_error("index at position " + std::to_string(i) + " is " + std::to_string(ix[i]) +
                              ", outside [0, " + std::to_string(rows) + ")");
    py::list outs;
    std::vector<char*> out_ptrs;
    for (const py::array& a : sources) {
      std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
      shape[0] = n;
      py::array out(a.dtype(), shape);
      out_ptrs.push_back(static_cast<char*>(out.mutable_data()));
      outs.append(out);
    }
    {
      ReleasedGil nogil;
      gather_rows(fields, out_ptrs, ix, n, n >= 1024 ? num_threads() : 1);
    }
    return outs;
  }

  // Rows start, start + 1, ... (wrapping) of each field <- the rows of
  // values[f], which must match the field's dtype (an equal one: an unpickled
  // dtype is another object) and row shape (the caller casts); strided or
  // Fortran-ordered arrays are copied to C order first. One call instead of a
  // NumPy assignment per field; nothing is written unless every array fits.
  void write(int64_t start, const py::list& values) {
    if (static_cast<size_t>(py::len(values)) != sources.size())
      throw py::value_error("RowAccess.write: expected one array per field");
    std::vector<py::array> src;
    int64_t n = -1;
    for (size_t f = 0; f < sources.size(); ++f) {
      py::array a = py::array::ensure(values[f], py::array::c_style);
      if (!a || !a.dtype().equal(sources[f].dtype()) || a.ndim() != sources[f].ndim())
        throw py::value_error("RowAccess.write: array " + std::to_string(f) +
                              " must have the field's dtype and rank");
      for (py::ssize_t d = 1; d < a.ndim(); ++d)
        if (a.shape(d) != sources[f].shape(d))
          throw py::value_error("RowAccess.write: array " + std::to_string(f) + " has the wrong row shape");
      if (n >= 0 && a.shape(0) != n) throw py::value_error("RowAccess.write: arrays differ in rows");
      n = a.shape(0);
      src.push_back(a);
    }
    if (start < 0 || start >= rows || n > rows)
      throw py::value_error("RowAccess.write: start or row count outside the storage");
    for (size_t f = 0; f < fields.size(); ++f) {
      const RowField& fd = fields[f];
      char* base = static_cast<char*>(sources[f].mutable_data());
      const char* in = static_cast<const char*>(src[f].data());
      for (int64_t i = 0; i < n; ++i)
        copy_row(base + ((start + i) % rows) * fd.stride, in + i * fd.bytes, fd.bytes);
    }
  }
};

std::unique_ptr<PySumTree> make_py_tree(int64_t capacity, int fanout, py::object dtype) {
  const py::dtype dt = py::dtype::from_args(dtype);
  const bool f64 = dt.equal(py::dtype::of<double>());
  if (!f64 && !dt.equal(py::dtype::of<float>()))
    throw py::value_error("dtype must be float32 or float64, got " + py::str(dt).cast<std::string>());
  auto t = std::make_unique<PySumTree>();
  t->tree = make_kary_tree(capacity, fanout, f64);
  return t;
}

}  // namespace

// The C++ tree inside a hetero_replay._native.SumTree (csrc/executor.cpp runs jobs on it).
namespace hetero_replay {
SumTreeBase& native_tree_of(py::handle tree) { return *tree.cast<PySumTree&>().tree; }
}  // namespace hetero_replay

PYBIND11_MODULE(_native, m) {
  m.doc() = "C++ K-ary sum tree and hot-path helpers of hetero_replay.";
  register_kernel_items(m);
  register_ring(m);
  register_codec(m);
  register_record_log(m);
  register_row_stager(m);

  // The PER arithmetic every CPU backend shares, so that they agree to the bit
  // whatever SIMD paths NumPy or torch would pick on this machine.
  m.def(
      "td_priorities",
      [](py::handle td_obj, double alpha, double eps, py::object dtype) {
        py::array td_any = as_1d(td_obj, "td_errors");
        require_numeric(td_any, "td_errors");
        DoubleArray td = DoubleArray::ensure(td_any);
        const py::dtype dt = py::dtype::from_args(dtype);
        py::array out(dt, td.size());
        double max_raw;
        if (dt.equal(py::dtype::of<float>())) {
          ReleasedGil nogil;
          max_raw =
              priorities_from_td(td.data(), td.size(), alpha, eps, static_cast<float*>(out.mutable_data()));
        } else if (dt.equal(py::dtype::of<double>())) {
          ReleasedGil nogil;
          max_raw =
              priorities_from_td(td.data(), td.size(), alpha, eps, static_cast<double*>(out.mutable_data()));
        } else {
          throw py::value_error("dtype must be float32 or float64, got " + py::str(dt).cast<std::string>());
        }
        return py::make_tuple(out, max_raw);
      },
      py::arg("td_errors"), py::arg("alpha"), py::arg("eps"), py::arg("dtype"),
      "(|td| + eps) ** alpha as `dtype` and max(|td| + eps), exactly as the C++ tree computes them.");
  m.def(
      "is_weights",
      [](py::handle leaves_obj, double min_priority, double beta) {
        py::array any = as_1d(leaves_obj, "priorities");
        require_numeric(any, "priorities");
        py::array_t<float> out(any.size());
        float* o = out.mutable_data();
        if (any.dtype().equal(py::dtype::of<float>())) {
          auto p = py::array_t<float, py::array::c_style>::ensure(any);
          for (py::ssize_t i = 0; i < p.size(); ++i) o[i] = is_weight(p.data()[i], min_priority, beta);
        } else {
          DoubleArray p = DoubleArray::ensure(any);
          for (py::ssize_t i = 0; i < p.size(); ++i) o[i] = is_weight(p.data()[i], min_priority, beta);
        }
        return out;
      },
      py::arg("priorities"), py::arg("min_priority"), py::arg("beta"),
      "IS weights (min_priority / p) ** beta as float32, exactly as the C++ tree computes them.");
  m.def(
      "update_copies",
      [](py::handle indices, py::handle td_errors) {
        // The caller's arrays may change after it returns: the copies are the update's own.
        auto own = [](py::array converted, py::handle given) {
          if (converted.ptr() != given.ptr()) return converted;  // converted: a copy already
          return py::array(converted.dtype(), {converted.size()}, converted.data());  // (no base: copied)
        };
        try {
          auto [idx, td] = td_inputs(indices, td_errors);
          return py::make_tuple(own(idx, indices), own(td, td_errors));
        } catch (const py::type_error& e) {
          throw py::type_error(std::string("update_priorities: ") + e.what());
        } catch (const py::value_error& e) {
          throw py::value_error(std::string("update_priorities: ") + e.what());
        }
      },
      py::arg("indices"), py::arg("td_errors"),
      "An update's arrays checked (1-D, integer indices, real TD errors, as many of each) and copied as "
      "int64 and float64.");
  m.def(
      "raised_weights",
      [](const py::array_t<float, py::array::c_style>& weights, double beta) {
        py::array_t<float> out(weights.size());
        float* o = out.mutable_data();
        const float* w = weights.data();
        for (py::ssize_t i = 0; i < weights.size(); ++i) o[i] = raised_ratio(w[i], beta);
        return out;
      },
      py::arg("weights"), py::arg("beta"),
      "IS weights at beta 1 (float32) raised to `beta`, in float32 as the C++ tree raises them.");
  m.def(
      "run_parallel_for_test",
      [](int64_t n, int threads, int64_t failing_item) {
        ReleasedGil nogil;
        parallel_for(n, threads, [&](int64_t i) {
          if (i == failing_item) throw std::runtime_error("item " + std::to_string(i) + " failed");
        });
      },
      py::arg("n"), py::arg("threads"), py::arg("failing_item"),
      "Self-test of the thread pool: runs n items on `threads` threads; item `failing_item` throws. "
      "The exception must reach the caller as RuntimeError.");

  m.def("num_threads", &num_threads,
        "Threads used by large batch operations (default: all hardware threads, of which a call uses "
        "those other processes leave idle, from /proc/stat every 0.1 s; a count set with "
        "$HETERO_REPLAY_NUM_THREADS or set_num_threads(n) is used as given).");
  m.def(
      "set_num_threads",
      [](std::optional<int> n) {
        if (n) set_num_threads(*n);
        else use_default_threads();
      },
      py::arg("n"), "Sets the threads used by large batch operations (1 = serial; None = the default).");

  py::class_<PyRowAccess>(m, "RowAccess", R"doc(
Row reads and ring writes over several arrays that share a leading row axis
(the fields of a transition store, interleaved in one record array). Gathers
prefetch the rows of the next samples and split large batches across threads.
)doc")
      .def(py::init<py::list>(), py::arg("fields"))
      .def("gather", &PyRowAccess::gather, py::arg("indices"),
           "New arrays holding rows `indices` of each field.")
      .def("write", &PyRowAccess::write, py::arg("start"), py::arg("values"),
           "Writes the rows of values[f] into field f at start, start + 1, ... (wrapping).");

  py::class_<PySumTree>(m, "SumTree", R"doc(
K-ary sum tree over `capacity` leaves with an exact minimum of the positive leaves.

Each sibling group of `fanout` values is one cache line (float32, fanout 16).
Batch operations release the GIL and use a thread pool above a few hundred items;
writers and readers are serialised by an internal reader/writer lock.
)doc")
      .def(py::init(&make_py_tree), py::arg("capacity"), py::arg("fanout") = 16, py::arg("dtype") = "float32")
      .def_property_readonly("capacity", [](const PySumTree& t) { return t.tree->capacity(); })
      .def_property_readonly("fanout", [](const PySumTree& t) { return t.tree->fanout(); })
      .def_property_readonly("dtype", &PySumTree::dtype)
      .def_property_readonly("num_levels", [](const PySumTree& t) { return t.tree->num_levels(); })
      .def(
          "total",
          [](const PySumTree& t) {
            std::shared_lock lock(t.tree->mutex());
            return t.tree->total();
          },
          "Sum of all leaves (float64).")
      .def_property_readonly(
          "max_leaf", [](const PySumTree& t) { return t.tree->max_leaf(); },
          "Largest leaf value accepted: capacity such leaves still sum to a finite value.")
      .def(
          "min",
          [](const PySumTree& t) {
            std::shared_lock lock(t.tree->mutex());
            return t.tree->min();
          },
          "Smallest leaf > 0, or inf if there is none.")
      .def(
          "update",
          [](PySumTree& t, py::handle idx_obj, py::handle val_obj) {
            IndexArray idx = as_indices(idx_obj);
            py::array val = t.values_as_dtype(val_obj, "priorities");
            if (val.size() != idx.size())
              throw py::value_error("got " + std::to_string(idx.size()) + " indices but " +
                                    std::to_string(val.size()) + " priorities");
            ReleasedGil nogil;
            std::unique_lock lock(t.tree->mutex());
            t.tree->update(idx.data(), val.data(), idx.size());
          },
          py::arg("indices"), py::arg("priorities"),
          "Sets leaves[indices] = priorities (last write wins for repeated indices).")
      .def(
          "update_td",
          [](PySumTree& t, py::handle idx_obj, py::handle td_obj, double alpha, double eps,
             std::optional<int64_t> limit) {
            auto [idx, td] = td_inputs(idx_obj, td_obj);
            ReleasedGil nogil;
            std::unique_lock lock(t.tree->mutex());
            return t.tree->update_td(idx.data(), td.data(), idx.size(), alpha, eps,
                                     limit.value_or(t.tree->capacity()));
          },
          py::arg("indices"), py::arg("td_errors"), py::arg("alpha"), py::arg("eps"),
          py::arg("limit") = py::none(),
          "Sets leaves[indices] = (td + eps) ** alpha from |TD errors| and returns max(td + eps). "
          "Indices must lie in [0, limit) (default: capacity).")
      .def(
          "update_td_since",
          [](PySumTree& t, py::handle idx_obj, py::handle td_obj, double alpha, double eps,
             std::optional<int64_t> limit, py::object written_at, int64_t epoch, bool filled_only) {
            auto [idx, td] = td_inputs(idx_obj, td_obj);
            JobContext context{t.tree.get(), {}, nullptr, t.tree->capacity()};
            if (!written_at.is_none()) {
              const char* wrong = "written_at must be a C-contiguous int64 array of capacity entries";
              if (!py::isinstance<py::array>(written_at)) throw py::value_error(wrong);
              py::array w = py::reinterpret_borrow<py::array>(written_at);
              if (!(w.flags() & py::array::c_style) || !w.dtype().equal(py::dtype::of<int64_t>()) ||
                  w.size() != context.capacity)
                throw py::value_error(wrong);
              context.written_at = static_cast<const int64_t*>(w.data());
            }
            Job job;
            job.alpha = alpha;
            job.eps = eps;
            job.limit = limit.value_or(context.capacity);
            UpdateTask u;
            u.idx = idx.data();
            u.td = td.data();
            u.n = idx.size();
            u.epoch = epoch;
            u.filled_only = filled_only;
            {
              ReleasedGil nogil;
              detail::apply_update(context, job, u);
            }
            if (u.error == JobError::kIndex) throw py::index_error(u.message);
            if (u.error == JobError::kValue) throw py::value_error(u.message);
            if (u.error != JobError::kNone) throw std::runtime_error(u.message);
            return py::make_tuple(u.dropped, u.max_raw);
          },
          py::arg("indices"), py::arg("td_errors"), py::arg("alpha"), py::arg("eps"), py::arg("limit"),
          py::arg("written_at"), py::arg("epoch"), py::arg("filled_only") = false,
          "update_td for a batch drawn at write `epoch`, by the native executor's rule: entries whose "
          "slot was written after it (written_at[slot] > epoch; written_at None: none) are dropped, and "
          "with filled_only an index whose leaf is 0 is refused (IndexError). Returns (entries dropped, "
          "max(td + eps) of the rest); nothing changes on error, whose positions count the entries kept.")
      .def(
          "get",
          [](const PySumTree& t, py::handle idx_obj) {
            IndexArray idx = as_indices(idx_obj);
            py::array out(t.dtype(), idx.size());
            void* o = out.mutable_data();
            ReleasedGil nogil;
            std::shared_lock lock(t.tree->mutex());
            t.tree->get(idx.data(), idx.size(), o);
            return out;
          },
          py::arg("indices"), "Leaf values at `indices`.")
      .def(
          "find",
          [](const PySumTree& t, py::handle mass_obj) {
            py::array any = as_1d(mass_obj, "mass");
            require_numeric(any, "mass");
            DoubleArray mass = DoubleArray::ensure(any);
            IndexArray out(mass.size());
            int64_t* o = out.mutable_data();
            ReleasedGil nogil;
            std::shared_lock lock(t.tree->mutex());
            t.tree->find(mass.data(), mass.size(), o);
            return out;
          },
          py::arg("mass"), "Leaf whose prefix-sum interval holds each mass in [0, total).")
      .def(
          "sample",
          [](PySumTree& t, int64_t batch_size, py::handle rng, double beta, bool stratified) {
            if (batch_size <= 0)
              throw py::value_error("batch_size must be > 0, got " + std::to_string(batch_size));
            {  // refuse before drawing: a refused call leaves the generator as it was
              std::shared_lock lock(t.tree->mutex());
              if (!(t.tree->total() > 0.0))
                throw py::value_error("the tree holds no priority mass (all priorities are 0)");
            }
            py::array_t<double> u(batch_size);
            t.uniforms.draw(rng, u.mutable_data(), batch_size);
            IndexArray idx(batch_size);
            py::array_t<float> w(batch_size);
            int64_t* io = idx.mutable_data();
            float* wo = w.mutable_data();
            {
              ReleasedGil nogil;
              std::shared_lock lock(t.tree->mutex());
              t.tree->sample(u.data(), batch_size, stratified, beta, io, wo);
            }
            return py::make_tuple(idx, w);
          },
          py::arg("batch_size"), py::arg("rng"), py::arg("beta"), py::arg("stratified") = true,
          "Draws `batch_size` leaves with probability leaf / total using `rng` "
          "(a numpy Generator) and returns (indices, IS weights (min / leaf) ** beta).")
      .def(
          "leaves",
          [](const PySumTree& t) {
            py::array out(t.dtype(), t.tree->capacity());
            void* o = out.mutable_data();
            ReleasedGil nogil;
            std::shared_lock lock(t.tree->mutex());
            t.tree->leaves(o);
            return out;
          },
          "Copy of all `capacity` leaves.")
      .def(
          "load_leaves",
          [](PySumTree& t, py::handle val_obj) {
            py::array val = t.values_as_dtype(val_obj, "leaves");
            if (val.size() != t.tree->capacity())
              throw py::value_error("expected " + std::to_string(t.tree->capacity()) + " leaves, got " +
                                    std::to_string(val.size()));
            ReleasedGil nogil;
            std::unique_lock lock(t.tree->mutex());
            t.tree->load_leaves(val.data());
          },
          py::arg("leaves"), "Replaces all leaves and rebuilds the tree in O(capacity).")
      .def(py::pickle(
          [](const PySumTree& t) {
            py::array leaves(t.dtype(), t.tree->capacity());
            {
              std::shared_lock lock(t.tree->mutex());
              t.tree->leaves(leaves.mutable_data());
            }
            return py::make_tuple(t.tree->capacity(), t.tree->fanout(), t.dtype(), leaves);
          },
          [](py::tuple s) {
            if (s.size() != 4) throw std::runtime_error("invalid SumTree pickle state");
            auto t = make_py_tree(s[0].cast<int64_t>(), s[1].cast<int>(), s[2]);
            py::array val = t->values_as_dtype(s[3], "leaves");
            t->tree->load_leaves(val.data());
            return t;
          }))
      .def("__repr__", [](const PySumTree& t) {
        return "SumTree(capacity=" + std::to_string(t.tree->capacity()) +
               ", fanout=" + std::to_string(t.tree->fanout()) +
               ", dtype=" + (t.float64() ? "float64" : "float32") + ")";
      });
  register_executor(m);
}
