// pybind11 module hetero_replay._rmm_emu: the FPGA Replay Management Module's HLS
// source (hls/src/rmm_core.hpp) compiled with g++, the way its C simulation runs.
// The words in and out are the ones a board's DMA carries, so a tree over this module
// computes what the hardware would, bit for bit; the C-simulation counters (stage
// firings, FIFO occupancies, an estimated cycle count) come along.
//
// The HLS core's levels are std::vector here (rmm::VectorMemory), sized for the
// capacity; every fanout the protocol allows has its own instantiation, because K is
// a compile-time parameter of the hardware.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "released_gil.hpp"
#include "rmm_core.hpp"

namespace py = pybind11;

namespace {

using WordArray = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

std::string hex(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

const char* opcode_name(uint32_t opcode) {
  switch (opcode) {
    case rmm::kOpUpdate: return "UPDATE";
    case rmm::kOpInsert: return "INSERT";
    case rmm::kOpSample: return "SAMPLE";
    case rmm::kOpGet: return "GET";
    case rmm::kOpFind: return "FIND";
    case rmm::kOpClear: return "CLEAR";
    default: return nullptr;
  }
}

// The fanout-independent face of one RMM.
class Engine {
 public:
  virtual ~Engine() = default;
  // Runs validated, back-to-back commands; `ends[i]` is one past command i's last word.
  virtual void run(const std::vector<uint64_t>& words, const std::vector<size_t>& ends,
                   std::vector<uint64_t>& out) = 0;
  virtual rmm::RegisterAccess read_register(uint32_t offset, uint32_t& value) = 0;
  virtual rmm::RegisterAccess write_register(uint32_t offset, uint32_t value) = 0;
  virtual std::vector<std::pair<std::string, uint64_t>> counters() const = 0;
  virtual void reset_counters() = 0;
  virtual uint32_t capacity() const = 0;
  virtual int depth() const = 0;
};

template <int K>
class EngineK final : public Engine {
  typedef rmm::VectorMemory<K> Mem;
  typedef rmm::RmmCore<K, Mem::kMaxDepth, Mem> Core;

 public:
  explicit EngineK(uint32_t capacity) { core_.configure(capacity); }

  void run(const std::vector<uint64_t>& words, const std::vector<size_t>& ends,
           std::vector<uint64_t>& out) override {
    // One command at a time through the AXI-Stream FIFOs, so they never hold more
    // than one command's words.
    size_t begin = 0;
    for (size_t end : ends) {
      for (size_t i = begin; i < end; ++i) in_.write(rmm::make_word(words[i], i + 1 == end));
      core_.process(in_, out_);
      while (!out_.empty()) out.push_back(rmm::word_data(out_.read()));
      begin = end;
    }
  }
  rmm::RegisterAccess read_register(uint32_t offset, uint32_t& value) override {
    return core_.read_register(offset, value);
  }
  rmm::RegisterAccess write_register(uint32_t offset, uint32_t value) override {
    return core_.write_register(offset, value);
  }
  std::vector<std::pair<std::string, uint64_t>> counters() const override { return core_.counters().items(); }
  void reset_counters() override { core_.reset_counters(); }
  uint32_t capacity() const override { return core_.capacity(); }
  int depth() const override { return core_.depth(); }

 private:
  Core core_;
  hls::stream<rmm::AxisWord> in_;
  hls::stream<rmm::AxisWord> out_;
};

std::unique_ptr<Engine> make_engine(int fanout, uint32_t capacity) {
  switch (fanout) {
    case 2: return std::unique_ptr<Engine>(new EngineK<2>(capacity));
    case 4: return std::unique_ptr<Engine>(new EngineK<4>(capacity));
    case 8: return std::unique_ptr<Engine>(new EngineK<8>(capacity));
    case 16: return std::unique_ptr<Engine>(new EngineK<16>(capacity));
    case 32: return std::unique_ptr<Engine>(new EngineK<32>(capacity));
    case 64: return std::unique_ptr<Engine>(new EngineK<64>(capacity));
    default:
      throw py::value_error("fanout must be one of (2, 4, 8, 16, 32, 64), got " + std::to_string(fanout));
  }
}

// Where each command ends; ValueError naming the first truncated one.
std::vector<size_t> frame(const std::vector<uint64_t>& words) {
  std::vector<size_t> ends;
  size_t pos = 0;
  while (pos < words.size()) {
    const uint32_t opcode = uint32_t(words[pos] >> 56);
    const uint32_t n = uint32_t(words[pos]);
    const uint64_t payload = rmm::payload_words(opcode, n);
    const uint64_t available = words.size() - pos - 1;
    if (payload > available) {
      const char* name = opcode_name(opcode);
      throw py::value_error("truncated command at word " + std::to_string(pos) + ": " +
                            (name ? std::string(name) : "opcode " + std::to_string(opcode)) + " with count " +
                            std::to_string(n) + " needs " + std::to_string(payload) +
                            " payload words, only " + std::to_string(available) + " follow; nothing was run");
    }
    pos += 1 + size_t(payload);
    ends.push_back(pos);
  }
  return ends;
}

// "NAME (0xOFF), ..." of every register, or "A (0x..) and B (0x..)" of the writable ones.
std::string registers(bool writable_only = false) {
  std::string out;
  for (const rmm::RegisterName& r : rmm::kRegisterNames) {
    if (writable_only && !r.writable) continue;
    if (!out.empty()) out += writable_only ? " and " : ", ";
    out += std::string(r.name) + " (" + hex(r.offset) + ")";
  }
  return writable_only ? out : "; the registers are " + out;
}

class PyRmm {
 public:
  PyRmm(int64_t capacity, int64_t fanout) : fanout_(int(fanout)) {
    if (fanout != 2 && fanout != 4 && fanout != 8 && fanout != 16 && fanout != 32 && fanout != 64)
      throw py::value_error("fanout must be one of (2, 4, 8, 16, 32, 64), got " + std::to_string(fanout));
    if (capacity < 1 || capacity > int64_t(rmm::kMaxCapacity))
      throw py::value_error("capacity must be in [1, 2**28], got " + std::to_string(capacity));
    engine_ = make_engine(fanout_, uint32_t(capacity));
  }

  uint32_t capacity() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return engine_->capacity();
  }
  int fanout() const { return fanout_; }
  int depth() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return engine_->depth();
  }

