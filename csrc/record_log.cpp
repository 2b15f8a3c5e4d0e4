// The record log of the compressed ring storages (hetero_replay/storage/record_log.py).
//
// A byte region used as a circular log, in the shared segment (storage="shared") or in a file
// (storage="disk": records.log, written with pwrite and read with pread on the disk storage's read
// threads); one implementation of the appends, the gathers and their checks serves both: a 64-bit *head*
// counts the bytes ever reserved, and the byte at absolute position p lives at p mod log_bytes. A writer
// reserves all the bytes of its batch's records with one fetch_add on the head and copies each record,
// prefixed by a header (its tag: the stamp of the row that first writes it, which rows referencing the
// record check; and its length), to its place, wrapping at the end of the region (two copies; no
// padding, so every byte of the budget holds records).
//
// A record at absolute offset o is overwritten once a reservation reaches past o + log_bytes, so
// a reader copies (decompresses) it and then re-reads the head, seqlock-style: the record is sound
// only if the head is still <= o + log_bytes, its header names the reference's tag and length, and its
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

#include "hetero_replay/io_threads.hpp"
#include "hetero_replay/record_codec.hpp"
#include "hetero_replay/ring_slots.hpp"
#include "hetero_replay/task_pool.hpp"
#include "released_gil.hpp"

namespace py = pybind11;
using namespace hetero_replay;

namespace {

// The header before each record: its tag (the stamp, ticket + 1, of the row that first wrote it) and its
// length.
struct RecordHeader {
  int64_t stamp;
  int64_t length;
};
constexpr int64_t kHeaderBytes = sizeof(RecordHeader);

// Where the log's bytes are: a memory region (data) or, where data is null, file descriptor fd.
struct Log {
  uint8_t* data;
  int fd;
  int64_t bytes;
  int64_t* head;

  // Copies n bytes (n <= bytes) to absolute log position `at`, wrapping at the end: 0 or an errno.
  int put(int64_t at, const uint8_t* src, int64_t n) const {
    const int64_t pos = at % bytes, first = std::min(n, bytes - pos);
    if (data == nullptr) {
      const int e = pwrite_all(fd, src, first, pos);
      return e != 0 || first == n ? e : pwrite_all(fd, src + first, n - first, 0);
    }
    std::memcpy(data + pos, src, static_cast<size_t>(first));
    if (first < n) std::memcpy(data, src + first, static_cast<size_t>(n - first));
    return 0;
  }

