# One way to set up, run and test. Every target creates .venv on first use.
#   make demo    the main job: a short PER-vs-uniform comparison and the quick benchmark
#   make test    the test suite: pytest, the C++ unit tests, the FPGA module's C-simulation test bench and
#                its board-driver tests (what CI runs, with make lint; ~15 min on a fresh clone on 2 cores)
#   make bench   the full replay benchmark (long; writes benchmarks/results/)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
FPGA_VENV  := .venv-fpga
FPGA_STAMP := $(FPGA_VENV)/.installed

.PHONY: demo test test-cpp test-fpga-board lint typecheck bench clean

# SB3 DQN on CartPole with the stock uniform buffer vs PERDQN (2 seeds), then the quick replay benchmark
# against cpprb, TorchRL, Tianshou and SB3: 5 min on a fresh clone on 2 cores, the first build of .venv
# included (README, "Set up and run": the pieces, and what a busy machine does to them).
demo: $(STAMP)
	$(BIN)/hetero-replay compare --lib sb3 --algo dqn --env CartPole-v1 --steps 15000 --seeds 2 --eval-every 1500
	$(BIN)/python benchmarks/bench_replay.py --quick

# pytest runs on TEST_WORKERS processes (pytest-xdist), each test file on one of them: most tests keep one core
# busy, and two workers took it from 19 to 11 min on 2 cores. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
	bash csrc/tests/run.sh
	bash hls/tb/run.sh
	$(MAKE) --no-print-directory test-fpga-board

# The C++ unit tests alone: plain, ASan+UBSan and TSan builds in build/cpp-* (no Python needed).
test-cpp:
	bash csrc/tests/run.sh

# The FPGA board driver's tests (tests/fpga_board): hetero_replay.fpga.board against a fake PYNQ board whose
# DMA and registers are served by the RMM emulation. They need pynq 4.0, which pins numpy<2, so they run in
# an environment of their own, .venv-fpga, never in .venv; it is built once (about 80 s on 2 cores, most of it the
# C++), and its package is an editable install built in build/fpga-env, so Python edits are live there too.
# The options keep pytest to that folder: its own conftest, not tests/conftest.py (which skips the folder).
test-fpga-board: $(FPGA_STAMP)
	$(FPGA_VENV)/bin/python -m pytest tests/fpga_board -c /dev/null --rootdir tests/fpga_board \
		--confcutdir tests/fpga_board -p no:cacheprovider -ra

# Style and types: ruff (lint + format), mypy, clang-format (versions pinned in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/clang-format --dry-run -Werror $$(find csrc hls -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')

# mypy sees the installed layout: a symlink tree with adapters/ and apps/ as hetero_replay/adapters and
# hetero_replay/apps.
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck
	cp -rs $(CURDIR)/hetero_replay build/typecheck/hetero_replay
	ln -s $(CURDIR)/adapters build/typecheck/hetero_replay/adapters
	ln -s $(CURDIR)/apps build/typecheck/hetero_replay/apps
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p hetero_replay

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_replay.py

# Reinstall when the build or the C++ changes; Python edits are live (editable install).
$(STAMP): pyproject.toml CMakeLists.txt $(wildcard csrc/*.cpp csrc/hetero_replay/*.hpp hls/src/*) hls/fetch_ap_types.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	# -Werror in dev and CI builds (a user's plain `pip install .` builds without it).
	$(BIN)/python -m pip install -q -C cmake.define.HETERO_REPLAY_WERROR=ON -e ".[dev,bench]"
	touch $@

# pynq pinned exactly (the fake board follows its 4.0 internals); pip's resolver keeps numpy<2 for it.
$(FPGA_STAMP): pyproject.toml CMakeLists.txt $(wildcard csrc/*.cpp csrc/hetero_replay/*.hpp hls/src/*) hls/fetch_ap_types.py
	test -x $(FPGA_VENV)/bin/python || $(PYTHON) -m venv $(FPGA_VENV)
	$(FPGA_VENV)/bin/python -m pip install -q --upgrade pip
	$(FPGA_VENV)/bin/python -m pip install -q "pynq==4.0.0" "numpy<2" "pytest>=8"
	$(FPGA_VENV)/bin/python -m pip install -q --config-settings=build-dir=build/fpga-env -e ".[fpga]" "numpy<2"
	$(FPGA_VENV)/bin/python -c "import numpy, pynq, hetero_replay._rmm_emu; assert numpy.__version__ < '2', numpy.__version__"
	touch $@

clean:
	rm -rf $(VENV) $(FPGA_VENV) build
