// HLS top of the Replay Management Module (declaration and register map: rmm_top.hpp).
#include "rmm_top.hpp"

#ifndef __SYNTHESIS__
static const rmm::TopCore* g_core_view = 0;
const rmm::TopCore* rmm_top_core() { return g_core_view; }
#endif

void rmm_top(hls::stream<rmm::AxisWord>& cmd, hls::stream<rmm::AxisWord>& res, uint32_t capacity,
             uint32_t init_max, uint32_t* fanout, uint32_t* max_leaves, rmm::Reg128* summary,
             uint32_t* frac_bits, uint32_t* depth, uint32_t* errors) {
#pragma HLS INTERFACE mode = axis port = cmd
#pragma HLS INTERFACE mode = axis port = res
#pragma HLS INTERFACE mode = s_axilite port = capacity offset = 0x10 bundle = control
#pragma HLS INTERFACE mode = s_axilite port = fanout offset = 0x18 bundle = control
#pragma HLS INTERFACE mode = ap_none port = fanout
#pragma HLS INTERFACE mode = s_axilite port = max_leaves offset = 0x20 bundle = control
#pragma HLS INTERFACE mode = ap_none port = max_leaves
#pragma HLS INTERFACE mode = s_axilite port = summary offset = 0x28 bundle = control
#pragma HLS INTERFACE mode = ap_none port = summary
#pragma HLS INTERFACE mode = s_axilite port = init_max offset = 0x40 bundle = control
#pragma HLS INTERFACE mode = s_axilite port = frac_bits offset = 0x48 bundle = control
#pragma HLS INTERFACE mode = ap_none port = frac_bits
#pragma HLS INTERFACE mode = s_axilite port = depth offset = 0x50 bundle = control
#pragma HLS INTERFACE mode = ap_none port = depth
#pragma HLS INTERFACE mode = s_axilite port = errors offset = 0x58 bundle = control
#pragma HLS INTERFACE mode = ap_vld port = errors
#pragma HLS INTERFACE mode = ap_ctrl_none port = return

  static rmm::TopCore core;
  static uint32_t error_count = 0;
#ifndef __SYNTHESIS__
  g_core_view = &core;
#endif

  // Registers are sampled once per command: a CAPACITY change re-sizes and CLEARs
  // before the command runs; INIT_MAX takes effect at the next CLEAR.
  core.configure(capacity);
  core.set_init_max(init_max);
  const bool error = core.process(cmd, res);

  *fanout = RMM_FANOUT;
  *max_leaves = RMM_MAX_LEAVES;
  *summary = rmm::make_reg128(core.total(), (uint64_t(core.max_leaf()) << 32) | core.min_leaf());
  *frac_bits = rmm::kFracBits;
  *depth = uint32_t(core.depth());
  if (error) {
    // Written only on an error, so the ap_vld bit at 0x5C latches "an error since the
    // last read" (the AXI-Lite adapter clears it when the host reads it).
    ++error_count;
    *errors = error_count;
  }
}
