// Python bindings of the multi-process ring protocol (hetero_replay/ring_slots.hpp).
//
// The arrays are NumPy int64 views of a shared mapping; every function checks
// that it may write them in place, so no call ever works on a copy.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hetero_replay/io_threads.hpp"
#include "hetero_replay/ring_slots.hpp"
#include "released_gil.hpp"

namespace py = pybind11;
using namespace hetero_replay;

namespace {

int64_t* shared_int64(py::handle obj, const char* what) {
  if (!py::isinstance<py::array>(obj)) throw py::type_error(std::string(what) + " must be a numpy array");
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!arr.dtype().equal(py::dtype::of<int64_t>()) || arr.ndim() != 1 ||
      !(arr.flags() & py::array::c_style) || !arr.writeable())
    throw py::value_error(std::string(what) + " must be a writable, contiguous 1-D int64 array");
  return static_cast<int64_t*>(arr.mutable_data());
}

int64_t check_index(py::handle obj, int64_t i, const char* what) {
  const int64_t n = py::reinterpret_borrow<py::array>(obj).size();
  if (i < 0 || i >= n)
    throw py::index_error(std::string(what) + " index " + std::to_string(i) + " outside [0, " +
                          std::to_string(n) + ")");
  return i;
}

// Reads n records of `bytes` bytes at byte `offsets` of file `fd` into `out`, on `threads` threads
// (the caller included; see io_threads.hpp). Returns 0, or the errno of the first failed read (-1: the
// file ended before a record did).
int read_records(int fd, const int64_t* offsets, int64_t n, int64_t bytes, uint8_t* out, int threads) {
  return run_io_tasks(n, threads,
                      [&](int64_t k) { return pread_all(fd, out + k * bytes, bytes, offsets[k]); });
}

}  // namespace

