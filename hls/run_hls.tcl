# Vitis HLS flow of the Replay Management Module: C simulation, synthesis, C/RTL
# co-simulation and IP export, for every target part. UNTESTED HERE: Vitis is not
# installable on the machines this repository is developed on (see hls/README.md).
#
# Run from the repository root, after writing the traces the test bench reads:
#   bash hls/tb/run.sh                           # g++ C simulation; leaves traces in build/hls-tb/traces
#   vitis_hls -f hls/run_hls.tcl                 # Vitis HLS <= 2024.1
#   vitis-run --mode hls --tcl hls/run_hls.tcl   # Vitis 2024.2 and later
#
# Environment (all optional):
#   RMM_PARTS        parts to build for (default: "xck26-sfvc784-2LV-c xczu7ev-ffvc1156-2-e",
#                    the Kria KV260 and the ZCU104)
#   RMM_STEPS        any of csim csynth cosim export (default: all four, in that order)
#   RMM_FANOUT       K (default 16); the traces must have this fanout
#   RMM_MAX_LEAVES   on-chip capacity in leaves (default 262144 = 2^18)
#   RMM_CLOCK_NS     clock period in ns (default 4, i.e. 250 MHz)
#   RMM_CSIM_TRACES  traces for csim (default: build/hls-tb/traces/*_k<K>_*.bin)
#   RMM_COSIM_TRACE  one short trace for cosim, which simulates the RTL cycle by cycle
#                    (default: build/hls-tb/traces/cosim_k<K>.bin, written by
#                    `python -m hetero_replay.fpga.reference --out ... --ops 200 --capacity 1000 --fanout K`)
# Output: build/hls/rmm_<part>/ (the Vitis project) with the packaged IP in
# build/hls/rmm_<part>/sol/impl/ip (VLNV hetero-replay:hls:rmm:1.0; also zipped as
# sol/impl/export.zip), which hls/vivado/overlay.tcl adds to its IP repository.

proc env_or {name default} {
  if {[info exists ::env($name)] && $::env($name) ne ""} { return $::env($name) }
  return $default
}

set root [file normalize [file join [file dirname [info script]] ..]]
set parts [env_or RMM_PARTS "xck26-sfvc784-2LV-c xczu7ev-ffvc1156-2-e"]
set steps [env_or RMM_STEPS "csim csynth cosim export"]
set fanout [env_or RMM_FANOUT 16]
set max_leaves [env_or RMM_MAX_LEAVES 262144]
set clock_ns [env_or RMM_CLOCK_NS 4]
set trace_dir [file join $root build hls-tb traces]
set csim_traces [env_or RMM_CSIM_TRACES [lsort [glob -nocomplain [file join $trace_dir "*_k${fanout}_*.bin"]]]]
set cosim_trace [env_or RMM_COSIM_TRACE [file join $trace_dir "cosim_k${fanout}.bin"]]

foreach step $steps {
  if {[lsearch -exact {csim csynth cosim export} $step] < 0} {
    error "RMM_STEPS: unknown step '$step' (csim csynth cosim export)"
  }
}
if {[lsearch -exact $steps csim] >= 0 && [llength $csim_traces] == 0} {
  error "csim needs traces of fanout $fanout: run `bash hls/tb/run.sh` first, or set RMM_CSIM_TRACES"
}
if {[lsearch -exact $steps cosim] >= 0 && ![file exists $cosim_trace]} {
  error "cosim needs a short trace at $cosim_trace: python -m hetero_replay.fpga.reference --out $cosim_trace\
 --ops 200 --capacity 1000 --fanout $fanout --seed 1 (or set RMM_COSIM_TRACE)"
}

# The same sources and defines for synthesis and for the test bench. Vitis HLS parses
# C++14 by default; the sources are C++14 (hls/tb/CMakeLists.txt checks that with g++).
set src [file join $root hls src]
set cflags "-I$src -DRMM_FANOUT=$fanout -DRMM_MAX_LEAVES=${max_leaves}u"

foreach part $parts {
  puts "== RMM: part $part, K=$fanout, $max_leaves leaves, clock $clock_ns ns, steps: $steps"
  open_project -reset [file join $root build hls "rmm_$part"]
  set_top rmm_top
  add_files [file join $src rmm_top.cpp] -cflags $cflags
  add_files -tb [file join $root hls tb tb_rmm.cpp] -cflags $cflags
  open_solution -reset sol -flow_target vivado
  set_part $part
  create_clock -period $clock_ns -name default

  if {[lsearch -exact $steps csim] >= 0} {
    csim_design -argv [join $csim_traces " "]
  }
  if {[lsearch -exact $steps csynth] >= 0 || [lsearch -exact $steps cosim] >= 0 || [lsearch -exact $steps export] >= 0} {
    csynth_design
  }
  if {[lsearch -exact $steps cosim] >= 0} {
    # The bench compares every response word with the trace's and checks the registers;
    # its counter checks read the C model, so it skips them in the RTL run.
    cosim_design -argv $cosim_trace -rtl verilog -trace_level none
  }
  if {[lsearch -exact $steps export] >= 0} {
    export_design -format ip_catalog -rtl verilog -vendor hetero-replay -library hls -ipname rmm -version 1.0 \
      -display_name "Replay Management Module (K=$fanout, $max_leaves leaves)"
  }
  close_project
}
puts "== RMM: done ([join $parts {, }])"
