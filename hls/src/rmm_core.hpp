// The Replay Management Module (RMM): a K-ary sum tree over 32-bit fixed-point
// priorities, driven by 64-bit command words and answering with 64-bit response
// words (protocol: hls/README.md). This header is the only copy of the arithmetic:
//   - the HLS top (hls/src/rmm_top.cpp) instantiates it over StaticMemory: one static
//     array per tree level, banked by K so that one node's K children are read in one
//     cycle;
//   - the C-simulation test bench (hls/tb/) runs that same top function;
//   - the emulation module hetero_replay._rmm_emu (csrc/rmm_emu.cpp) instantiates it
//     over VectorMemory: the same levels, sized at run time.
//
// Code style: Vitis HLS C++ (C++14, fixed-size loops with pragmas, no dynamic
// memory or recursion outside the memory policy and the C-simulation-only parts).
// Compile-time recursion over the levels (LevelTag overloads) stands in for loops
// over levels, because each level is a different array.
//
// Three ways the SAMPLE/FIND dataflow region executes:
//   - synthesis (__SYNTHESIS__): a DATAFLOW region of pipelined loops, one process per
//     stage, connected by hls::stream FIFOs;
//   - RMM_SEQUENTIAL_DATAFLOW (a test-bench build): those same loops run one after the
//     other, as Vitis C simulation runs a dataflow region;
//   - default (C simulation, emulation): a cycle-stepped schedule of the same per-item
//     stage functions, one firing per stage per cycle when its input FIFO holds an
//     item, so the FIFO occupancies and the cycle count are those of the hardware
//     pipeline with an always-ready result stream (a sequential run would fill every
//     FIFO with the whole batch).
#ifndef HETERO_REPLAY_HLS_RMM_CORE_HPP
#define HETERO_REPLAY_HLS_RMM_CORE_HPP

#include <stdint.h>

#include <hls_stream.h>

#include "axis_word.hpp"

#ifndef __SYNTHESIS__
#include <string>
#include <utility>
#include <vector>
#endif

#if defined(__SYNTHESIS__) || defined(RMM_SEQUENTIAL_DATAFLOW)
#define RMM_LOOP_DATAFLOW 1
#endif

// Counting statements exist in C simulation only.
#ifndef __SYNTHESIS__
#define RMM_COUNT(...) __VA_ARGS__
#else
#define RMM_COUNT(...)
#endif

// Depth of every FIFO between the SAMPLE/FIND dataflow stages (#pragma HLS STREAM).
// The test bench asserts that no FIFO ever holds more than this.
#ifndef RMM_FIFO_DEPTH
#define RMM_FIFO_DEPTH 2
#endif

// UPDATE entries buffered before their parents are refreshed (one BRAM36 of indices).
#ifndef RMM_UPDATE_CHUNK
#define RMM_UPDATE_CHUNK 1024
#endif