  py::array_t<uint64_t> run(const WordArray& commands) {
    // A private copy: the commands are framed, then executed, without the GIL; a
    // caller's thread that changed the array in between must not change the framing.
    std::vector<uint64_t> words(size_t(commands.size()));
    if (!words.empty()) std::memcpy(words.data(), commands.data(), words.size() * sizeof(uint64_t));
    std::vector<uint64_t> out;
    {
      hetero_replay::ReleasedGil release;
      const std::vector<size_t> ends = frame(words);  // throws before anything runs
      std::lock_guard<std::mutex> lock(mutex_);       // released before the GIL is taken back
      engine_->run(words, ends, out);
    }
    py::array_t<uint64_t> result(py::ssize_t(out.size()));
    if (!out.empty()) std::memcpy(result.mutable_data(), out.data(), out.size() * sizeof(uint64_t));
    return result;
  }

  uint32_t read_register(int64_t offset) {
    uint32_t value = 0;
    rmm::RegisterAccess access = rmm::kRegUnknown;
    if (offset >= 0 && offset <= 0xFFFF) {
      std::lock_guard<std::mutex> lock(mutex_);
      access = engine_->read_register(uint32_t(offset), value);
    }
    if (access != rmm::kRegOk)
      throw py::value_error("no register at offset " + hex(uint64_t(offset)) + registers());
    return value;
  }

  void write_register(int64_t offset, int64_t value) {
    if (value < 0 || value > int64_t(0xFFFFFFFFu))
      throw py::value_error("a register holds 32 bits, got " + std::to_string(value));
    rmm::RegisterAccess access = rmm::kRegUnknown;
    if (offset >= 0 && offset <= 0xFFFF) {
      std::lock_guard<std::mutex> lock(mutex_);
      access = engine_->write_register(uint32_t(offset), uint32_t(value));
    }
    switch (access) {
      case rmm::kRegOk: return;
      case rmm::kRegBadValue:
        throw py::value_error("capacity must be in [1, 2**28], got " + std::to_string(value));
      case rmm::kRegReadOnly:
        throw py::value_error("register " + hex(uint64_t(offset)) + " is not writable; " + registers(true) +
                              " are");
      default: throw py::value_error("no register at offset " + hex(uint64_t(offset)) + registers());
    }
  }

  py::dict counters() const {
    std::vector<std::pair<std::string, uint64_t>> items;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items = engine_->counters();
    }
    py::dict d;
    for (const auto& kv : items) d[py::str(kv.first)] = py::int_(kv.second);
    return d;
  }

  void reset_counters() {
    std::lock_guard<std::mutex> lock(mutex_);
    engine_->reset_counters();
  }

 private:
  int fanout_;
  std::unique_ptr<Engine> engine_;
  mutable std::mutex mutex_;  // one command stream or register access at a time
};

}  // namespace

PYBIND11_MODULE(_rmm_emu, m) {
  m.doc() =
      "The FPGA Replay Management Module's HLS source (hls/src/) compiled for the CPU: the same 64-bit "
      "command "
      "and response words as the hardware (protocol: hls/README.md), and its C-simulation counters.";
  m.attr("FRAC_BITS") = rmm::kFracBits;
  m.attr("MAX_LEAVES") = rmm::kMaxCapacity;
  m.attr("FIFO_DEPTH") = rmm::kFifoDepth;

  py::class_<PyRmm>(
      m, "Rmm", "An RMM of `capacity` leaves and `fanout` children per node, CLEARed (device 'fpga:emu').")
      .def(py::init<int64_t, int64_t>(), py::arg("capacity"), py::arg("fanout"),
           "ValueError for a capacity outside [1, 2**28] or a fanout not in (2, 4, 8, 16, 32, 64).")
      .def_property_readonly("capacity", &PyRmm::capacity, "Leaves in use (the CAPACITY register).")
      .def_property_readonly("fanout", &PyRmm::fanout, "Children per node K.")
      .def_property_readonly("depth", &PyRmm::depth,
                             "Tree levels at the current capacity (the DEPTH register).")
      .def("run", &PyRmm::run, py::arg("commands"),
           "Back-to-back command words (uint64) in, all response words out; the GIL is released meanwhile. "
           "ValueError, with nothing run, when the words end inside a command.")
      .def("read_register", &PyRmm::read_register, py::arg("offset"),
           "The 32-bit AXI-Lite register at byte `offset` (reading STATUS clears it).")
      .def("write_register", &PyRmm::write_register, py::arg("offset"), py::arg("value"),
           "Write CAPACITY (re-sizes; the tree is then CLEARed) or INIT_MAX (the max after the next CLEAR).")
      .def("counters", &PyRmm::counters,
           "C-simulation counters: 'fire:<stage>' firings, 'cycles' and 'cycles:<op>' estimates, "
           "'fifo_max:<fifo>' largest FIFO occupancies, and the command/word/error totals.")
      .def("reset_counters", &PyRmm::reset_counters, "Zero every counter.");
}
