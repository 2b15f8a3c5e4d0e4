// hetero_replay._native.Executor: the relaxed pipeline's native executor (csrc/hetero_replay/executor.hpp).
//
// Python registers the output slots once and hands over whole jobs (the updates'
// index and TD-error arrays, the generator the draw's uniforms come from, a slot) and
// collects them in order. The uniforms are drawn at submit, on the caller's
// thread, so the generator moves in submission order whichever thread runs a job.
// Each job's arrays stay referenced here until it is collected, so the native
// thread, which never touches a Python object, always writes into live memory.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hetero_replay/executor.hpp"
#include "numpy_uniforms.hpp"
#include "released_gil.hpp"

namespace py = pybind11;

namespace hetero_replay {
SumTreeBase& native_tree_of(py::handle tree);  // csrc/bindings.cpp
}  // namespace hetero_replay

using namespace hetero_replay;

namespace {

// A C-contiguous array of dtype T with at least n entries: its data, or ValueError naming `what`.
template <typename T>
T* checked(const py::handle& obj, int64_t n, const char* what) {
  if (!py::isinstance<py::array>(obj)) throw py::type_error(std::string(what) + " must be a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!(a.flags() & py::array::c_style) || !a.dtype().is(py::dtype::of<T>()) || a.size() < n)
    throw py::value_error(std::string(what) + ": expected a C-contiguous " +
                          py::str(py::dtype::of<T>()).cast<std::string>() + " array of at least " +
                          std::to_string(n) + " entries");
  return static_cast<T*>(a.mutable_data());
}

py::object error_of(JobError kind, const std::string& message) {
  if (kind == JobError::kNone) return py::none();
  return py::make_tuple(static_cast<int>(kind), message);
}

class PyExecutor {
 public:
  PyExecutor(py::object tree, const py::list& fields, py::object written_at) : tree_(std::move(tree)) {
    JobContext context;
    context.tree = &native_tree_of(tree_);
    context.capacity = context.tree->capacity();
    for (py::handle h : fields) {
      if (!py::isinstance<py::array>(h)) throw py::type_error("Executor fields must be numpy arrays");
      py::array a = py::reinterpret_borrow<py::array>(h);
      if (a.ndim() < 1 || a.shape(0) != context.capacity)
        throw py::value_error("Executor fields need one row per tree slot");
      int64_t bytes = a.itemsize();
      for (py::ssize_t d = a.ndim() - 1; d >= 1; --d) {
        if (a.shape(d) > 1 && a.strides(d) != bytes)
          throw py::value_error("Executor: the rows of each field must be contiguous");
        bytes *= a.shape(d);
      }
      sources_.push_back(a);
      context.fields.push_back({static_cast<const char*>(a.data()), a.strides(0), bytes});
    }
    if (!written_at.is_none()) {
      context.written_at = checked<int64_t>(written_at, context.capacity, "written_at");
      written_at_ = written_at;
    }
    for (const RowField& f : context.fields) fields_.push_back(f.bytes);
    value_bytes_ = context.tree->value_bytes();
    executor_ = std::make_unique<Executor>(std::move(context));
  }

  ~PyExecutor() { executor_.reset(); }  // joins the thread first; it never takes the GIL

  // Registers output slot `index`: [indices int64, weights float32 (beta 1), weights float32 (at the
  // submit's beta), field 0, field 1, ...], each of at least `rows` rows. Checked here once; a slot is
  // re-registered when its arrays change.
  void set_slot(int64_t index, const py::list& outputs, int64_t rows) {
    if (index < 0 || rows < 0) throw py::value_error("Executor.set_slot: index and rows must be >= 0");
    if (static_cast<size_t>(py::len(outputs)) != 3 + fields_.size())
      throw py::value_error(
          "Executor.set_slot: outputs are indices, weights, raised weights and one array per field");
    Slot slot;
    slot.rows = rows;
    slot.idx = checked<int64_t>(outputs[0], rows, "output indices");
    slot.weights = checked<float>(outputs[1], rows, "output weights");
    slot.raised = checked<float>(outputs[2], rows, "output raised weights");
    for (size_t f = 0; f < fields_.size(); ++f) {
      py::handle o = outputs[3 + f];
      if (!py::isinstance<py::array>(o)) throw py::type_error("Executor outputs must be numpy arrays");
      py::array a = py::reinterpret_borrow<py::array>(o);
      if (!(a.flags() & py::array::c_style) || a.nbytes() < rows * fields_[f])
        throw py::value_error("Executor.set_slot: output field " + std::to_string(f) + " is too small");
      slot.fields.push_back(static_cast<char*>(a.mutable_data()));
    }
    slot.keep = outputs;
    if (static_cast<size_t>(index) >= slots_.size()) slots_.resize(static_cast<size_t>(index) + 1);
    slots_[static_cast<size_t>(index)] = std::move(slot);
  }

  // updates: [(indices int64, td float64, epoch, undo_indices int64 or None, undo_leaves or None)].
  // A draw of batch_size rows (0: none) from uniforms drawn here from `rng` (a numpy Generator, as
  // rng.random(batch_size) draws them) into the registered output slot `slot` (set_slot), its weights
  // also raised to `beta` (None: not).
  void submit(const py::list& updates, py::handle rng, int64_t batch_size, int64_t slot,
              std::optional<double> beta, bool stratified, double alpha, double eps, int64_t limit,
              bool wake) {
    if (batch_size < 0) throw py::value_error("Executor.submit: batch_size must be >= 0");
    Submitted s{std::make_unique<Job>(), {}, {}};
    Job& job = *s.job;
    job.alpha = alpha;
    job.eps = eps;
    job.limit = limit;
    for (py::handle h : updates) {
      py::tuple t = py::reinterpret_borrow<py::tuple>(h);
      if (t.size() != 5)
        throw py::value_error(
            "Executor.submit: an update is (indices, td, epoch, undo_indices, undo_leaves)");
      py::array idx = py::reinterpret_borrow<py::array>(t[0]);
      UpdateTask u;
      u.n = idx.size();
      u.idx = checked<int64_t>(t[0], u.n, "update indices");
      u.td = checked<double>(t[1], u.n, "update td_errors");
      if (py::reinterpret_borrow<py::array>(t[1]).size() != u.n)
        throw py::value_error("Executor.submit: indices and td_errors differ in length");
      u.epoch = t[2].cast<int64_t>();
      if (!t[3].is_none()) {
        u.undo_idx = checked<int64_t>(t[3], u.n, "undo indices");
        const bool f64 = value_bytes_ == 8;
        u.undo_leaves = f64 ? static_cast<void*>(checked<double>(t[4], u.n, "undo leaves"))
                            : static_cast<void*>(checked<float>(t[4], u.n, "undo leaves"));
      }
      job.updates.push_back(std::move(u));
      s.keep.push_back(py::reinterpret_borrow<py::object>(h));
    }
    if (batch_size > 0) {
      if (slot < 0 || static_cast<size_t>(slot) >= slots_.size() || !slots_[slot].keep)
        throw py::value_error("Executor.submit: slot " + std::to_string(slot) + " is not registered");
      const Slot& out = slots_[static_cast<size_t>(slot)];
      if (out.rows < batch_size)
        throw py::value_error("Executor.submit: slot " + std::to_string(slot) + " holds " +
                              std::to_string(out.rows) + " rows, not " + std::to_string(batch_size));
      DrawTask& d = job.draw;
      d.n = batch_size;
      d.stratified = stratified;
      d.idx_out = out.idx;
      d.weight_out = out.weights;
      if (beta) {
        d.beta = *beta;
        d.raised_out = out.raised;
      }
      d.field_out = out.fields;
      s.keep.push_back(out.keep);  // a re-registered slot's old arrays live until this job is collected
      s.uniforms.resize(static_cast<size_t>(d.n));
      uniforms_.draw(rng, s.uniforms.data(), d.n);  // last: a refused submit leaves the generator as it was
      d.uniforms = s.uniforms.data();
    }
    Job* raw = s.job.get();
    submitted_.push_back(std::move(s));
    executor_->submit(raw, wake);
  }

  // Waits (without the GIL) for the oldest job, running it here if no thread has started it;
  // returns ([(dropped, kept, max_raw, error)], draw error, nanoseconds the job ran).
  // An error is None or (kind, message): kind 1 ValueError, 2 IndexError, 3 other.
  py::tuple collect() {
    if (submitted_.empty()) throw std::runtime_error("Executor.collect: no job was submitted");
    Job* job = submitted_.front().job.get();
    {
      ReleasedGil nogil;
      executor_->wait(job);
    }
    py::list updates;
    for (const UpdateTask& u : job->updates)
      updates.append(py::make_tuple(u.dropped, u.kept, u.max_raw, error_of(u.error, u.message)));
    py::object draw = error_of(job->draw.error, job->draw.message);
    const int64_t run_ns = job->run_ns;
    submitted_.pop_front();
    return py::make_tuple(updates, draw, run_ns);
  }

  void stop() {
    ReleasedGil nogil;
    executor_->stop();
  }

  size_t pending() const { return submitted_.size(); }
  size_t finished() const {
    size_t n = 0;
    for (const Submitted& s : submitted_) n += executor_->done(s.job.get());
    return n;
  }
  bool thread_alive() const { return executor_->thread_alive(); }

 private:
  struct Slot {
    int64_t rows = 0;
    int64_t* idx = nullptr;
    float* weights = nullptr;
    float* raised = nullptr;
    std::vector<char*> fields;
    py::object keep;  // the arrays (none: not registered)
  };

  struct Submitted {
    std::unique_ptr<Job> job;
    std::vector<py::object> keep;  // the arrays the job points into
    std::vector<double> uniforms;  // its draw's
  };

  py::object tree_;
  std::vector<py::array> sources_;
  py::object written_at_;
  std::vector<int64_t> fields_;  // bytes of a row, per field
  int value_bytes_ = 4;  // the tree's leaves: float32 or float64
  std::unique_ptr<Executor> executor_;
  std::deque<Submitted> submitted_;
  std::vector<Slot> slots_;
  NumpyUniforms uniforms_;
};

}  // namespace

void register_executor(py::module_& m) {
  py::class_<PyExecutor>(m, "Executor", R"doc(
The relaxed pipeline's native executor: runs jobs (apply queued priority updates with the
epoch rule, draw a batch from a NumPy generator's uniforms, gather its rows into given arrays) in
submission order on its own thread, with no Python and no GIL.
)doc")
      .def(py::init<py::object, py::list, py::object>(), py::arg("tree"), py::arg("fields"),
           py::arg("written_at"))
      .def("set_slot", &PyExecutor::set_slot, py::arg("index"), py::arg("outputs"), py::arg("rows"),
           "Registers output slot `index` (indices, weights, raised weights, one array per field; at least "
           "`rows` rows each).")
      .def("submit", &PyExecutor::submit, py::arg("updates"), py::arg("rng"), py::arg("batch_size"),
           py::arg("slot"), py::arg("beta"), py::arg("stratified"), py::arg("alpha"), py::arg("eps"),
           py::arg("limit"), py::arg("wake") = true,
           "Queues one job (its arrays kept until collect() returns it), its uniforms drawn from rng now; "
           "wake=False hands it to the thread only where a core is idle for it, else to collect().")
      .def("collect", &PyExecutor::collect, "Waits for the oldest job and returns its results.")
      .def("stop", &PyExecutor::stop, "Ends the thread after its running job; later jobs run in collect().")
      .def_property_readonly("pending", &PyExecutor::pending, "Jobs submitted and not collected yet.")
      .def_property_readonly("finished", &PyExecutor::finished,
                             "Jobs done and not collected yet (never waits).")
      .def_property_readonly("thread_alive", &PyExecutor::thread_alive);
}