namespace rmm {

// ---------------------------------------------------------------- format, protocol
constexpr int kFracBits = 22;                     // leaf q = round(p * 2^22)
constexpr int kLeafBits = 32;                     // leaves are uint32
constexpr uint32_t kInitMaxDefault = 1u << 22;    // priority 1.0
constexpr uint32_t kNoMin = 0xFFFFFFFFu;          // "no positive leaf"
constexpr uint32_t kMaxCapacity = 1u << 28;       // index field width of the protocol
constexpr uint64_t kNoLeafWord = 0xFFFFFFFF00000000ull;  // SAMPLE/FIND answer when invalid
constexpr uint64_t kErrorBit = 1ull << 63;        // trailer word A
constexpr int kFifoDepth = RMM_FIFO_DEPTH;
constexpr uint32_t kUpdateChunk = RMM_UPDATE_CHUNK;

enum Opcode : uint32_t {
  kOpUpdate = 1,
  kOpInsert = 2,
  kOpSample = 3,
  kOpGet = 4,
  kOpFind = 5,
  kOpClear = 6,
};

// AXI-Lite register offsets as the host software sees them (hetero_replay.fpga).
enum Register : uint32_t {
  kRegCapacity = 0x10,   // rw
  kRegFanout = 0x18,     // ro
  kRegMaxLeaves = 0x20,  // ro
  kRegTotalLo = 0x28,    // ro
  kRegTotalHi = 0x2C,    // ro
  kRegMin = 0x30,        // ro
  kRegMax = 0x34,        // ro
  kRegInitMax = 0x40,    // rw
  kRegFracBits = 0x48,   // ro
  kRegDepth = 0x50,      // ro
  kRegErrors = 0x58,     // ro, commands flagged since reset
  kRegStatus = 0x5C,     // ro, bit 0: an error since the last read (ERRORS' ap_vld), cleared on read
};

struct RegisterName {
  const char* name;
  uint32_t offset;
  bool writable;
};
constexpr int kNumRegisters = 12;
constexpr RegisterName kRegisterNames[kNumRegisters] = {
    {"CAPACITY", kRegCapacity, true}, {"FANOUT", kRegFanout, false},    {"MAX_LEAVES", kRegMaxLeaves, false},
    {"TOTAL_LO", kRegTotalLo, false}, {"TOTAL_HI", kRegTotalHi, false}, {"MIN", kRegMin, false},
    {"MAX", kRegMax, false},          {"INIT_MAX", kRegInitMax, true},  {"FRAC_BITS", kRegFracBits, false},
    {"DEPTH", kRegDepth, false},      {"ERRORS", kRegErrors, false},    {"STATUS", kRegStatus, false},
};

enum RegisterAccess { kRegOk = 0, kRegUnknown = 1, kRegReadOnly = 2, kRegBadValue = 3 };

// Payload words that follow a command header, or -1 for "n words" (UPDATE, SAMPLE,
// GET, FIND). Unknown opcodes have none: the kernel consumes their header only.
inline uint64_t payload_words(uint32_t opcode, uint32_t n) {
  switch (opcode) {
    case kOpUpdate:
    case kOpSample:
    case kOpGet:
    case kOpFind: return n;
    case kOpInsert: return 1;
    default: return 0;
  }
}

// ---------------------------------------------------------------- tree geometry
// Level 0 holds the leaves padded to whole groups of K; level l+1 node i sums level l
// nodes [i*K, (i+1)*K); levels are added until one has exactly K nodes (the top), whose
// sum is the total. Level l is allocated as many slots as its parent level has
// children (sizes[l+1] * K), so every group a parent points at exists. This is the
// layout of hetero_replay/trees/base.py (TreeBase._alloc).
constexpr uint64_t round_up_groups(uint64_t n, uint64_t k) { return n <= k ? k : (n + k - 1) / k * k; }

constexpr int tree_depth(uint64_t capacity, uint64_t k) {
  int depth = 1;
  uint64_t size = round_up_groups(capacity, k);
  while (size != k) {
    size = round_up_groups(size / k, k);
    ++depth;
  }
  return depth;
}

// Slots allocated at `level` (0 = leaves); 0 above the top level.
constexpr uint64_t level_alloc(uint64_t capacity, uint64_t k, int level) {
  uint64_t size = round_up_groups(capacity, k);  // sizes[0]
  int l = 0;
  while (size != k && l < level + 1) {            // walk to sizes[level + 1]
    size = round_up_groups(size / k, k);
    ++l;
  }
  if (l == level + 1) return size * k;            // level below the top
  if (l == level) return k;                       // the top level
  return 0;
}

constexpr int log2_exact(uint64_t k) { return k <= 1 ? 0 : 1 + log2_exact(k / 2); }

constexpr bool valid_fanout(uint64_t k) { return k >= 2 && k <= 64 && (k & (k - 1)) == 0; }

template <int L>
struct LevelTag {};

// 64 x 32 -> upper 64 bits of the 96-bit product: (r * total) >> 32, exact.
inline uint64_t scale_draw(uint32_t r, uint64_t total) {
  const uint64_t hi = (total >> 32) * r;                    // < 2^60 (total < 2^60)
  const uint64_t lo = ((total & 0xFFFFFFFFull) * r) >> 32;  // < 2^32
  return hi + lo;
}

// Estimated pipeline latencies (cycles from an item's read to its write) used for the
// C-simulation cycle count; II is 1 everywhere. They are the design's intent at a 4 ns
// clock, not a synthesis report (see hls/README.md, "Cycle accounting").
template <int K>
struct Latency {
  static constexpr int kHeader = 2;                   // read + decode the header word
  static constexpr int kReadDraw = 1;
  static constexpr int kScale = 4;                    // 64x32 multiply in DSPs
  static constexpr int kLevel = 3 + log2_exact(K);    // bank read (2), prefix adders, encode
  static constexpr int kWriteResult = 1;
  static constexpr int kLeafWrite = 2;
  static constexpr int kRefresh = 3 + log2_exact(K);  // K-bank read (2), adder/min tree, write
  static constexpr int kGet = 3;
  static constexpr int kClear = 1;
  static constexpr int kTrailer = 3 + log2_exact(K);  // top-level adder/min tree + 2 words
};

// ---------------------------------------------------------------- memory policies
// A policy provides the level arrays: leaf(i) (level 0, uint32), and for levels
// L >= 1 sum<L>(i) (uint64) and mn<L>(i) (uint32, smallest positive leaf below, kNoMin
// for none), plus allocate(capacity) (a no-op for static arrays) and kMaxLeaves.

// Synthesis: one array per level at its size for kMaxLeaves, stored as [K][rows] with
// the bank dimension completely partitioned: element i lives in bank i % K, row i / K
// (cyclic partitioning by K), so the K children of a node are K different banks.
template <int K, uint32_t MAX_LEAVES, int L>
struct StaticLevel : StaticLevel<K, MAX_LEAVES, L - 1> {
  static constexpr uint32_t kRows = uint32_t(level_alloc(MAX_LEAVES, K, L) / K);
  uint64_t sum_[K][kRows];
  uint32_t min_[K][kRows];
  StaticLevel() {
#pragma HLS ARRAY_PARTITION variable = sum_ type = complete dim = 1
#pragma HLS ARRAY_PARTITION variable = min_ type = complete dim = 1
  }
};

template <int K, uint32_t MAX_LEAVES>
struct StaticLevel<K, MAX_LEAVES, 0> {
  static constexpr uint32_t kRows = uint32_t(level_alloc(MAX_LEAVES, K, 0) / K);
  uint32_t leaf_[K][kRows];
  StaticLevel() {
#pragma HLS ARRAY_PARTITION variable = leaf_ type = complete dim = 1
// The leaves are most of the memory (2^18 x 32 bit = 64 URAMs at K = 16, all of a KV260's;
// in BRAM36 they would need 256 of its 144).
#pragma HLS BIND_STORAGE variable = leaf_ type = ram_2p impl = uram
  }
};

template <int K, uint32_t MAX_LEAVES>
class StaticMemory {
 public:
  static constexpr uint32_t kMaxLeaves = MAX_LEAVES;
  static constexpr int kMaxDepth = tree_depth(MAX_LEAVES, K);
  static constexpr int kLog2K = log2_exact(K);

