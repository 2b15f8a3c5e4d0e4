// The record log of a compressed shared storage (hetero_replay/storage/record_log.py).
//
// A byte region of the shared segment used as a circular log: a 64-bit *head* counts the bytes ever
// reserved, and the byte at absolute position p lives at p mod log_bytes. A writer reserves all the
// bytes of its batch's records with one fetch_add on the head and copies each record, prefixed by
// a header (the stamp its row will be published with, and its length), to its place, wrapping at
// the end of the region (two copies; no padding, so every byte of the budget holds records).
//
// A record at absolute offset o is overwritten once a reservation reaches past o + log_bytes, so
// a reader copies (decompresses) it and then re-reads the head, seqlock-style: the record is sound
// only if the head is still <= o + log_bytes, its header names the row's stamp and length, and its
// CRC-32C checks out (the last two catch a writer that reserved long ago and copied only now,
// over newer records).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "hetero_replay/record_codec.hpp"
#include "hetero_replay/ring_slots.hpp"
#include "hetero_replay/task_pool.hpp"
#include "released_gil.hpp"

namespace py = pybind11;
using namespace hetero_replay;

namespace {

// The header before each record: the stamp of its row (ticket + 1) and the record's length.
struct RecordHeader {
  int64_t stamp;
  int64_t length;
};
constexpr int64_t kHeaderBytes = sizeof(RecordHeader);

struct Log {
  uint8_t* data;
  int64_t bytes;
  int64_t* head;
};

Log log_of(py::handle data_obj, py::handle head_obj) {
  for (auto [obj, what, dtype] : {std::tuple{data_obj, "log", py::dtype::of<uint8_t>()},
                                  std::tuple{head_obj, "head", py::dtype::of<int64_t>()}}) {
    if (!py::isinstance<py::array>(obj)) throw py::type_error(std::string(what) + " must be a numpy array");
    auto arr = py::reinterpret_borrow<py::array>(obj);
    if (!arr.dtype().equal(dtype) || arr.ndim() != 1 || arr.size() < 1 ||
        !(arr.flags() & py::array::c_style) || !arr.writeable())
      throw py::value_error(std::string(what) + " must be a writable, contiguous, non-empty 1-D array");
  }
  auto data = py::reinterpret_borrow<py::array>(data_obj);
  auto head = py::reinterpret_borrow<py::array>(head_obj);
  return {static_cast<uint8_t*>(data.mutable_data()), data.size(),
          static_cast<int64_t*>(head.mutable_data())};
}

// Copies n bytes to absolute log position `at`, wrapping at the end.
void put(const Log& log, int64_t at, const void* src, int64_t n) {
  const int64_t pos = at % log.bytes, first = std::min(n, log.bytes - pos);
  std::memcpy(log.data + pos, src, static_cast<size_t>(first));
  if (first < n)
    std::memcpy(log.data, static_cast<const uint8_t*>(src) + first, static_cast<size_t>(n - first));
}

// Copies n bytes from absolute log position `at`, wrapping at the end.
void get(const Log& log, int64_t at, void* dst, int64_t n) {
  const int64_t pos = at % log.bytes, first = std::min(n, log.bytes - pos);
  std::memcpy(dst, log.data + pos, static_cast<size_t>(first));
  if (first < n) std::memcpy(static_cast<uint8_t*>(dst) + first, log.data, static_cast<size_t>(n - first));
}

// Appends records (bytes; row-major: row r's field f is records[r * fields + f]) of rows published
// with `stamps`: returns each record's absolute offset (its header's).
py::array_t<int64_t> log_append(
    py::handle data_obj, py::handle head_obj, const py::list& records,
    const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& stamps) {
  const Log log = log_of(data_obj, head_obj);
  const auto n = static_cast<int64_t>(records.size());
  const int64_t rows = stamps.size();
  if (rows == 0 ? n != 0 : n % rows != 0)
    throw py::value_error("log_append: " + std::to_string(n) + " records for " + std::to_string(rows) +
                          " rows");
  const int64_t fields = rows == 0 ? 1 : n / rows;
  std::vector<const uint8_t*> src(static_cast<size_t>(n));
  std::vector<int64_t> length(static_cast<size_t>(n));
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    PyObject* rec = records[static_cast<size_t>(i)].ptr();
    if (!PyBytes_Check(rec)) throw py::type_error("log_append: records must be bytes");
    src[static_cast<size_t>(i)] = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(rec));
    length[static_cast<size_t>(i)] = PyBytes_GET_SIZE(rec);
    total += kHeaderBytes + length[static_cast<size_t>(i)];
  }
  if (total > log.bytes)
    throw py::value_error("log_append: " + std::to_string(total) + " bytes of records exceed the log's " +
                          std::to_string(log.bytes));
  py::array_t<int64_t> offsets(n);
  int64_t* off = offsets.mutable_data();
  const int64_t* st = stamps.data();
  {
    ReleasedGil nogil;  // `records` holds the bytes alive; nothing here touches Python objects
    int64_t at = __atomic_fetch_add(log.head, total, __ATOMIC_SEQ_CST);
    for (int64_t i = 0; i < n; ++i) {
      off[i] = at;
      const RecordHeader header{st[i / fields], length[static_cast<size_t>(i)]};
      // Newer reservations already reach this record's bytes (this writer was descheduled while the
      // log went round): it is lost either way, and copying it would damage theirs.
      if (load_acquire(log.head) <= at + log.bytes) {
        put(log, at, &header, kHeaderBytes);
        put(log, at + kHeaderBytes, src[static_cast<size_t>(i)], header.length);
      }
      at += kHeaderBytes + header.length;
    }
  }
  return offsets;
}