  // The n bytes (n <= bytes) at absolute log position `at`: in place where they are contiguous in
  // memory, else copied into `scratch`. Null with *error set (an errno, -1: the file ends) if unread.
  const uint8_t* span(int64_t at, int64_t n, std::vector<uint8_t>& scratch, int* error) const {
    const int64_t pos = at % bytes, first = std::min(n, bytes - pos);
    if (data != nullptr && first == n) return data + pos;
    scratch.resize(static_cast<size_t>(n));
    if (data != nullptr) {
      std::memcpy(scratch.data(), data + pos, static_cast<size_t>(first));
      std::memcpy(scratch.data() + first, data, static_cast<size_t>(n - first));
      return scratch.data();
    }
    *error = pread_all(fd, scratch.data(), first, pos);
    if (*error == 0 && first < n) *error = pread_all(fd, scratch.data() + first, n - first, 0);
    return *error == 0 ? scratch.data() : nullptr;
  }
};

// The log `log_obj` names: a writable contiguous uint8 array, or a pair (file descriptor, log bytes).
Log log_of(py::handle log_obj, py::handle head_obj) {
  if (!py::isinstance<py::array>(head_obj)) throw py::type_error("head must be a numpy array");
  auto head = py::reinterpret_borrow<py::array>(head_obj);
  if (!head.dtype().equal(py::dtype::of<int64_t>()) || head.ndim() != 1 || head.size() < 1 ||
      !(head.flags() & py::array::c_style) || !head.writeable())
    throw py::value_error("head must be a writable, contiguous, non-empty 1-D int64 array");
  auto* head_word = static_cast<int64_t*>(head.mutable_data());
  if (py::isinstance<py::tuple>(log_obj)) {
    const auto pair = py::reinterpret_borrow<py::tuple>(log_obj);
    if (pair.size() != 2) throw py::value_error("log must be a uint8 array or (fd, bytes)");
    const int fd = pair[0].cast<int>();
    const auto bytes = pair[1].cast<int64_t>();
    if (fd < 0 || bytes < 1) throw py::value_error("log (fd, bytes): fd must be >= 0 and bytes >= 1");
    return {nullptr, fd, bytes, head_word};
  }
  if (!py::isinstance<py::array>(log_obj)) throw py::type_error("log must be a numpy array or (fd, bytes)");
  auto data = py::reinterpret_borrow<py::array>(log_obj);
  if (!data.dtype().equal(py::dtype::of<uint8_t>()) || data.ndim() != 1 || data.size() < 1 ||
      !(data.flags() & py::array::c_style) || !data.writeable())
    throw py::value_error("log must be a writable, contiguous, non-empty 1-D uint8 array");
  return {static_cast<uint8_t*>(data.mutable_data()), -1, data.size(), head_word};
}

[[noreturn]] void raise_errno(int error, const char* what) {
  if (error == -1) throw py::value_error(std::string(what) + ": the record log's file ends early");
  errno = error;
  PyErr_SetFromErrno(PyExc_OSError);
  throw py::error_already_set();
}

// Appends records (bytes), each under a header naming its tag (`tags`, one per record: the stamp of
// the row that first writes it): returns each record's absolute offset (its header's).
py::array_t<int64_t> log_append(py::handle log_obj, py::handle head_obj, const py::list& records,
                                const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& tags) {
  const Log log = log_of(log_obj, head_obj);
  const auto n = static_cast<int64_t>(records.size());
  if (tags.ndim() != 1 || tags.size() != n)
    throw py::value_error("log_append: " + std::to_string(n) + " records for " + std::to_string(tags.size()) +
                          " tags (one tag a record)");
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    PyObject* rec = records[static_cast<size_t>(i)].ptr();
    if (!PyBytes_Check(rec)) throw py::type_error("log_append: records must be bytes");
    total += kHeaderBytes + PyBytes_GET_SIZE(rec);
  }
  if (total > log.bytes)
    throw py::value_error("log_append: " + std::to_string(total) + " bytes of records exceed the log's " +
                          std::to_string(log.bytes));
  // The batch as it goes into the log, headers and records back to back: one copy (a file: one
  // pwrite, two where it wraps) after the reservation.
  std::vector<uint8_t> staged(static_cast<size_t>(total));
  std::vector<int64_t> starts(static_cast<size_t>(n));
  const int64_t* tag = tags.data();
  for (int64_t i = 0, at = 0; i < n; ++i) {
    PyObject* rec = records[static_cast<size_t>(i)].ptr();
    const RecordHeader header{tag[i], PyBytes_GET_SIZE(rec)};
    starts[static_cast<size_t>(i)] = at;
    std::memcpy(staged.data() + at, &header, kHeaderBytes);
    std::memcpy(staged.data() + at + kHeaderBytes, PyBytes_AS_STRING(rec),
                static_cast<size_t>(header.length));
    at += kHeaderBytes + header.length;
  }
  py::array_t<int64_t> offsets(n);
  int64_t* off = offsets.mutable_data();
  int error = 0;
  {
    ReleasedGil nogil;
    const int64_t at = __atomic_fetch_add(log.head, total, __ATOMIC_SEQ_CST);
    for (int64_t i = 0; i < n; ++i) off[i] = at + starts[static_cast<size_t>(i)];
    // Newer reservations may already reach the first records' bytes (this writer was descheduled
    // while the log went round): those are lost either way, and copying them would damage the newer
    // ones. The records from the first one still clear on are copied.
    const int64_t clear_from = load_acquire(log.head) - log.bytes - at;
    const auto first =
        static_cast<int64_t>(std::lower_bound(starts.begin(), starts.end(), clear_from) - starts.begin());
    if (first < n) {
      const int64_t skip = starts[static_cast<size_t>(first)];
      error = log.put(at + skip, staged.data() + skip, total - skip);
    }
  }
  if (error != 0) raise_errno(error, "log_append");
  return offsets;
}