  void allocate(uint32_t /*capacity*/) {}
  uint32_t& leaf(uint32_t i) {
    return static_cast<StaticLevel<K, MAX_LEAVES, 0>&>(levels_).leaf_[i & (K - 1)][i >> kLog2K];
  }
  template <int L>
  uint64_t& sum(uint32_t i) {
    return static_cast<StaticLevel<K, MAX_LEAVES, L>&>(levels_).sum_[i & (K - 1)][i >> kLog2K];
  }
  template <int L>
  uint32_t& mn(uint32_t i) {
    return static_cast<StaticLevel<K, MAX_LEAVES, L>&>(levels_).min_[i & (K - 1)][i >> kLog2K];
  }

 private:
  StaticLevel<K, MAX_LEAVES, kMaxDepth - 1> levels_;
};

#ifndef __SYNTHESIS__
// Emulation: the same levels in std::vector, sized for the configured capacity.
template <int K>
class VectorMemory {
 public:
  static constexpr uint32_t kMaxLeaves = kMaxCapacity;
  static constexpr int kMaxDepth = tree_depth(kMaxCapacity, K);

  void allocate(uint32_t capacity) {
    const int depth = capacity == 0 ? 0 : tree_depth(capacity, K);
    leaf_.assign(depth ? level_alloc(capacity, K, 0) : 0, 0u);
    for (int l = 1; l < kMaxDepth; ++l) {
      const uint64_t n = l < depth ? level_alloc(capacity, K, l) : 0;
      sum_[l].assign(n, 0);
      min_[l].assign(n, kNoMin);
      sum_[l].shrink_to_fit();
      min_[l].shrink_to_fit();
    }
    leaf_.shrink_to_fit();
  }
  uint32_t& leaf(uint32_t i) { return leaf_[i]; }
  template <int L>
  uint64_t& sum(uint32_t i) {
    return sum_[L][i];
  }
  template <int L>
  uint32_t& mn(uint32_t i) {
    return min_[L][i];
  }

 private:
  std::vector<uint32_t> leaf_;
  std::vector<uint64_t> sum_[kMaxDepth];
  std::vector<uint32_t> min_[kMaxDepth];
};
#endif

// ---------------------------------------------------------------- counters
#ifndef __SYNTHESIS__
// C-simulation counters: firings of every loop / dataflow stage (one firing = one
// item through a pipelined loop body), the largest occupancy of every FIFO, and an
// estimated cycle count per opcode (Latency above, II = 1).
template <int MAX_DEPTH>
struct Counters {
  uint64_t commands = 0;
  uint64_t errors = 0;
  uint64_t words_in = 0;
  uint64_t words_out = 0;
  uint64_t cycles = 0;
  uint64_t cycles_by_op[7] = {};  // [opcode], [0]: unknown opcodes
  uint64_t header = 0;
  uint64_t read_draws = 0;
  uint64_t scale = 0;
  uint64_t level[MAX_DEPTH] = {};
  uint64_t write_results = 0;
  uint64_t update_leaf = 0;
  uint64_t update_refresh = 0;
  uint64_t insert_leaf = 0;
  uint64_t insert_refresh = 0;
  uint64_t get = 0;
  uint64_t clear_rows = 0;
  uint64_t trailer = 0;
  uint64_t fifo_max_draw = 0;
  uint64_t fifo_max_path[MAX_DEPTH + 1] = {};  // [MAX_DEPTH]: "scaled"; [l]: out of level l

