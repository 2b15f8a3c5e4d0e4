// C-simulation test bench of the RMM: runs traces written by the Python reference
// (python -m hetero_replay.fpga.reference) through the HLS top function rmm_top and
// compares every response word bit for bit.
//
//   tb_rmm_k<K> TRACE...
//
// A trace file is little-endian uint64 words: magic "RMMTRACE" (0x45434152544d4d52),
// capacity, fanout, n_cmd_words, n_resp_words, the command words, the expected
// response words (from a fresh, CLEARed RMM). Each binary is built for one fanout
// (RMM_FANOUT: the top's state is static and its K a compile-time constant), so
// every trace given must have that fanout.
//
// Besides the words, the bench checks after every command: TLAST on exactly the
// last response word, the summary/depth/error registers against the trailer, and at
// the end that every SAMPLE/FIND stage fired once per draw and that no FIFO between
// the dataflow stages ever held more than the depth the design declares
// (RMM_FIFO_DEPTH; the C model of hls::stream is unbounded, so the core records the
// largest occupancy). It prints one JSON line of counters and exits non-zero on the
// first failure.
#include <stdint.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rmm_top.hpp"

namespace {

constexpr uint64_t kTraceMagic = 0x45434152544d4d52ull;

struct Trace {
  std::string path;
  uint64_t capacity = 0;
  uint64_t fanout = 0;
  std::vector<uint64_t> commands;
  std::vector<uint64_t> responses;
};

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "tb_rmm: FAIL: %s\n", message.c_str());
  std::exit(1);
}

std::string str(uint64_t v) { return std::to_string(v); }

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

Trace load(const std::string& path) {
  Trace t;
  t.path = path;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open trace " + path);
  std::vector<uint64_t> words;
  uint64_t buf[4096];
  size_t got;
  while ((got = std::fread(buf, sizeof(uint64_t), 4096, f)) > 0) words.insert(words.end(), buf, buf + got);
  std::fclose(f);
  // The file is little-endian; so is every host this bench runs on (x86-64, AArch64).
  if (words.size() < 5 || words[0] != kTraceMagic) fail(path + " is not an RMM trace (no magic word)");
  t.capacity = words[1];
  t.fanout = words[2];
  const uint64_t n_cmd = words[3], n_resp = words[4];
  if (words.size() != 5 + n_cmd + n_resp)
    fail(path + ": the header's word counts disagree with the file size (" + str(words.size()) + " words)");
  t.commands.assign(words.begin() + 5, words.begin() + 5 + n_cmd);
  t.responses.assign(words.begin() + 5 + n_cmd, words.end());
  return t;
}

struct Registers {
  uint32_t fanout = 0, max_leaves = 0, frac_bits = 0, depth = 0, errors = 0;
  rmm::Reg128 summary = rmm::make_reg128(0, 0);
};

struct Totals {
  uint64_t traces = 0, commands = 0, cmd_words = 0, resp_words = 0, errors_flagged = 0;
};

// One call of the top = one command. Returns the words it wrote.
std::vector<rmm::AxisWord> call_top(hls::stream<rmm::AxisWord>& cmd, uint32_t capacity, Registers& regs) {
  hls::stream<rmm::AxisWord> res;
  rmm_top(cmd, res, capacity, rmm::kInitMaxDefault, &regs.fanout, &regs.max_leaves, &regs.summary,
          &regs.frac_bits, &regs.depth, &regs.errors);
  std::vector<rmm::AxisWord> out;
  while (!res.empty()) out.push_back(res.read());
  return out;
}