// Decompresses the records of sampled rows into `outs`, one (n, bytes) uint8 array per column, its
// rows any stride apart (a frame of a stacked field is a column whose rows are the field's rows): offsets,
// lengths and tags are the rows' (n, columns) references, a tag the stamp its record's header must name
// (rows of one record a field: the row's stamp, as the reader saw it). Returns an int8 mask of the rows
// all of whose records were sound (see the file's comment). A log in memory is decoded on the batch
// TaskPool; a log in a file on `threads` threads of their own (io_threads.hpp: they wait on the disk),
// each reading its record's span with pread.
py::array_t<int8_t> log_gather(py::handle log_obj, py::handle head_obj,
                               const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
                               const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& lengths,
                               const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& tags,
                               const py::list& outs, int threads) {
  const Log log = log_of(log_obj, head_obj);
  if (threads < 1) throw py::value_error("log_gather: threads must be >= 1, got " + std::to_string(threads));
  const int64_t rows = offsets.ndim() == 2 ? offsets.shape(0) : -1;
  const auto columns = static_cast<int64_t>(outs.size());
  for (const auto* refs : {&offsets, &lengths, &tags})
    if (refs->ndim() != 2 || refs->shape(0) != rows || refs->shape(1) != columns)
      throw py::value_error(
          "log_gather: offsets, lengths and tags must be (rows, columns) int64, a column an out");
  std::vector<uint8_t*> out(static_cast<size_t>(columns));
  std::vector<int64_t> out_bytes(static_cast<size_t>(columns)), out_stride(static_cast<size_t>(columns));
  for (int64_t c = 0; c < columns; ++c) {
    auto arr = py::reinterpret_borrow<py::array>(outs[static_cast<size_t>(c)]);
    if (!arr.dtype().equal(py::dtype::of<uint8_t>()) || arr.ndim() != 2 || arr.shape(0) != rows ||
        arr.strides(1) != 1 || arr.strides(0) < arr.shape(1) || !arr.writeable())
      throw py::value_error(
          "log_gather: each out must be a writable uint8 array (rows, bytes), its bytes contiguous and rows "
          "apart");
    out[static_cast<size_t>(c)] = static_cast<uint8_t*>(arr.mutable_data());
    out_bytes[static_cast<size_t>(c)] = arr.shape(1);
    out_stride[static_cast<size_t>(c)] = arr.strides(0);
  }
  const int64_t* off = offsets.data();
  const int64_t* len = lengths.data();
  const int64_t* tag = tags.data();
  const int64_t tasks = rows * columns;
  auto place = [&](int64_t t) {
    const auto c = static_cast<size_t>(t % columns);
    return out[c] + (t / columns) * out_stride[c];
  };
  // Tasks (row r, column c) = r * columns + c, grouped by record (offset, tag, length) and decoded size:
  // each distinct record is decoded once (a row drawn twice, a frame several stacks hold).
  std::vector<int64_t> order(static_cast<size_t>(tasks));
  std::iota(order.begin(), order.end(), int64_t{0});
  auto size_of = [&](int64_t t) { return out_bytes[static_cast<size_t>(t % columns)]; };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (off[a] != off[b]) return off[a] < off[b];
    if (tag[a] != tag[b]) return tag[a] < tag[b];
    return len[a] != len[b] ? len[a] < len[b] : size_of(a) < size_of(b);
  });
  std::vector<int64_t> first;
  for (int64_t k = 0; k < tasks; ++k) {
    const int64_t t = order[static_cast<size_t>(k)];
    if (k > 0) {
      const int64_t p = order[static_cast<size_t>(k - 1)];
      if (off[p] == off[t] && tag[p] == tag[t] && len[p] == len[t] && size_of(p) == size_of(t)) continue;
    }
    first.push_back(k);
  }
  first.push_back(tasks);
  const auto groups = static_cast<int64_t>(first.size()) - 1;
  std::vector<uint8_t> sound(static_cast<size_t>(groups), 0);
  // One group: its record read, checked (header, CRC, size) and decoded, then copied to its other places.
  // Returns an errno where the file could not be read (the record is then not sound either).
  auto decode = [&](int64_t g) -> int {
    const auto group = static_cast<size_t>(g);
    const int64_t t = order[static_cast<size_t>(first[group])];
    const int64_t bytes = size_of(t);
    uint8_t* dst = place(t);
    // The references come from memory or a file a writer may be rewriting: bound them before use.
    const int64_t length = len[t];
    bool ok = tag[t] > 0 && off[t] >= 0 && length > 0 && length <= log.bytes - kHeaderBytes;
    int error = 0;
    if (ok) {
      thread_local std::vector<uint8_t> scratch;
      const uint8_t* span = log.span(off[t], kHeaderBytes + length, scratch, &error);
      RecordHeader header{};
      if (span != nullptr) std::memcpy(&header, span, kHeaderBytes);
      ok = span != nullptr && header.stamp == tag[t] && header.length == length &&
           decompress_record(span + kHeaderBytes, static_cast<size_t>(length), dst, bytes);
    }
    if (!ok) std::memset(dst, 0, static_cast<size_t>(bytes));
    sound[group] = ok;
    for (int64_t k = first[group] + 1; k < first[group + 1]; ++k)
      std::memcpy(place(order[static_cast<size_t>(k)]), dst, static_cast<size_t>(bytes));
    return error == -1 ? 0 : error;  // a file that ends early is a damaged record, not an I/O error
  };
  int error = 0;
  {
    ReleasedGil nogil;
    if (log.data != nullptr)
      parallel_for(groups, TaskPool::instance().threads(), [&](int64_t g) { decode(g); });
    else error = run_io_tasks(groups, threads, decode);
  }
  if (error != 0) raise_errno(error, "log_gather");
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
        ok[order[static_cast<size_t>(k)] / columns] = 0;
  for (int64_t t = 0; t < tasks; ++t)
    if (head - log.bytes > off[t]) ok[t / columns] = 0;
  return intact;
}

}  // namespace

