#!/usr/bin/env bash
# Configures, builds and runs the C++ unit tests in three flavours, each in its
# own build directory: build/cpp-plain (-O3, as the extension is built),
# build/cpp-asan (AddressSanitizer + UndefinedBehaviorSanitizer) and
# build/cpp-tsan (ThreadSanitizer). No Python needed.
#   csrc/tests/run.sh                 all three
#   csrc/tests/run.sh plain tsan      some of them
# Environment: JOBS (build parallelism, default 2), CMAKE / CTEST (the tools;
# default: the ones on PATH, else .venv/bin's).
set -euo pipefail
cd "$(dirname "$0")/../.."

find_tool() {
  if [ -n "${!1:-}" ]; then echo "${!1}"
  elif command -v "$2" >/dev/null 2>&1; then command -v "$2"
  elif [ -x ".venv/bin/$2" ]; then echo "$PWD/.venv/bin/$2"
  else echo "run.sh: $2 not found (pip install cmake)" >&2; exit 1
  fi
}
CMAKE=$(find_tool CMAKE cmake)
CTEST=$(find_tool CTEST ctest)
JOBS=${JOBS:-2}

flavours=("$@")
[ ${#flavours[@]} -gt 0 ] || flavours=(plain asan tsan)

for flavour in "${flavours[@]}"; do
  case "$flavour" in
    plain) sanitize="" ;;
    asan) sanitize="address,undefined" ;;
    tsan) sanitize="thread" ;;
    *) echo "run.sh: unknown flavour '$flavour' (plain, asan, tsan)" >&2; exit 2 ;;
  esac
  dir="build/cpp-$flavour"
  echo "== C++ tests: $flavour (${sanitize:-no sanitizer}) in $dir"
  "$CMAKE" -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DHETERO_REPLAY_EXTENSION=OFF \
    -DHETERO_REPLAY_CPP_TESTS=ON -DHETERO_REPLAY_SANITIZE="$sanitize" >/dev/null
  "$CMAKE" --build "$dir" -j "$JOBS"
  (cd "$dir" && "$CTEST" --output-on-failure)
done