void register_ring(py::module_& m) {
  m.def(
      "atomic_add",
      [](py::handle words, int64_t i, int64_t n) {
        int64_t* p = shared_int64(words, "words") + check_index(words, i, "words");
        return __atomic_fetch_add(p, n, __ATOMIC_SEQ_CST);
      },
      py::arg("words"), py::arg("index"), py::arg("n"),
      "Atomically adds n to words[index]; returns the old value.");
  m.def(
      "atomic_cas",
      [](py::handle words, int64_t i, int64_t expected, int64_t desired) {
        int64_t* p = shared_int64(words, "words") + check_index(words, i, "words");
        __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        return expected;
      },
      py::arg("words"), py::arg("index"), py::arg("expected"), py::arg("desired"),
      "Sets words[index] = desired if it equals expected; returns the value found (== expected: swapped).");
  m.def(
      "atomic_store",
      [](py::handle words, int64_t i, int64_t value) {
        int64_t* p = shared_int64(words, "words") + check_index(words, i, "words");
        __atomic_store_n(p, value, __ATOMIC_SEQ_CST);
      },
      py::arg("words"), py::arg("index"), py::arg("value"),
      "Stores words[index] = value (sequentially consistent).");
  m.def(
      "stamps_at",
      [](py::handle stamps, py::array_t<int64_t, py::array::c_style | py::array::forcecast> slots) {
        const int64_t* s = shared_int64(stamps, "stamps");
        const int64_t n = py::reinterpret_borrow<py::array>(stamps).size();
        py::array_t<int64_t> out(slots.size());
        int64_t* o = out.mutable_data();
        const int64_t* idx = slots.data();
        // Orders the caller's earlier reads of rows before these loads (the seqlock's second read).
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        for (py::ssize_t k = 0; k < slots.size(); ++k) {
          if (idx[k] < 0 || idx[k] >= n)
            throw py::index_error("slot " + std::to_string(idx[k]) + " out of range");
          o[k] = load_acquire(s + idx[k]);
        }
        return out;
      },
      py::arg("stamps"), py::arg("slots"),
      "The stamps of `slots`, read after every read the caller made before (acquire fence).");
  m.def(
      "ring_acquire",
      [](py::handle stamps, int64_t first_ticket, int64_t n, int64_t tag) {
        int64_t* s = shared_int64(stamps, "stamps");
        const int64_t capacity = py::reinterpret_borrow<py::array>(stamps).size();
        if (first_ticket < 0 || n < 0 || tag < 1 || tag >= (int64_t{1} << 14))
          throw py::value_error("ring_acquire: bad ticket, count or writer tag");
        py::array_t<int8_t> taken(n);
        py::array_t<int64_t> blockers(n);
        int8_t* tk = taken.mutable_data();
        int64_t* bl = blockers.mutable_data();
        int64_t lapped = 0, blocked = 0;
        for (int64_t k = 0; k < n; ++k) {
          const int64_t t = first_ticket + k;
          bl[k] = 0;
          const AcquireStatus st = acquire_slot(s + t % capacity, t, tag, bl + k);
          tk[k] = st == kAcquired;
          lapped += st == kLapped;
          blocked += st == kBlocked;
        }
        return py::make_tuple(taken, blockers, lapped, blocked);
      },
      py::arg("stamps"), py::arg("first_ticket"), py::arg("n"), py::arg("tag"),
      "Takes the slots of tickets first_ticket .. first_ticket + n - 1 for writer `tag`; returns (taken "
      "int8, "
      "blockers int64, lapped, blocked): blockers[k] != 0 is the marker of an older writer mid-row in the "
      "way of "
      "ticket k; a lapped ticket's slot is owned by a newer ticket already (its row is dropped).");
  m.def(
      "ring_steal",
      [](py::handle stamps, int64_t ticket, int64_t dead_marker, int64_t tag) {
        int64_t* s = shared_int64(stamps, "stamps");
        const int64_t capacity = py::reinterpret_borrow<py::array>(stamps).size();
        return steal_slot(s + ticket % capacity, dead_marker, tag, ticket);
      },
      py::arg("stamps"), py::arg("ticket"), py::arg("dead_marker"), py::arg("tag"),
      "Takes the slot of `ticket` from a dead writer whose marker is `dead_marker`; False if it moved "
      "meanwhile.");
  m.def(
      "ring_commit",
      [](py::handle stamps, int64_t first_ticket,
         py::array_t<int8_t, py::array::c_style | py::array::forcecast> take, int64_t tag) {
        int64_t* s = shared_int64(stamps, "stamps");
        const int64_t capacity = py::reinterpret_borrow<py::array>(stamps).size();
        int64_t committed = 0;
        const int8_t* tk = take.data();
        for (py::ssize_t k = 0; k < take.size(); ++k) {
          const int64_t t = first_ticket + k;
          if (tk[k] && commit_slot(s + t % capacity, t, tag)) ++committed;
        }
        return committed;
      },
      py::arg("stamps"), py::arg("first_ticket"), py::arg("take"), py::arg("tag"),
      "Publishes the rows of the tickets first_ticket + k where take[k]; returns how many were still ours.");
  m.def(
      "ring_scan",
      [](py::handle stamps_obj, py::handle seen_obj,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> pending, int64_t lo, int64_t hi) {
        const int64_t* stamps = shared_int64(stamps_obj, "stamps");
        int64_t* seen = shared_int64(seen_obj, "seen");
        const int64_t capacity = py::reinterpret_borrow<py::array>(stamps_obj).size();
        if (py::reinterpret_borrow<py::array>(seen_obj).size() != capacity)
          throw py::value_error("ring_scan: seen and stamps differ in length");
        std::vector<int64_t> fresh, gone, waiting;
        int64_t delta = 0;  // change in the number of slots holding a complete row
        py::array_t<int8_t> keep(pending.size());
        {
          ReleasedGil nogil;
          // Records what changed in the slot of ticket t; returns whether t's own row may still come.
          auto visit = [&](int64_t t) -> int8_t {
            const int64_t s = t % capacity;
            const int64_t cur = load_acquire(stamps + s), old = seen[s];
            if (cur != old) {
              seen[s] = cur;
              delta += (cur > 0) - (old > 0);
              if (cur > 0) fresh.push_back(s);
              else if (old > 0) gone.push_back(s);
            }
            if (cur < 0) return marker_ticket(cur) <= t;  // being written by t, or by an older ticket first
            return cur < t + 1;  // reserved, not taken yet
          };
          const int64_t* p = pending.data();
          int8_t* k = keep.mutable_data();
          for (py::ssize_t i = 0; i < pending.size(); ++i) k[i] = p[i] >= hi - capacity ? visit(p[i]) : 0;
          for (int64_t t = std::max<int64_t>(lo, std::max<int64_t>(hi - capacity, 0)); t < hi; ++t)
            if (visit(t)) waiting.push_back(t);
        }
        auto out = [](const std::vector<int64_t>& v) {
          py::array_t<int64_t> a(static_cast<py::ssize_t>(v.size()));
          std::copy(v.begin(), v.end(), a.mutable_data());
          return a;
        };
        return py::make_tuple(out(fresh), out(gone), keep, out(waiting), delta);
      },
      py::arg("stamps"), py::arg("seen"), py::arg("pending"), py::arg("lo"), py::arg("hi"),
      "The learner's poll: visits the slots of the tickets `pending` and lo .. hi - 1 (the last capacity of "
      "them), updates `seen` to their stamps, and returns (slots with a new complete row, slots whose row is "
      "being replaced, int8 mask of the pending tickets still waiting for their row, window tickets waiting, "
      "change in the number of slots holding a complete row).");
  m.def(
      "read_records",
      [](int fd, py::array_t<int64_t, py::array::c_style | py::array::forcecast> offsets, py::array out,
         int threads) {
        if (out.ndim() != 2 || !out.dtype().equal(py::dtype::of<uint8_t>()) ||
            !(out.flags() & py::array::c_style) || !out.writeable() || out.shape(0) != offsets.size())
          throw py::value_error(
              "read_records: out must be a writable C-contiguous uint8 array (len(offsets), bytes)");
        if (threads < 1)
          throw py::value_error("read_records: threads must be >= 1, got " + std::to_string(threads));
        int err;
        {
          ReleasedGil nogil;
          err = read_records(fd, offsets.data(), offsets.size(), out.shape(1),
                             static_cast<uint8_t*>(out.mutable_data()), threads);
        }
        if (err == -1) throw py::value_error("read_records: the file ends before a record does");
        if (err != 0) {
          errno = err;
          PyErr_SetFromErrno(PyExc_OSError);
          throw py::error_already_set();
        }
      },
      py::arg("fd"), py::arg("offsets"), py::arg("out"), py::arg("threads"),
      "Reads len(offsets) records of out.shape[1] bytes at those byte offsets of file descriptor fd into "
      "out, "
      "with explicit pread calls on `threads` threads (GIL released).");
}