  // (name, value) pairs in a fixed order: "fire:<stage>", "cycles", "fifo_max:<fifo>".
  std::vector<std::pair<std::string, uint64_t>> items() const {
    static const char* const kOps[7] = {"unknown", "update", "insert", "sample", "get", "find", "clear"};
    std::vector<std::pair<std::string, uint64_t>> out;
    out.emplace_back("commands", commands);
    out.emplace_back("errors", errors);
    out.emplace_back("words_in", words_in);
    out.emplace_back("words_out", words_out);
    out.emplace_back("cycles", cycles);
    for (int op = 0; op < 7; ++op) out.emplace_back(std::string("cycles:") + kOps[op], cycles_by_op[op]);
    out.emplace_back("max_depth", MAX_DEPTH);
    out.emplace_back("fifo_depth", kFifoDepth);
    out.emplace_back("fire:header", header);
    out.emplace_back("fire:read_draws", read_draws);
    out.emplace_back("fire:scale", scale);
    for (int l = MAX_DEPTH - 1; l >= 0; --l) out.emplace_back("fire:level" + std::to_string(l), level[l]);
    out.emplace_back("fire:write_results", write_results);
    out.emplace_back("fire:update_leaf", update_leaf);
    out.emplace_back("fire:update_refresh", update_refresh);
    out.emplace_back("fire:insert_leaf", insert_leaf);
    out.emplace_back("fire:insert_refresh", insert_refresh);
    out.emplace_back("fire:get", get);
    out.emplace_back("fire:clear_rows", clear_rows);
    out.emplace_back("fire:trailer", trailer);
    out.emplace_back("fifo_max:draw", fifo_max_draw);
    out.emplace_back("fifo_max:scaled", fifo_max_path[MAX_DEPTH]);
    for (int l = MAX_DEPTH - 1; l >= 0; --l)
      out.emplace_back("fifo_max:level" + std::to_string(l), fifo_max_path[l]);
    return out;
  }
};

inline void note_occupancy(uint64_t& max_seen, uint64_t size) {
  if (size > max_seen) max_seen = size;
}
#endif

// One item of the SAMPLE/FIND pipeline. Between level stages `mass` is the mass left
// to descend and `node` the group (parent node index) at the next level down; out of
// level 0, `node` is the leaf index and `mass` its value q.
struct PathItem {
  uint64_t mass;
  uint32_t node;
  uint32_t valid;
};

// ---------------------------------------------------------------- the core
template <int K, int MAX_DEPTH, class Mem>
class RmmCore {
  static_assert(valid_fanout(K), "K must be a power of two in [2, 64]");
  static_assert(MAX_DEPTH == Mem::kMaxDepth, "MAX_DEPTH must be the memory policy's depth");

 public:
  static constexpr int kFanout = K;
  static constexpr int kMaxDepth = MAX_DEPTH;
  static constexpr int kLog2K = log2_exact(K);
  static constexpr uint32_t kMaxLeaves = Mem::kMaxLeaves;
  typedef Latency<K> Lat;

  RmmCore()
      : capacity_(0),
        depth_(0),
        total_(0),
        min_(kNoMin),
        max_(kInitMaxDefault),
        init_max_(kInitMaxDefault),
        sticky_error_(false),
        error_count_(0) {
    for (int l = 0; l < MAX_DEPTH; ++l) rows_[l] = 0;
  }

  // Sets the run-time capacity (1..kMaxLeaves); a change re-sizes the levels and
  // CLEARs. Out of range: capacity 0 (every command then reports an error) and false.
  bool configure(uint32_t capacity) {
    const uint32_t cap = (capacity >= 1 && capacity <= kMaxLeaves) ? capacity : 0;
    if (cap != capacity_) {
      capacity_ = cap;
      depth_ = cap ? tree_depth(cap, K) : 0;
      for (int l = 0; l < MAX_DEPTH; ++l) rows_[l] = l < depth_ ? uint32_t(level_alloc(cap, K, l) / K) : 0;
      mem_.allocate(cap);
      clear();
    }
    return cap != 0;
  }
  void set_init_max(uint32_t value) { init_max_ = value; }

  uint32_t capacity() const { return capacity_; }
  int depth() const { return depth_; }
  uint64_t total() const { return total_; }
  uint32_t min_leaf() const { return min_; }
  uint32_t max_leaf() const { return max_; }
  uint32_t init_max() const { return init_max_; }
  bool sticky_error() const { return sticky_error_; }

  // Reads one command (header and payload) from `in`, writes its responses and the
  // two-word trailer (TLAST on the second) to `out`. Returns the command's error flag.
  bool process(hls::stream<AxisWord>& in, hls::stream<AxisWord>& out) {
    const uint64_t header = word_data(in.read());
    const uint32_t opcode = uint32_t(header >> 56);
    const uint32_t n = uint32_t(header);
    RMM_COUNT(++stats_.commands; ++stats_.header; ++stats_.words_in; cycles_ = Lat::kHeader;)
    bool error = false;
    switch (opcode) {
      case kOpUpdate: error = update(in, n); break;
      case kOpInsert: {
        const uint32_t first = uint32_t(word_data(in.read()));
        RMM_COUNT(++stats_.words_in;)
        error = insert(first, n);
        break;
      }
      case kOpSample: error = descend(in, out, n, true); break;
      case kOpFind: error = descend(in, out, n, false); break;
      case kOpGet: error = get(in, out, n); break;
      case kOpClear: clear(); break;
      default: error = true; break;
    }
    summarize();
    out.write(make_word(total_ | (error ? kErrorBit : 0), false));
    out.write(make_word((uint64_t(min_) << 32) | max_, true));
    if (error) {
      sticky_error_ = true;
      ++error_count_;
    }
    RMM_COUNT(++stats_.trailer; stats_.words_out += 2; stats_.errors += error ? 1 : 0;
              cycles_ += Lat::kTrailer; stats_.cycles += cycles_;
              stats_.cycles_by_op[opcode >= kOpUpdate && opcode <= kOpClear ? opcode : 0] += cycles_;)
    return error;
  }

