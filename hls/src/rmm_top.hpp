// The RMM's HLS top function: a free-running kernel (ap_ctrl_none) that reads one
// command from the AXI4-Stream `cmd`, writes its responses to `res` and publishes
// its registers on the AXI-Lite bundle "control". Every call handles one command;
// the state lives in a static core (hls/src/rmm_core.hpp) sized at compile time.
//   RMM_FANOUT       K, a power of two in [2, 64] (default 16)
//   RMM_MAX_LEAVES   on-chip capacity in leaves (default 2^18: 1 MiB of leaves)
#ifndef HETERO_REPLAY_HLS_RMM_TOP_HPP
#define HETERO_REPLAY_HLS_RMM_TOP_HPP

#include <stdint.h>

#include <hls_stream.h>

#include "axis_word.hpp"
#include "rmm_core.hpp"

#ifndef RMM_FANOUT
#define RMM_FANOUT 16
#endif
#ifndef RMM_MAX_LEAVES
#define RMM_MAX_LEAVES (1u << 18)
#endif

namespace rmm {
typedef StaticMemory<RMM_FANOUT, RMM_MAX_LEAVES> TopMemory;
typedef RmmCore<RMM_FANOUT, TopMemory::kMaxDepth, TopMemory> TopCore;
}  // namespace rmm

// Register ports (byte offsets in the AXI-Lite bundle; see hls/README.md, "Register
// map", for why four of them sit where they do):
//   capacity    0x10 rw  leaves in use, 1..RMM_MAX_LEAVES; a change CLEARs the tree
//   fanout      0x18 ro  K
//   max_leaves  0x20 ro  RMM_MAX_LEAVES
//   summary     0x28 ro  [31:0] total lo, [63:32] total hi, [95:64] min, [127:96] max
//   init_max    0x40 rw  value of the running max after CLEAR (default 1 << 22)
//   frac_bits   0x48 ro  22
//   depth       0x50 ro  tree levels in use
//   errors      0x58 ro  commands that set their error flag; 0x5C bit 0 (its ap_vld,
//                        clear-on-read) = an error since the last read of 0x5C
void rmm_top(hls::stream<rmm::AxisWord>& cmd, hls::stream<rmm::AxisWord>& res, uint32_t capacity,
             uint32_t init_max, uint32_t* fanout, uint32_t* max_leaves, rmm::Reg128* summary,
             uint32_t* frac_bits, uint32_t* depth, uint32_t* errors);

#ifndef __SYNTHESIS__
// C simulation only: the top's static core, for the test bench's counters.
const rmm::TopCore* rmm_top_core();
#endif

#endif  // HETERO_REPLAY_HLS_RMM_TOP_HPP