// `regs` holds the values of the top's output registers across calls and traces, as
// the AXI-Lite adapter does.
void run_trace(const Trace& t, Totals& totals, Registers& regs) {
  if (t.fanout != RMM_FANOUT)
    fail(t.path + " has fanout " + str(t.fanout) +
         "; this binary is built for RMM_FANOUT=" + str(RMM_FANOUT));
  if (t.capacity < 1 || t.capacity > RMM_MAX_LEAVES)
    fail(t.path + " has capacity " + str(t.capacity) + ", outside 1..RMM_MAX_LEAVES=" + str(RMM_MAX_LEAVES));
  const uint32_t capacity = uint32_t(t.capacity);

  // A trace starts from a CLEARed RMM; the top's static state may hold the previous
  // trace's tree (same capacity: no automatic CLEAR), so CLEAR first.
  hls::stream<rmm::AxisWord> cmd;
  cmd.write(rmm::make_word(uint64_t(rmm::kOpClear) << 56, true));
  std::vector<rmm::AxisWord> cleared = call_top(cmd, capacity, regs);
  if (cleared.size() != 2 || rmm::word_data(cleared[0]) != 0 ||
      rmm::word_data(cleared[1]) != ((uint64_t(rmm::kNoMin) << 32) | rmm::kInitMaxDefault))
    fail(t.path + ": the CLEAR before the trace did not answer an empty tree");
  uint32_t errors_seen = regs.errors;

  for (size_t i = 0; i < t.commands.size(); ++i)
    cmd.write(rmm::make_word(t.commands[i], i + 1 == t.commands.size()));

  size_t pos = 0;  // next expected response word
  uint64_t command = 0;
  size_t cmd_word = 0;  // index of the current command's header in the trace
  while (!cmd.empty()) {
    const size_t before = cmd.size();
    const uint64_t header = t.commands[cmd_word];
    const std::vector<rmm::AxisWord> got = call_top(cmd, capacity, regs);
    const size_t consumed = before - cmd.size();
    const std::string where = t.path + ": command #" + str(command) + " (opcode " + str(header >> 56) +
                              ", count " + str(uint32_t(header)) + ", command word " + str(cmd_word) + ")";
    if (got.size() < 2)
      fail(where + ": " + str(got.size()) + " response words, expected at least the trailer");
    for (size_t w = 0; w < got.size(); ++w) {
      if (pos >= t.responses.size())
        fail(where + ": response word " + str(w) + " is beyond the expected responses");
      const uint64_t exp = t.responses[pos], val = rmm::word_data(got[w]);
      if (val != exp)
        fail(where + ": response word " + str(w) + " (trace response word " + str(pos) + "): expected " +
             hex(exp) + ", got " + hex(val));
      const bool last = got[w].last != 0;
      if (last != (w + 1 == got.size()))
        fail(where + ": TLAST " +
             (last ? "set before the trailer's second word" : "missing on the last word"));
      ++pos;
    }
    // The registers published after the command agree with its trailer.
    const uint64_t a = rmm::word_data(got[got.size() - 2]), b = rmm::word_data(got.back());
    const bool error = (a >> 63) != 0;
    const uint64_t summary_hi = rmm::reg128_hi(regs.summary);
    if (rmm::reg128_lo(regs.summary) != (a & ~rmm::kErrorBit) || uint32_t(summary_hi) != (b >> 32) ||
        uint32_t(summary_hi >> 32) != uint32_t(b))
      fail(where + ": the summary register disagrees with the trailer");
    if (regs.depth != uint32_t(rmm::tree_depth(capacity, RMM_FANOUT)) || regs.fanout != RMM_FANOUT ||
        regs.max_leaves != RMM_MAX_LEAVES || regs.frac_bits != uint32_t(rmm::kFracBits))
      fail(where + ": a constant register (depth, fanout, max_leaves, frac_bits) is wrong");
    if (error) ++errors_seen;
    if (regs.errors != errors_seen) fail(where + ": the error counter register did not follow the flag");
    totals.errors_flagged += error ? 1 : 0;
    cmd_word += consumed;
    ++command;
  }
  if (cmd_word != t.commands.size()) fail(t.path + ": the kernel read past the last command word");
  if (pos != t.responses.size())
    fail(t.path + ": " + str(t.responses.size() - pos) + " expected response words were never produced");
  ++totals.traces;
  totals.commands += command;
  totals.cmd_words += t.commands.size();
  totals.resp_words += t.responses.size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRACE...  (traces of fanout %d, capacity <= %u)\n", argv[0], RMM_FANOUT,
                 unsigned(RMM_MAX_LEAVES));
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  Totals totals;
  Registers regs;
  for (int i = 1; i < argc; ++i) {
    const Trace t = load(argv[i]);
    run_trace(t, totals, regs);
    std::fprintf(stderr, "tb_rmm: %s: %zu command words, %zu response words: all equal\n", argv[i],
                 t.commands.size(), t.responses.size());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

#ifdef __RTL_SIMULATION__
  // Vitis C/RTL co-simulation: the responses above came from the RTL; the counters
  // below belong to the C model, which this run does not execute.
  std::printf("{\"tb\": \"rmm\", \"mode\": \"rtl\", \"fanout\": %d, \"traces\": %" PRIu64
              ", \"tb_commands\": %" PRIu64 ", \"seconds\": %.3f}\n",
              RMM_FANOUT, totals.traces, totals.commands, seconds);
#else
  const rmm::TopCore* core = rmm_top_core();
  const auto items = core->counters().items();
  auto value = [&](const std::string& name) -> uint64_t {
    for (const auto& kv : items)
      if (kv.first == name) return kv.second;
    fail("no counter " + name);
  };

  // Every stage of the SAMPLE/FIND pipeline handles every draw exactly once.
  const uint64_t draws = value("fire:read_draws");
  std::vector<std::string> stages = {"fire:scale", "fire:write_results"};
  for (int l = 0; l < rmm::TopCore::kMaxDepth; ++l) stages.push_back("fire:level" + std::to_string(l));
  for (const auto& s : stages)
    if (value(s) != draws) fail(s + " fired " + str(value(s)) + " times, fire:read_draws " + str(draws));

#ifdef RMM_SEQUENTIAL_DATAFLOW
  const char* mode = "sequential";  // the loop form run one stage after another: no FIFO occupancy
#else
  const char* mode = "stepped";
  for (const auto& kv : items) {
    if (kv.first.compare(0, 9, "fifo_max:") != 0) continue;
    if (kv.second > uint64_t(rmm::kFifoDepth))
      fail(kv.first + " reached " + str(kv.second) + " items; the FIFO is declared with depth " +
           str(rmm::kFifoDepth) + " (RMM_FIFO_DEPTH)");
    if (draws > 0 && kv.second == 0)
      fail(kv.first + " never held an item although " + str(draws) + " draws ran");
  }
#endif

  std::printf("{\"tb\": \"rmm\", \"mode\": \"%s\", \"fanout\": %d, \"max_leaves\": %u, \"traces\": %" PRIu64
              ", \"tb_commands\": %" PRIu64 ", \"cmd_words\": %" PRIu64 ", \"resp_words\": %" PRIu64
              ", \"errors_flagged\": %" PRIu64 ", \"seconds\": %.3f",
              mode, RMM_FANOUT, unsigned(RMM_MAX_LEAVES), totals.traces, totals.commands, totals.cmd_words,
              totals.resp_words, totals.errors_flagged, seconds);
  for (const auto& kv : items) std::printf(", \"%s\": %" PRIu64, kv.first.c_str(), kv.second);
  std::printf("}\n");
#endif
  return 0;
}