void register_record_log(py::module_& m) {
  m.def("log_append", &log_append, py::arg("log"), py::arg("head"), py::arg("records"), py::arg("tags"),
        "Appends ``records`` (bytes) to the circular ``log`` (a uint8 array, or ``(fd, bytes)``: a file\n"
        "written with pwrite): one atomic add on ``head[0]`` reserves them all, each is copied after a\n"
        "16-byte header (its tag from ``tags``, one a record; its length), wrapping at the log's end.\n"
        "Returns each record's absolute offset (int64). GIL released while copying; OSError if the file\n"
        "cannot be written.");
  m.def(
      "log_gather", &log_gather, py::arg("log"), py::arg("head"), py::arg("offsets"), py::arg("lengths"),
      py::arg("tags"), py::arg("outs"), py::arg("threads") = 1,
      "Decompresses the records at ``offsets``/``lengths`` ((rows, columns) int64) whose headers must name\n"
      "``tags`` (same shape) into ``outs`` (per column a (rows, bytes) uint8 array, rows any stride apart),\n"
      "GIL released, each distinct record once: on the batch threads from a ``log`` in memory, on\n"
      "``threads`` threads reading with pread from a log ``(fd, bytes)`` in a file (OSError if it cannot\n"
      "be read). Returns an int8 mask of the rows whose records were all sound: header naming the tag and\n"
      "length, CRC and size right, and not overwritten (the head, re-read after the copies, has not passed\n"
      "offset + len(log)). Unsound records are zeros.");
}
