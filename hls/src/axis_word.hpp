// The RMM's interface types: one beat of its 64-bit AXI4-Stream ports (TDATA, TKEEP,
// TSTRB, TLAST) and the 128-bit AXI-Lite summary register.
//
// Under Vitis HLS (C simulation and synthesis alike) this is the tool's own
// ap_axiu<64, 0, 0, 0> from <ap_axi_sdata.h>: HLS maps only that type's
// `last`/`keep`/`strb` members onto the TLAST/TKEEP/TSTRB side channels (a struct of
// our own would be packed into TDATA, and the DMA would never see the end of a
// packet). That header does not ship with the arbitrary-precision headers fetched
// for the g++ builds (hls/fetch_ap_types.py), so those builds use the struct below
// with the same member names and widths; the RMM only touches `data` and `last`
// (through word_data / make_word) and sets `keep`/`strb` to all-ones.
#ifndef HETERO_REPLAY_HLS_AXIS_WORD_HPP
#define HETERO_REPLAY_HLS_AXIS_WORD_HPP

#include <stdint.h>

// RMM_VITIS: compiled by Vitis HLS (synthesis, or its C simulation, which has
// <ap_axi_sdata.h>), as opposed to the g++ builds of this repository.
#if defined(__SYNTHESIS__)
#define RMM_VITIS 1
#elif defined(__has_include)
#if __has_include(<ap_axi_sdata.h>)
#define RMM_VITIS 1
#endif
#endif

#ifdef RMM_VITIS
#include <ap_axi_sdata.h>
#include <ap_int.h>
#endif

namespace rmm {

#ifdef RMM_VITIS
typedef ap_axiu<64, 0, 0, 0> AxisWord;
inline uint64_t word_data(const AxisWord& w) { return w.data.to_uint64(); }
#else
// The members of ap_axiu<64, 0, 0, 0> that the AXI DMA looks at, in plain integers:
// g++ flags the C model of ap_uint (its constructors read the value before setting
// it) when inlined into our code.
struct AxisWord {
  uint64_t data;
  uint8_t keep;
  uint8_t strb;
  uint8_t last;
};

inline uint64_t word_data(const AxisWord& w) { return w.data; }
#endif

inline AxisWord make_word(uint64_t data, bool last) {
  AxisWord w;
  w.data = data;
  w.keep = 0xFF;  // every byte valid
  w.strb = 0xFF;
  w.last = last ? 1 : 0;
  return w;
}

// The summary register (total, min, max) is one 128-bit AXI-Lite port, so that its
// four 32-bit words are contiguous (see rmm_top.hpp). In the g++ builds it is a pair
// of uint64 for the same reason as AxisWord's plain members.
#ifdef RMM_VITIS
typedef ap_uint<128> Reg128;
inline Reg128 make_reg128(uint64_t lo, uint64_t hi) { return (Reg128(hi) << 64) | Reg128(lo); }
inline uint64_t reg128_lo(const Reg128& r) { return r.range(63, 0).to_uint64(); }
inline uint64_t reg128_hi(const Reg128& r) { return r.range(127, 64).to_uint64(); }
#else
struct Reg128 {
  uint64_t lo;
  uint64_t hi;
};
inline Reg128 make_reg128(uint64_t lo, uint64_t hi) {
  Reg128 r;
  r.lo = lo;
  r.hi = hi;
  return r;
}
inline uint64_t reg128_lo(const Reg128& r) { return r.lo; }
inline uint64_t reg128_hi(const Reg128& r) { return r.hi; }
#endif

}  // namespace rmm

#endif  // HETERO_REPLAY_HLS_AXIS_WORD_HPP