// Decompresses the records of sampled rows into `outs` (one (n, field bytes) uint8 array per field):
// offsets and lengths are the rows' (n, fields) references, stamps the rows' stamps as the reader saw
// them. Returns an int8 mask of the rows all of whose records were sound (see the file's comment).
py::array_t<int8_t> log_gather(py::handle data_obj, py::handle head_obj,
                               const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
                               const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& lengths,
                               const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& stamps,
                               const py::list& outs) {
  const Log log = log_of(data_obj, head_obj);
  const int64_t rows = stamps.size();
  const auto fields = static_cast<int64_t>(outs.size());
  if (offsets.ndim() != 2 || offsets.shape(0) != rows || offsets.shape(1) != fields || lengths.ndim() != 2 ||
      lengths.shape(0) != rows || lengths.shape(1) != fields)
    throw py::value_error("log_gather: offsets and lengths must be (rows, fields) int64");
  std::vector<uint8_t*> out(static_cast<size_t>(fields));
  std::vector<int64_t> out_bytes(static_cast<size_t>(fields));
  for (int64_t f = 0; f < fields; ++f) {
    auto arr = py::reinterpret_borrow<py::array>(outs[static_cast<size_t>(f)]);
    if (!arr.dtype().equal(py::dtype::of<uint8_t>()) || arr.ndim() != 2 || arr.shape(0) != rows ||
        !(arr.flags() & py::array::c_style) || !arr.writeable())
      throw py::value_error("log_gather: each out must be a writable C-contiguous uint8 array (rows, bytes)");
    out[static_cast<size_t>(f)] = static_cast<uint8_t*>(arr.mutable_data());
    out_bytes[static_cast<size_t>(f)] = arr.shape(1);
  }
  const int64_t* off = offsets.data();
  const int64_t* len = lengths.data();
  const int64_t* st = stamps.data();
  const int64_t tasks = rows * fields;
  // Tasks (row r, field f) = r * fields + f, grouped by field and offset: a row drawn twice is decoded once.
  std::vector<int64_t> order(static_cast<size_t>(tasks));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const int64_t fa = a % fields, fb = b % fields;
    return fa != fb ? fa < fb : off[a] < off[b];
  });
  std::vector<int64_t> first;
  for (int64_t k = 0; k < tasks; ++k) {
    const int64_t t = order[static_cast<size_t>(k)];
    if (k > 0) {
      const int64_t p = order[static_cast<size_t>(k - 1)];
      if (p % fields == t % fields && off[p] == off[t] && st[p / fields] == st[t / fields] &&
          len[p] == len[t])
        continue;
    }
    first.push_back(k);
  }
  first.push_back(tasks);
  const auto groups = static_cast<int64_t>(first.size()) - 1;
  std::vector<uint8_t> sound(static_cast<size_t>(groups), 0);
  {
    ReleasedGil nogil;
    parallel_for(groups, TaskPool::instance().threads(), [&](int64_t g) {
      const auto group = static_cast<size_t>(g);
      const int64_t t = order[static_cast<size_t>(first[group])];
      const int64_t f = t % fields, r = t / fields, bytes = out_bytes[static_cast<size_t>(f)];
      uint8_t* row = out[static_cast<size_t>(f)] + r * bytes;
      // The references come from shared memory a writer may be rewriting: bound them before use.
      const int64_t length = len[t];
      bool ok = st[r] > 0 && off[t] >= 0 && length > 0 && length <= log.bytes - kHeaderBytes;
      if (ok) {
        RecordHeader header{};
        get(log, off[t], &header, kHeaderBytes);
        ok = header.stamp == st[r] && header.length == length;
      }
      if (ok) {
        const int64_t pos = (off[t] + kHeaderBytes) % log.bytes;
        if (pos + length <= log.bytes) {
          ok = decompress_record(log.data + pos, static_cast<size_t>(length), row, bytes);
        } else {  // wraps the log's end
          thread_local std::vector<uint8_t> joined;
          joined.resize(static_cast<size_t>(length));
          get(log, off[t] + kHeaderBytes, joined.data(), length);
          ok = decompress_record(joined.data(), static_cast<size_t>(length), row, bytes);
        }
      }
      if (!ok) std::memset(row, 0, static_cast<size_t>(bytes));
      sound[group] = ok;
      for (int64_t k = first[group] + 1; k < first[group + 1]; ++k) {
        const int64_t other = order[static_cast<size_t>(k)];
        std::memcpy(out[static_cast<size_t>(f)] + (other / fields) * bytes, row, static_cast<size_t>(bytes));
      }
    });
  }
  // The seqlock's second read: after every record was copied, the head must not have reached past
  // any of them (a reservation beyond o + log_bytes may have overwritten the record at o).
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  const int64_t head = load_acquire(log.head);
  py::array_t<int8_t> intact(rows);
  int8_t* ok = intact.mutable_data();
  std::fill(ok, ok + rows, int8_t{1});
  for (int64_t g = 0; g < groups; ++g)
    if (!sound[static_cast<size_t>(g)])
      for (int64_t k = first[static_cast<size_t>(g)]; k < first[static_cast<size_t>(g) + 1]; ++k)
        ok[order[static_cast<size_t>(k)] / fields] = 0;
  for (int64_t t = 0; t < tasks; ++t)
    if (head - log.bytes > off[t]) ok[t / fields] = 0;
  return intact;
}

}  // namespace

void register_record_log(py::module_& m) {
  m.def("log_append", &log_append, py::arg("log"), py::arg("head"), py::arg("records"), py::arg("stamps"),
        "Appends ``records`` (bytes, row-major: row r's field f at r * fields + f) of rows to be published\n"
        "with ``stamps`` to the circular ``log`` (uint8): one atomic add on ``head[0]`` reserves them all,\n"
        "each is copied after a 16-byte header (its row's stamp, its length), wrapping at the log's end.\n"
        "Returns each record's absolute offset (int64). GIL released while copying.");
  m.def(
      "log_gather", &log_gather, py::arg("log"), py::arg("head"), py::arg("offsets"), py::arg("lengths"),
      py::arg("stamps"), py::arg("outs"),
      "Decompresses the records at ``offsets``/``lengths`` ((rows, fields) int64) of rows whose stamps are\n"
      "``stamps`` into ``outs`` (per field a (rows, bytes) uint8 array) on the batch threads, GIL released,\n"
      "each distinct record once. Returns an int8 mask of the rows whose records were all sound: header\n"
      "naming the row's stamp and length, CRC and size right, and not overwritten (the head, re-read\n"
      "after the copies, has not passed offset + len(log)). Unsound rows are zeros.");
}
