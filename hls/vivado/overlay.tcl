# PYNQ overlay for the Replay Management Module: a Vivado block design with the Zynq
# UltraScale+ PS, one AXI DMA in simple (register) mode and the RMM, written out as
# rmm.bit + rmm.hwh (the pair pynq.Overlay loads; hetero_replay.fpga.board drives it).
# UNTESTED HERE: Vivado is not installable on the machines this repository is
# developed on (see hls/README.md).
#
#   DDR --HP0--> AXI DMA MM2S --AXIS cmd--> rmm_0 --AXIS res--> AXI DMA S2MM --HP0--> DDR
#   PS M_AXI_HPM0_FPD --AXI-Lite--> axi_dma_0/S_AXI_LITE and rmm_0/s_axi_control
#
# Run from the repository root after the HLS export (hls/run_hls.tcl) for that part:
#   vivado -mode batch -source hls/vivado/overlay.tcl -tclargs kv260     (xck26-sfvc784-2LV-c)
#   vivado -mode batch -source hls/vivado/overlay.tcl -tclargs zcu104    (xczu7ev-ffvc1156-2-e)
# Environment (optional): RMM_PL_CLK_MHZ (fabric clock, default 250: the HLS clock of
# 4 ns), RMM_VIVADO_JOBS (implementation jobs, default 4).
# Output: build/vivado/<board>/rmm.bit and rmm.hwh; copy both to the board and pass the
# .bit's path to BoardRmm (or HETERO_REPLAY_FPGA_BITFILE).

proc env_or {name default} {
  if {[info exists ::env($name)] && $::env($name) ne ""} { return $::env($name) }
  return $default
}

set board [expr {[llength $argv] > 0 ? [lindex $argv 0] : "kv260"}]
switch -- $board {
  kv260 {
    set part xck26-sfvc784-2LV-c
    set board_pattern "*kv260_som*"
  }
  zcu104 {
    set part xczu7ev-ffvc1156-2-e
    set board_pattern "*zcu104*"
  }
  default { error "overlay.tcl: unknown board '$board' (kv260 or zcu104)" }
}
set root [file normalize [file join [file dirname [info script]] .. ..]]
set pl_mhz [env_or RMM_PL_CLK_MHZ 250]
set jobs [env_or RMM_VIVADO_JOBS 4]
set ip_repo [file join $root build hls "rmm_$part" sol impl ip]
if {![file exists [file join $ip_repo component.xml]]} {
  error "overlay.tcl: no RMM IP at $ip_repo; export it first: RMM_PARTS=$part vitis_hls -f hls/run_hls.tcl"
}
set out [file join $root build vivado $board]
file mkdir $out

create_project -force rmm_overlay [file join $out project] -part $part
# The board's PS preset (DDR, MIO) when its board files are installed; PYNQ takes the
# fabric clock from the .hwh either way.
set board_part [lindex [lsort [get_board_parts -quiet $board_pattern]] end]
if {$board_part ne ""} {
  set_property board_part $board_part [current_project]
} else {
  puts "overlay.tcl: no board files matching $board_pattern; building for the bare part $part"
}
set_property ip_repo_paths [list $ip_repo] [current_project]
update_ip_catalog

create_bd_design rmm

# -- the PS: one AXI-Lite master (HPM0 FPD), one memory port for the DMA (HP0 FPD), PL clock 0
set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:zynq_ultra_ps_e zynq_ultra_ps_e_0]
if {$board_part ne ""} {
  apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e -config {apply_board_preset "1"} $ps
}
set_property -dict [list \
  CONFIG.PSU__USE__M_AXI_GP0 {1} \
  CONFIG.PSU__USE__M_AXI_GP1 {0} \
  CONFIG.PSU__USE__M_AXI_GP2 {0} \
  CONFIG.PSU__USE__S_AXI_GP2 {1} \
  CONFIG.PSU__FPGA_PL0_ENABLE {1} \
  CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ $pl_mhz \
] $ps

# -- the DMA: simple mode (no scatter-gather), 64-bit streams, transfers up to 2^26 - 1 bytes
set dma [create_bd_cell -type ip -vlnv xilinx.com:ip:axi_dma axi_dma_0]
set_property -dict [list \
  CONFIG.c_include_sg {0} \
  CONFIG.c_sg_length_width {26} \
  CONFIG.c_addr_width {64} \
  CONFIG.c_m_axi_mm2s_data_width {64} \
  CONFIG.c_m_axis_mm2s_tdata_width {64} \
  CONFIG.c_m_axi_s2mm_data_width {64} \
  CONFIG.c_s_axis_s2mm_tdata_width {64} \
  CONFIG.c_mm2s_burst_size {64} \
  CONFIG.c_s2mm_burst_size {64} \
] $dma

