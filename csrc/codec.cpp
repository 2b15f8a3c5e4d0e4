// Field codecs: rows compressed one by one with C-Blosc2 (its LZ4 or Zstd), decompressed in the gather.
//
// C-Blosc2 comes from the blosc2 wheel, a build requirement: the wheel ships the static library
// (libblosc2.a, position independent, LZ4 and Zstd inside) and its headers, so the extension links
// it in and nothing is loaded or downloaded at run time (CMakeLists.txt finds the wheel).
//
// A record is [CRC-32C of the chunk, 4 bytes little-endian][Blosc2 chunk]. The CRC catches a damaged
// record that would still decompress (a flipped literal byte); Blosc2 itself checks the chunk's
// structure. Compression runs in the writer's process, decompression of a sampled batch on the
// batch thread pool with the GIL released, one distinct record per task (records are independent chunks).
//
// Blosc2's chunk rather than LZ4's or Zstd's own block calls: the wheel ships no lz4.h or zstd.h, and
// the chunk layer costs little on top of either codec's decode (an 84x84 MsPacman frame, one thread:
// LZ4 1.8 us through Blosc2, 1.9-3.0 us as a bare LZ4 block; Zstd about 7 us either way).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <blosc2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "hetero_replay/record_codec.hpp"
#include "hetero_replay/task_pool.hpp"
#include "released_gil.hpp"

namespace py = pybind11;
using namespace hetero_replay;