  // The AXI-Lite register file as the host sees it (offsets: Register). STATUS is
  // cleared by reading it. A CAPACITY write re-sizes and CLEARs at once.
  RegisterAccess read_register(uint32_t offset, uint32_t& value) {
    switch (offset) {
      case kRegCapacity: value = capacity_; return kRegOk;
      case kRegFanout: value = K; return kRegOk;
      case kRegMaxLeaves: value = kMaxLeaves; return kRegOk;
      case kRegTotalLo: value = uint32_t(total_); return kRegOk;
      case kRegTotalHi: value = uint32_t(total_ >> 32); return kRegOk;
      case kRegMin: value = min_; return kRegOk;
      case kRegMax: value = max_; return kRegOk;
      case kRegInitMax: value = init_max_; return kRegOk;
      case kRegStatus:
        value = sticky_error_ ? 1u : 0u;
        sticky_error_ = false;
        return kRegOk;
      case kRegFracBits: value = kFracBits; return kRegOk;
      case kRegDepth: value = uint32_t(depth_); return kRegOk;
      case kRegErrors: value = error_count_; return kRegOk;
      default: return kRegUnknown;
    }
  }
  RegisterAccess write_register(uint32_t offset, uint32_t value) {
    switch (offset) {
      case kRegCapacity:
        if (value < 1 || value > kMaxLeaves) return kRegBadValue;
        if (value == capacity_) {
          clear();  // a write always leaves a CLEARed tree
          summarize();
        } else {
          configure(value);
        }
        return kRegOk;
      case kRegInitMax: init_max_ = value; return kRegOk;
      case kRegFanout:
      case kRegMaxLeaves:
      case kRegTotalLo:
      case kRegTotalHi:
      case kRegMin:
      case kRegMax:
      case kRegStatus:
      case kRegFracBits:
      case kRegDepth:
      case kRegErrors: return kRegReadOnly;
      default: return kRegUnknown;
    }
  }

#ifndef __SYNTHESIS__
  const Counters<MAX_DEPTH>& counters() const { return stats_; }
  void reset_counters() { stats_ = Counters<MAX_DEPTH>(); }
#endif

