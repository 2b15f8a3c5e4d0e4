# One way to set up, run and test. Every target creates .venv on first use.
#   make demo    the main job: a short PER-vs-uniform comparison and the quick benchmark
#   make test    the test suite: pytest, then the C++ unit tests (what CI runs, with make lint)
#   make bench   the full replay benchmark (long; writes benchmarks/results/)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-cpp lint typecheck bench clean

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

# Style and types: ruff (lint + format), mypy, clang-format (versions pinned in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/clang-format --dry-run -Werror $$(find csrc -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')

# mypy sees the installed layout: a symlink tree with adapters/ as hetero_replay/adapters.
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck
	cp -rs $(CURDIR)/hetero_replay build/typecheck/hetero_replay
	ln -s $(CURDIR)/adapters build/typecheck/hetero_replay/adapters
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p hetero_replay

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