# -- the RMM (hls/src/rmm_top.cpp): AXIS cmd in, AXIS res out, AXI-Lite bundle "control"
set rmm [create_bd_cell -type ip -vlnv hetero-replay:hls:rmm:1.0 rmm_0]
connect_bd_intf_net [get_bd_intf_pins $dma/M_AXIS_MM2S] [get_bd_intf_pins $rmm/cmd]
connect_bd_intf_net [get_bd_intf_pins $rmm/res] [get_bd_intf_pins $dma/S_AXIS_S2MM]

# -- AXI-Lite from the PS to the DMA's and the RMM's registers (automation adds the
#    interconnect, the reset block and the clock: every PL block on pl_clk0)
set lite {Clk_master {Auto} Clk_slave {Auto} Clk_xbar {Auto} Master {/zynq_ultra_ps_e_0/M_AXI_HPM0_FPD} \
  intc_ip {New AXI Interconnect} master_apm {0}}
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [concat $lite [list Slave /axi_dma_0/S_AXI_LITE]] \
  [get_bd_intf_pins $dma/S_AXI_LITE]
apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [concat $lite [list Slave /rmm_0/s_axi_control]] \
  [get_bd_intf_pins $rmm/s_axi_control]

# -- the DMA's memory side into DDR through HP0
foreach port {M_AXI_MM2S M_AXI_S2MM} {
  apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config [list Clk_master {Auto} Clk_slave {Auto} \
    Clk_xbar {Auto} Master /axi_dma_0/$port Slave /zynq_ultra_ps_e_0/S_AXI_HP0_FPD intc_ip {Auto} \
    master_apm {0}] [get_bd_intf_pins zynq_ultra_ps_e_0/S_AXI_HP0_FPD]
}

# The RMM's clock and reset, should the automation have left them open.
foreach {pin net_source} {ap_clk zynq_ultra_ps_e_0/pl_clk0} {
  if {[llength [get_bd_nets -quiet -of_objects [get_bd_pins $rmm/$pin]]] == 0} {
    connect_bd_net [get_bd_pins $net_source] [get_bd_pins $rmm/$pin]
  }
}
if {[llength [get_bd_nets -quiet -of_objects [get_bd_pins $rmm/ap_rst_n]]] == 0} {
  set resets [get_bd_pins -quiet -filter {NAME == peripheral_aresetn} -of_objects [get_bd_cells -quiet rst_ps8_0_*]]
  if {[llength $resets] == 0} { error "overlay.tcl: no processor system reset block to drive rmm_0/ap_rst_n" }
  connect_bd_net [lindex $resets 0] [get_bd_pins $rmm/ap_rst_n]
}

assign_bd_address
validate_bd_design
save_bd_design

set bd_file [get_files rmm.bd]
generate_target all $bd_file
add_files -norecurse [make_wrapper -files $bd_file -top]
set_property top rmm_wrapper [current_fileset]
update_compile_order -fileset sources_1

launch_runs impl_1 -to_step write_bitstream -jobs $jobs
wait_on_run impl_1
if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} {
  error "overlay.tcl: implementation did not finish; see [file join $out project rmm_overlay.runs impl_1]"
}
open_run impl_1
set wns [get_property SLACK [get_timing_paths -max_paths 1 -setup]]
if {$wns < 0} {
  puts "overlay.tcl: WARNING: timing not met at $pl_mhz MHz (worst slack $wns ns); try RMM_PL_CLK_MHZ=200"
}

set bit [lindex [glob -nocomplain [file join $out project rmm_overlay.runs impl_1 *.bit]] 0]
set hwh [lindex [glob -nocomplain [file join $out project rmm_overlay.gen sources_1 bd rmm hw_handoff rmm.hwh] \
  [file join $out project rmm_overlay.srcs sources_1 bd rmm hw_handoff rmm.hwh]] 0]
if {$bit eq "" || $hwh eq ""} { error "overlay.tcl: bitstream or hardware handoff (.hwh) not found under $out" }
# PYNQ pairs the two by name: rmm.bit with rmm.hwh.
file copy -force $bit [file join $out rmm.bit]
file copy -force $hwh [file join $out rmm.hwh]
puts "overlay.tcl: wrote [file join $out rmm.bit] and [file join $out rmm.hwh] ($part, $pl_mhz MHz)"