 private:
  // ------------------------------------------------------------ reading a group
  // The K children of group g at level L (g = their parent's index): sums, and
  // smallest positive leaf below each (kNoMin for none). Level 0 is the leaves.
  void read_group(LevelTag<0>, uint32_t g, uint64_t (&s)[K], uint32_t (&m)[K]) {
#pragma HLS INLINE
    for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
      const uint32_t q = mem_.leaf(g * K + j);
      s[j] = q;
      m[j] = q ? q : kNoMin;
    }
  }
  template <int L>
  void read_group(LevelTag<L>, uint32_t g, uint64_t (&s)[K], uint32_t (&m)[K]) {
#pragma HLS INLINE
    for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
      s[j] = mem_.template sum<L>(g * K + j);
      m[j] = mem_.template mn<L>(g * K + j);
    }
  }

  // Sum and min of K children (adder tree / min tree after unrolling).
  static void reduce(const uint64_t (&s)[K], const uint32_t (&m)[K], uint64_t& sum, uint32_t& mn) {
#pragma HLS INLINE
    uint64_t acc = 0;
    uint32_t low = kNoMin;
    for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
      acc += s[j];
      low = m[j] < low ? m[j] : low;
    }
    sum = acc;
    mn = low;
  }

  // Node p of level L (L >= 1) := reduction of its K children at level L - 1.
  template <int L>
  void refresh_node(uint32_t p) {
#pragma HLS INLINE
    uint64_t s[K];
    uint32_t m[K];
#pragma HLS ARRAY_PARTITION variable = s type = complete
#pragma HLS ARRAY_PARTITION variable = m type = complete
    read_group(LevelTag<L - 1>(), p, s, m);
    uint64_t sum;
    uint32_t mn;
    reduce(s, m, sum, mn);
    mem_.template sum<L>(p) = sum;
    mem_.template mn<L>(p) = mn;
  }

  // ------------------------------------------------------------ total and min
  // total_ and min_ from the top level (level depth_ - 1), after every command.
  void summarize() { summarize_level(LevelTag<0>()); }
  void summarize_level(LevelTag<MAX_DEPTH>) {
    if (depth_ == 0) {
      total_ = 0;
      min_ = kNoMin;
    }
  }
  template <int L>
  void summarize_level(LevelTag<L>) {
    if (L == depth_ - 1) {
      uint64_t s[K];
      uint32_t m[K];
#pragma HLS ARRAY_PARTITION variable = s type = complete
#pragma HLS ARRAY_PARTITION variable = m type = complete
      read_group(LevelTag<L>(), 0, s, m);
      reduce(s, m, total_, min_);
    }
    summarize_level(LevelTag<L + 1>());
  }

  // ------------------------------------------------------------ CLEAR
  // One loop over the rows of the leaf level; each iteration zeroes one row (K slots,
  // one per bank) of every level that has that row.
  void clear() {
    const uint32_t rows = rows_[0];
    for (uint32_t r = 0; r < rows; ++r) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 16384
      for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
        mem_.leaf(r * K + j) = 0;
      }
      clear_row(LevelTag<1>(), r);
      RMM_COUNT(++stats_.clear_rows;)
    }
    RMM_COUNT(cycles_ += rows ? rows + Lat::kClear : 0;)
    total_ = 0;
    min_ = kNoMin;
    max_ = init_max_;
  }
  void clear_row(LevelTag<MAX_DEPTH>, uint32_t) {}
  template <int L>
  void clear_row(LevelTag<L>, uint32_t r) {
#pragma HLS INLINE
    if (r < rows_[L]) {
      for (int j = 0; j < K; ++j) {
#pragma HLS UNROLL
        mem_.template sum<L>(r * K + j) = 0;
        mem_.template mn<L>(r * K + j) = kNoMin;
      }
    }
    clear_row(LevelTag<L + 1>(), r);
  }

  // ------------------------------------------------------------ UPDATE
  // Leaves are written in order (last write wins); then, level by level, every touched
  // parent is recomputed from its K children, so updates that share a parent are
  // right in any order. Entries are buffered RMM_UPDATE_CHUNK at a time: a refresh
  // recomputes from the children, so refreshing per chunk ends in the same state.
  bool update(hls::stream<AxisWord>& in, uint32_t n) {
    bool error = false;
    uint32_t touched[kUpdateChunk];
    uint32_t done = 0;
    while (done < n) {
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4
      const uint32_t chunk = (n - done) < kUpdateChunk ? (n - done) : kUpdateChunk;
      uint32_t count = 0;
      for (uint32_t i = 0; i < chunk; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 1024
        const uint64_t w = word_data(in.read());
        const uint32_t index = uint32_t(w >> 32);
        const uint32_t q = uint32_t(w);
        if (index < capacity_) {
          mem_.leaf(index) = q;
          max_ = q > max_ ? q : max_;
          touched[count++] = index;
        } else {
          error = true;
        }
        RMM_COUNT(++stats_.update_leaf; ++stats_.words_in;)
      }
      RMM_COUNT(cycles_ += chunk ? chunk + Lat::kLeafWrite : 0;)
      refresh_touched(LevelTag<1>(), touched, count);
      done += chunk;
    }
    return error;
  }
  void refresh_touched(LevelTag<MAX_DEPTH>, const uint32_t*, uint32_t) {}
  template <int L>
  void refresh_touched(LevelTag<L>, const uint32_t* touched, uint32_t count) {
    if (L < depth_) {
      for (uint32_t i = 0; i < count; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 1024
        refresh_node<L>(touched[i] >> (kLog2K * L));
        RMM_COUNT(++stats_.update_refresh;)
      }
      RMM_COUNT(cycles_ += count ? count + Lat::kRefresh : 0;)
    }
    refresh_touched(LevelTag<L + 1>(), touched, count);
  }

  // ------------------------------------------------------------ INSERT
  // Leaves first, first+1, ... (mod capacity) := the running max; then per level the
  // contiguous parent range(s) above them are refreshed once each.
  bool insert(uint32_t first, uint32_t n) {
    if (n > capacity_ || first >= capacity_) return true;
    const uint32_t value = max_;
    uint32_t index = first;
    for (uint32_t i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 1024
      mem_.leaf(index) = value;
      index = index + 1 == capacity_ ? 0 : index + 1;
      RMM_COUNT(++stats_.insert_leaf;)
    }
    RMM_COUNT(cycles_ += n ? n + Lat::kLeafWrite : 0;)
    if (n == 0) return false;
    // Leaf segments [first, end_a) and, when the range wraps, [0, end_b).
    const uint64_t end = uint64_t(first) + n;
    const uint32_t end_a = end < capacity_ ? uint32_t(end) : capacity_;
    const uint32_t end_b = end > capacity_ ? uint32_t(end - capacity_) : 0;
    refresh_ranges(LevelTag<1>(), first, end_a, end_b);
    return false;
  }
  void refresh_ranges(LevelTag<MAX_DEPTH>, uint32_t, uint32_t, uint32_t) {}
  template <int L>
  void refresh_ranges(LevelTag<L>, uint32_t first, uint32_t end_a, uint32_t end_b) {
    if (L < depth_) {
      refresh_range<L>(first, end_a);
      if (end_b) refresh_range<L>(0, end_b);
    }
    refresh_ranges(LevelTag<L + 1>(), first, end_a, end_b);
  }
  // Refreshes the level-L ancestors of leaves [lo, hi) (hi > lo).
  template <int L>
  void refresh_range(uint32_t lo, uint32_t hi) {
    const uint32_t p_lo = lo >> (kLog2K * L);
    const uint32_t p_hi = (hi - 1) >> (kLog2K * L);
    for (uint32_t p = p_lo; p <= p_hi; ++p) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 1024
      refresh_node<L>(p);
      RMM_COUNT(++stats_.insert_refresh;)
    }
    RMM_COUNT(cycles_ += (p_hi - p_lo + 1) + Lat::kRefresh;)
  }

  // ------------------------------------------------------------ GET
  bool get(hls::stream<AxisWord>& in, hls::stream<AxisWord>& out, uint32_t n) {
    bool error = false;
    for (uint32_t i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 1024
      const uint32_t index = uint32_t(word_data(in.read()));
      uint32_t q = 0;
      if (index < capacity_) {
        q = mem_.leaf(index);
      } else {
        error = true;
      }
      out.write(make_word((uint64_t(index) << 32) | q, false));
      RMM_COUNT(++stats_.get; ++stats_.words_in; ++stats_.words_out;)
    }
    RMM_COUNT(cycles_ += n ? n + Lat::kGet : 0;)
    return error;
  }

  // ------------------------------------------------------------ SAMPLE / FIND
  // Stage functions: each handles one item (one firing of its pipelined loop).
  static void read_draw_step(hls::stream<AxisWord>& in, hls::stream<uint64_t>& draws) {
#pragma HLS INLINE
    draws.write(word_data(in.read()));
  }
  // SAMPLE: m = (r * total) >> 32 for the 32-bit fraction r (< total when total > 0).
  // FIND: m is the word itself and must be < total.
  static void scale_step(hls::stream<uint64_t>& draws, hls::stream<PathItem>& out, bool sample,
                         uint64_t total) {
#pragma HLS INLINE
    const uint64_t w = draws.read();
    PathItem item;
    item.mass = sample ? scale_draw(uint32_t(w), total) : w;
    item.node = 0;
    item.valid = (total != 0 && item.mass < total) ? 1 : 0;
    out.write(item);
  }
  // Level L: among the K children of group item.node pick the first j whose prefix sum
  // c_0 + ... + c_j exceeds the mass (j = number of prefixes <= mass), subtract the
  // prefix before it and go down to child j. Levels at or above the run-time depth
  // pass the item through.
  template <int L>
  void level_step(hls::stream<PathItem>& in, hls::stream<PathItem>& out, int depth) {
#pragma HLS INLINE
    PathItem item = in.read();
    if (item.valid && L < depth) {
      uint64_t s[K];
      uint32_t m[K];
      uint64_t prefix[K];
#pragma HLS ARRAY_PARTITION variable = s type = complete
#pragma HLS ARRAY_PARTITION variable = m type = complete
#pragma HLS ARRAY_PARTITION variable = prefix type = complete
      read_group(LevelTag<L>(), item.node, s, m);
      uint64_t acc = 0;
      uint32_t j = 0;
      for (int c = 0; c < K; ++c) {
#pragma HLS UNROLL
        acc += s[c];
        prefix[c] = acc;
        j += prefix[c] <= item.mass ? 1 : 0;
      }
      // j == K only if the tree were inconsistent (mass >= the group's sum); stay in
      // range rather than read past the group.
      if (j > K - 1) j = K - 1;
      const uint64_t before = j ? prefix[j - 1] : 0;
      const uint32_t child = item.node * K + j;
      item.mass = L == 0 ? s[j] : item.mass - before;  // out of level 0: the leaf value
      item.node = child;
    }
    out.write(item);
  }
  static bool write_result_step(hls::stream<PathItem>& in, hls::stream<AxisWord>& out) {
#pragma HLS INLINE
    const PathItem item = in.read();
    const uint64_t word = item.valid ? (uint64_t(item.node) << 32) | uint32_t(item.mass) : kNoLeafWord;
    out.write(make_word(word, false));
    return !item.valid;
  }