namespace {

constexpr size_t kCrcBytes = 4;

// CRC-32C (Castagnoli, reflected, as iSCSI and ext4 use it): x86's SSE4.2 computes it in one instruction
// per 8 bytes. The CRC guards every record decompressed, and computed a byte a step (CRC-32 through one
// table) it took three times as long as LZ4 took to decompress the frame (5.5 vs 1.8 us for a 2.5 KB
// MsPacman record); eight bytes a step through eight tables (the fallback) took 1.2 us, the instruction
// about a quarter of that. Both give the same value (tests check them against a reference).
constexpr uint32_t kCastagnoli = 0x82F63B78u;  // the polynomial, reflected

uint32_t crc32c_tables(const uint8_t* data, size_t size) {
  using Tables = std::array<std::array<uint32_t, 256>, 8>;
  static const Tables tables = [] {
    Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? kCastagnoli ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (size_t k = 1; k < 8; ++k)
      for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (; size >= 8; data += 8, size -= 8) {
    // Bytes in stream order, so the result does not depend on the machine's byte order.
    const uint32_t lo =
        c ^ (data[0] | uint32_t{data[1]} << 8 | uint32_t{data[2]} << 16 | uint32_t{data[3]} << 24);
    const uint32_t hi = data[4] | uint32_t{data[5]} << 8 | uint32_t{data[6]} << 16 | uint32_t{data[7]} << 24;
    c = tables[7][lo & 0xFFu] ^ tables[6][(lo >> 8) & 0xFFu] ^ tables[5][(lo >> 16) & 0xFFu] ^
        tables[4][lo >> 24] ^ tables[3][hi & 0xFFu] ^ tables[2][(hi >> 8) & 0xFFu] ^
        tables[1][(hi >> 16) & 0xFFu] ^ tables[0][hi >> 24];
  }
  for (; size > 0; ++data, --size) c = tables[0][(c ^ *data) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* data, size_t size) {
  uint64_t c = 0xFFFFFFFFu;
  for (; size >= 8; data += 8, size -= 8) {
    uint64_t word;  // x86 is little-endian: the word's low byte is the stream's first
    std::memcpy(&word, data, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; size > 0; ++data, --size) c32 = _mm_crc32_u8(c32, *data);
  return c32 ^ 0xFFFFFFFFu;
}
#endif

using CrcFunction = uint32_t (*)(const uint8_t*, size_t);

// The instruction where the CPU has it, else the tables.
CrcFunction fastest_crc32c() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return crc32c_sse42;
#endif
  return crc32c_tables;
}

uint32_t crc32c(const uint8_t* data, size_t size) {
  static const CrcFunction crc = fastest_crc32c();
  return crc(data, size);
}

uint8_t compcode_of(const std::string& codec) {
  if (codec == "lz4") return BLOSC_LZ4;
  if (codec == "zstd") return BLOSC_ZSTD;
  throw py::value_error("codec must be 'lz4' or 'zstd', got '" + codec + "'");
}

// Compression contexts per thread and setting, kept: a context is not thread-safe, and making one per row
// would allocate on every add. The row size is part of the setting: a context keeps the block size it chose
// for its first rows, so one made for 7 KB frames would pack 28 KB stacks about 2x larger. A few settings
// (a frame pool's frames and a field's stacks) alternate in one process, hence a small cache, oldest out.
blosc2_context* compression_context(uint8_t compcode, int level, int64_t row_bytes) {
  struct Cached {
    uint8_t compcode = 0;
    int level = -1;
    int64_t row_bytes = -1;
    blosc2_context* ctx = nullptr;
  };
  constexpr size_t kKept = 4;
  thread_local std::array<Cached, kKept> cache{};
  thread_local size_t oldest = 0;
  for (const Cached& c : cache)
    if (c.ctx != nullptr && c.compcode == compcode && c.level == level && c.row_bytes == row_bytes)
      return c.ctx;
  Cached& slot = cache[oldest];
  oldest = (oldest + 1) % kKept;
  if (slot.ctx != nullptr) blosc2_free_ctx(slot.ctx);
  blosc2_cparams params = BLOSC2_CPARAMS_DEFAULTS;
  params.compcode = compcode;
  params.clevel = static_cast<uint8_t>(level);
  params.typesize = 1;  // bytes: a shuffle would have nothing to reorder
  params.nthreads = 1;  // rows are parallel tasks; no thread inside Blosc2
  params.filters[BLOSC2_MAX_FILTERS - 1] = BLOSC_NOSHUFFLE;
  slot = {compcode, level, row_bytes, blosc2_create_cctx(params)};
  if (slot.ctx == nullptr) throw std::runtime_error("blosc2_create_cctx failed");
  return slot.ctx;
}

blosc2_context* decompression_context() {
  thread_local blosc2_context* ctx = nullptr;
  if (ctx == nullptr) {
    blosc2_dparams params = BLOSC2_DPARAMS_DEFAULTS;
    params.nthreads = 1;
    ctx = blosc2_create_dctx(params);
    if (ctx == nullptr) throw std::runtime_error("blosc2_create_dctx failed");
  }
  return ctx;
}

using RowArray = py::array_t<uint8_t, py::array::c_style>;

// Rows (n, row_bytes) uint8 -> n records (bytes).
py::list compress_rows(const RowArray& rows, const std::string& codec, int level) {
  if (rows.ndim() != 2) throw py::value_error("compress_rows: rows must be 2-D (rows, bytes)");
  const uint8_t compcode = compcode_of(codec);
  if (level < 0 || level > 9) throw py::value_error("level must be in [0, 9], got " + std::to_string(level));
  const int64_t n = rows.shape(0), row_bytes = rows.shape(1);
  if (row_bytes > INT32_MAX - BLOSC2_MAX_OVERHEAD)
    throw py::value_error("compress_rows: a row of " + std::to_string(row_bytes) + " bytes is too large");
  const uint8_t* src = rows.data();
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  std::vector<int> failed(static_cast<size_t>(n), 0);
  {
    ReleasedGil nogil;
    parallel_for(n, TaskPool::instance().threads(), [&](int64_t i) {
      std::vector<uint8_t>& rec = out[static_cast<size_t>(i)];
      rec.resize(kCrcBytes + static_cast<size_t>(row_bytes) + BLOSC2_MAX_OVERHEAD);
      const int size =
          blosc2_compress_ctx(compression_context(compcode, level, row_bytes), src + i * row_bytes,
                              static_cast<int32_t>(row_bytes), rec.data() + kCrcBytes,
                              static_cast<int32_t>(rec.size() - kCrcBytes));
      if (size <= 0) {
        failed[static_cast<size_t>(i)] = size;
        return;
      }
      rec.resize(kCrcBytes + static_cast<size_t>(size));
      const uint32_t crc = crc32c(rec.data() + kCrcBytes, static_cast<size_t>(size));
      for (size_t b = 0; b < kCrcBytes; ++b) rec[b] = static_cast<uint8_t>(crc >> (8 * b));
    });
  }
  py::list records(n);
  for (int64_t i = 0; i < n; ++i) {
    if (failed[static_cast<size_t>(i)] != 0)
      throw std::runtime_error("blosc2 could not compress row " + std::to_string(i) + " (error " +
                               std::to_string(failed[static_cast<size_t>(i)]) + ")");
    const auto& rec = out[static_cast<size_t>(i)];
    records[static_cast<size_t>(i)] = py::bytes(reinterpret_cast<const char*>(rec.data()), rec.size());
  }
  return records;
}

}  // namespace

namespace hetero_replay {

// One record checked (CRC, chunk structure, size) and decompressed into row (row_bytes); false if damaged.
// Declared in hetero_replay/record_codec.hpp: the shared storage's record log decodes with it too.
bool decompress_record(const uint8_t* data, size_t size, uint8_t* row, int64_t row_bytes) {
  if (size <= kCrcBytes) return false;
  uint32_t stored = 0;
  for (size_t b = 0; b < kCrcBytes; ++b) stored |= static_cast<uint32_t>(data[b]) << (8 * b);
  if (stored != crc32c(data + kCrcBytes, size - kCrcBytes)) return false;
  int32_t nbytes = 0, cbytes = 0, blocksize = 0;
  return blosc2_cbuffer_sizes(data + kCrcBytes, &nbytes, &cbytes, &blocksize) >= 0 && nbytes == row_bytes &&
         static_cast<size_t>(cbytes) == size - kCrcBytes &&
         blosc2_decompress_ctx(decompression_context(), data + kCrcBytes,
                               static_cast<int32_t>(size - kCrcBytes), row,
                               static_cast<int32_t>(row_bytes)) == row_bytes;
}

}  // namespace hetero_replay

namespace {

// sources[f][indices[i]] decompressed into out[f * n + i] (n = len(indices)); returns the positions
// f * n + i whose record is damaged (its CRC or its chunk does not check out), ascending. A record that
// is None, or index -1, is a row never written: zeros. Each distinct index is decompressed once per
// source, into its first position, and copied to the others: a batch of stacked frames names most frames
// twice or more (obs and next_obs share three). One call for every source: one hand-over to the pool.
py::list decompress_fields(const std::vector<py::list>& sources,
                           const py::array_t<int64_t, py::array::c_style>& indices,
                           py::array_t<uint8_t, py::array::c_style>& out) {
  const int64_t n = indices.size();
  const auto fields = static_cast<int64_t>(sources.size());
  if (out.ndim() != 2 || out.shape(0) != fields * n)
    throw py::value_error("decompress_rows: out must be (len(sources) * len(indices), bytes)");
  const int64_t row_bytes = out.shape(1);
  const int64_t* idx = indices.data();
  for (const py::list& records : sources) {
    const auto count = static_cast<int64_t>(records.size());
    for (int64_t i = 0; i < n; ++i)
      if (idx[i] < -1 || idx[i] >= count)
        throw py::index_error("decompress_rows: index " + std::to_string(idx[i]) + " out of range");
  }
  // Positions grouped by index: group g is order[first[g]], ..., order[first[g + 1] - 1].
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [idx](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  std::vector<int64_t> first;
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || idx[order[static_cast<size_t>(k)]] != idx[order[static_cast<size_t>(k - 1)]])
      first.push_back(k);
  const auto groups = static_cast<int64_t>(first.size());
  first.push_back(n);
  std::vector<py::object> held;  // each (source, group)'s record, referenced while the GIL is released
  held.reserve(static_cast<size_t>(fields * groups));
  for (const py::list& records : sources)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i = idx[order[static_cast<size_t>(first[static_cast<size_t>(g)])]];
      py::object rec = i == -1 ? py::none() : py::object(records[static_cast<size_t>(i)]);
      if (!rec.is_none() && !PyBytes_Check(rec.ptr()))
        throw py::type_error("decompress_rows: records must be bytes");
      held.push_back(std::move(rec));
    }
  std::vector<char> damaged(held.size(), 0);
  uint8_t* const base = out.mutable_data();
  {
    ReleasedGil nogil;
    parallel_for(static_cast<int64_t>(held.size()), TaskPool::instance().threads(), [&](int64_t task) {
      const auto group = static_cast<size_t>(task % groups);
      uint8_t* dst = base + (task / groups) * n * row_bytes;
      uint8_t* row = dst + order[static_cast<size_t>(first[group])] * row_bytes;
      PyObject* rec = held[static_cast<size_t>(task)].ptr();
      if (rec == Py_None) std::memset(row, 0, static_cast<size_t>(row_bytes));
      else
        damaged[static_cast<size_t>(task)] =
            !decompress_record(reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(rec)),
                               static_cast<size_t>(PyBytes_GET_SIZE(rec)), row, row_bytes);
      for (int64_t k = first[group] + 1; k < first[group + 1]; ++k)
        std::memcpy(dst + order[static_cast<size_t>(k)] * row_bytes, row, static_cast<size_t>(row_bytes));
    });
  }
  std::vector<int64_t> bad;
  for (size_t task = 0; task < held.size(); ++task)
    if (damaged[task]) {
      const auto group = static_cast<int64_t>(task) % groups, base = static_cast<int64_t>(task) / groups * n;
      for (int64_t k = first[static_cast<size_t>(group)]; k < first[static_cast<size_t>(group) + 1]; ++k)
        bad.push_back(base + order[static_cast<size_t>(k)]);
    }
  std::sort(bad.begin(), bad.end());
  py::list result;
  for (int64_t i : bad) result.append(i);
  return result;
}

}  // namespace

