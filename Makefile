# One way to set up, run and test. Every target creates .venv on first use.
#   make demo    the main job: a short PER-vs-uniform comparison and the quick benchmark
#   make test    the test suite (what CI runs)
#   make bench   the full replay benchmark (long; writes benchmarks/results/)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-cpp format-check bench clean

# ~4 minutes on 2 cores: SB3 DQN on CartPole with the stock uniform buffer vs PERDQN (2 seeds),
# then the quick replay benchmark against cpprb, TorchRL, Tianshou and SB3.
demo: $(STAMP)
	$(BIN)/hetero-replay compare --lib sb3 --algo dqn --env CartPole-v1 --steps 15000 --seeds 2 --eval-every 1500
	$(BIN)/python benchmarks/bench_replay.py --quick

test: $(STAMP)
	$(BIN)/python -m pytest
	bash csrc/tests/run.sh

# The C++ unit tests alone: plain, ASan+UBSan and TSan builds in build/cpp-* (no Python needed).
test-cpp:
	bash csrc/tests/run.sh

# clang-format (pinned in the dev extra) must leave csrc/ unchanged.
format-check: $(STAMP)
	$(BIN)/clang-format --dry-run -Werror $$(find csrc -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_replay.py

# Reinstall when the build or the C++ changes; Python edits are live (editable install).
$(STAMP): pyproject.toml CMakeLists.txt $(wildcard csrc/*.cpp csrc/hetero_replay/*.hpp)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch first: a bare `torch` requirement pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	touch $@

clean:
	rm -rf $(VENV) build