#ifdef RMM_LOOP_DATAFLOW
  // The dataflow region as synthesised: one pipelined loop per stage.
  static void read_draws(hls::stream<AxisWord>& in, hls::stream<uint64_t>& draws, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
      read_draw_step(in, draws);
    }
  }
  static void scale(hls::stream<uint64_t>& draws, hls::stream<PathItem>& out, uint32_t n, bool sample,
                    uint64_t total) {
    for (uint32_t i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
      scale_step(draws, out, sample, total);
    }
  }
  template <int L>
  void level(hls::stream<PathItem>& in, hls::stream<PathItem>& out, uint32_t n, int depth) {
    for (uint32_t i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
      level_step<L>(in, out, depth);
    }
  }
  static void write_results(hls::stream<PathItem>& in, hls::stream<AxisWord>& out, uint32_t n, bool& error) {
    bool any = false;
    for (uint32_t i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = 4096
      any |= write_result_step(in, out);
    }
    error = any;
  }
  void level_chain(LevelTag<-1>, hls::stream<PathItem>*, uint32_t, int) {}
  template <int L>
  void level_chain(LevelTag<L>, hls::stream<PathItem>* path, uint32_t n, int depth) {
#pragma HLS INLINE
    level<L>(path[L + 1], path[L], n, depth);
    level_chain(LevelTag<L - 1>(), path, n, depth);
  }
  void dataflow(hls::stream<AxisWord>& in, hls::stream<AxisWord>& out, uint32_t n, bool sample,
                uint64_t total, int depth, bool& error) {
#pragma HLS DATAFLOW
    hls::stream<uint64_t> draws;
    hls::stream<PathItem> path[MAX_DEPTH + 1];
#pragma HLS STREAM variable = draws depth = RMM_FIFO_DEPTH
#pragma HLS STREAM variable = path depth = RMM_FIFO_DEPTH
    read_draws(in, draws, n);
    scale(draws, path[MAX_DEPTH], n, sample, total);
    level_chain(LevelTag<MAX_DEPTH - 1>(), path, n, depth);
    write_results(path[0], out, n, error);
  }