void register_codec(py::module_& m) {
  blosc2_init();  // the codec registry; contexts need nothing else (no threads are started)
  m.def("compress_rows", &compress_rows, py::arg("rows"), py::arg("codec"), py::arg("level"),
        "Rows (n, bytes) uint8 compressed one by one with Blosc2's 'lz4' or 'zstd' at ``level`` (0-9):\n"
        "a list of n records, each [CRC-32C of the chunk, 4 bytes LE][Blosc2 chunk]. Threads, GIL released.");
  m.def(
      "decompress_rows",
      [](const py::list& records, const py::array_t<int64_t, py::array::c_style>& indices,
         py::array_t<uint8_t, py::array::c_style>& out) {
        return decompress_fields({records}, indices, out);
      },
      py::arg("records"), py::arg("indices"), py::arg("out"),
      "``records[indices[i]]`` decompressed into ``out[i]`` (a (n, row bytes) uint8 array) on the batch\n"
      "threads with the GIL released, each distinct index once (copied to its other positions); None "
      "records\n"
      "and index -1 give zeros. Returns the positions i whose record is damaged (CRC, chunk structure or\n"
      "size wrong), ascending; their rows in ``out`` are undefined.");
  m.def("decompress_fields", &decompress_fields, py::arg("sources"), py::arg("indices"), py::arg("out"),
        "``decompress_rows`` of several record lists at the same indices in one call: "
        "``sources[f][indices[i]]``\n"
        "into ``out[f * n + i]`` (``out``: (len(sources) * n, row bytes)); returns the damaged positions\n"
        "``f * n + i``, ascending.");
  m.def(
      "crc32c",
      [](const py::bytes& data, bool tables) {
        const std::string_view view(data);
        const auto* bytes = reinterpret_cast<const uint8_t*>(view.data());
        return (tables ? crc32c_tables : crc32c)(bytes, view.size());
      },
      py::arg("data"), py::arg("tables") = false,
      "CRC-32C of ``data`` as a record holds it (the CPU's instruction where it has one; ``tables``: the\n"
      "portable computation, for tests to compare).");
  m.attr("BLOSC2_VERSION") = BLOSC2_VERSION_STRING;
}
