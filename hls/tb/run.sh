#!/usr/bin/env bash
# The RMM's C-simulation test bench, end to end:
#   1. fetch the Xilinx arbitrary-precision headers into build/hls-tb/ap_types
#      (hls/fetch_ap_types.py; a failed download FAILS this script, it never skips);
#   2. configure and build hls/tb with cmake: tb_rmm_k{2,4,16,64} (the HLS top with that
#      fanout), tb_rmm_k16_seq (the dataflow region in its synthesised loop form) and a
#      C++14 compile of the HLS sources (Vitis HLS's dialect);
#   3. write random traces with the Python reference (hetero_replay.fpga.reference):
#      over 10^5 commands in all, across capacities that are not multiples of K,
#      multi-level trees, capacity 1 and K = 16;
#   4. run every trace through its bench, which compares each response word bit for
#      bit, asserts the FIFO depths and prints one JSON line of counters per binary.
# Environment: PYTHON (default .venv/bin/python), CMAKE (default: on PATH, else
# .venv/bin/cmake), JOBS (build parallelism, default 2), RMM_TB_OPS_SCALE (multiplies
# every trace's command count; default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-.venv/bin/python}
if [ -z "${CMAKE:-}" ]; then
  if command -v cmake >/dev/null 2>&1; then CMAKE=$(command -v cmake)
  elif [ -x .venv/bin/cmake ]; then CMAKE=$PWD/.venv/bin/cmake
  else echo "hls/tb/run.sh: cmake not found (pip install cmake)" >&2; exit 1
  fi
fi
JOBS=${JOBS:-2}
SCALE=${RMM_TB_OPS_SCALE:-1}
BUILD=build/hls-tb
TRACES=$BUILD/traces

if [ ! -x "$PYTHON" ] && ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "hls/tb/run.sh: no Python at $PYTHON (make .venv/.installed, or set PYTHON)" >&2
  exit 1
fi

echo "== RMM C-sim: fetching the arbitrary-precision headers into $BUILD/ap_types"
if ! "$PYTHON" hls/fetch_ap_types.py "$BUILD/ap_types"; then
  echo "hls/tb/run.sh: FAILED: the headers could not be fetched (message above); the C simulation did not run" >&2
  exit 1
fi

echo "== RMM C-sim: building in $BUILD"
"$CMAKE" -S hls/tb -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DAP_TYPES_DIR="$PWD/$BUILD/ap_types" >/dev/null
"$CMAKE" --build "$BUILD" -j "$JOBS"

# capacity fanout commands seed: capacities 1 (one leaf), K (one level), K+1, not
# multiples of K, and up to five levels (70000 at K=16).
CONFIGS=(
  "1 16 5000 11"
  "16 16 5000 12"
  "17 16 5000 13"
  "1000 16 25000 14"
  "5000 16 25000 15"
  "70000 16 10000 16"
  "37 2 10000 17"
  "1023 4 10000 18"
  "1 4 2000 19"
  "5000 64 8000 20"
)
mkdir -p "$TRACES"
echo "== RMM C-sim: writing traces with hetero_replay.fpga.reference"
declare -A BY_FANOUT=()
total_ops=0
for cfg in "${CONFIGS[@]}"; do
  read -r cap k ops seed <<<"$cfg"
  ops=$((ops * SCALE))
  out="$TRACES/c${cap}_k${k}_s${seed}.bin"
  "$PYTHON" -m hetero_replay.fpga.reference --out "$out" --ops "$ops" --capacity "$cap" --fanout "$k" --seed "$seed"
  BY_FANOUT[$k]="${BY_FANOUT[$k]:-} $out"
  total_ops=$((total_ops + ops))
done
# A short one for Vitis C/RTL co-simulation (hls/run_hls.tcl), which simulates every cycle.
"$PYTHON" -m hetero_replay.fpga.reference --out "$TRACES/cosim_k16.bin" --ops 200 --capacity 1000 --fanout 16 --seed 1
echo "== RMM C-sim: $total_ops random commands in ${#CONFIGS[@]} traces"

for k in $(printf '%s\n' "${!BY_FANOUT[@]}" | sort -n); do
  echo "== RMM C-sim: K=$k"
  # shellcheck disable=SC2086  # the trace list is space-separated on purpose
  "$BUILD/tb_rmm_k$k" ${BY_FANOUT[$k]}
done
echo "== RMM C-sim: K=16, the dataflow region's loop form run stage after stage"
# shellcheck disable=SC2086
"$BUILD/tb_rmm_k16_seq" ${BY_FANOUT[16]}
echo "== RMM C-sim: all traces bit-exact"