#endif

  bool descend(hls::stream<AxisWord>& in, hls::stream<AxisWord>& out, uint32_t n, bool sample) {
    bool error = false;
#ifdef RMM_LOOP_DATAFLOW
    dataflow(in, out, n, sample, total_, depth_, error);
    RMM_COUNT(count_sequential_dataflow(n);)
#else
    stepped_dataflow(in, out, n, sample, error);
#endif
    return error;
  }

#ifndef __SYNTHESIS__
  static constexpr int pipeline_latency() {
    return Lat::kReadDraw + Lat::kScale + MAX_DEPTH * Lat::kLevel + Lat::kWriteResult;
  }
  // Counters for the loop form (every stage fires n times; FIFOs were sized n by the
  // sequential run, so their occupancy is not recorded here).
  void count_sequential_dataflow(uint32_t n) {
    stats_.read_draws += n;
    stats_.scale += n;
    for (int l = 0; l < MAX_DEPTH; ++l) stats_.level[l] += n;
    stats_.write_results += n;
    stats_.words_in += n;
    stats_.words_out += n;
    if (n) cycles_ += n + pipeline_latency() - 1;
  }
#endif

#ifndef RMM_LOOP_DATAFLOW
  // The dataflow region cycle by cycle: in each cycle every stage fires once if its
  // input FIFO holds an item; stages are visited from the result end back to the
  // command end, so an item written in a cycle is read in the next one at the
  // earliest (one FIFO hop per cycle). Items still in flight inside a stage's pipeline
  // are not in a FIFO; their extra latency is added to the cycle count at the end.
  void stepped_dataflow(hls::stream<AxisWord>& in, hls::stream<AxisWord>& out, uint32_t n, bool sample,
                        bool& error) {
    hls::stream<uint64_t> draws;
    hls::stream<PathItem> path[MAX_DEPTH + 1];
    const uint64_t total = total_;
    const int depth = depth_;
    uint32_t read = 0, written = 0;
    uint64_t steps = 0;
    bool any = false;
    while (written < n) {
      ++steps;
      if (!path[0].empty()) {
        any |= write_result_step(path[0], out);
        ++written;
        ++stats_.write_results;
        ++stats_.words_out;
      }
      step_levels(LevelTag<0>(), path, depth);
      if (!draws.empty()) {
        scale_step(draws, path[MAX_DEPTH], sample, total);
        ++stats_.scale;
        note_occupancy(stats_.fifo_max_path[MAX_DEPTH], path[MAX_DEPTH].size());
      }
      if (read < n) {
        read_draw_step(in, draws);
        ++read;
        ++stats_.read_draws;
        ++stats_.words_in;
        note_occupancy(stats_.fifo_max_draw, draws.size());
      }
    }
    error = any;
    if (n) cycles_ += steps + (pipeline_latency() - (MAX_DEPTH + 3));
  }
  void step_levels(LevelTag<MAX_DEPTH>, hls::stream<PathItem>*, int) {}
  template <int L>
  void step_levels(LevelTag<L>, hls::stream<PathItem>* path, int depth) {
    if (!path[L + 1].empty()) {
      level_step<L>(path[L + 1], path[L], depth);
      ++stats_.level[L];
      note_occupancy(stats_.fifo_max_path[L], path[L].size());
    }
    step_levels(LevelTag<L + 1>(), path, depth);
  }
#endif

  Mem mem_;
  uint32_t capacity_;
  int depth_;
  uint32_t rows_[MAX_DEPTH];  // groups of K slots allocated per level (0 above the top)
  uint64_t total_;
  uint32_t min_;
  uint32_t max_;
  uint32_t init_max_;
  bool sticky_error_;
  uint32_t error_count_;
#ifndef __SYNTHESIS__
  Counters<MAX_DEPTH> stats_;
  uint64_t cycles_ = 0;  // estimate for the command being processed
#endif
};

}  // namespace rmm

#endif  // HETERO_REPLAY_HLS_RMM_CORE_HPP
