"""Smoke test of benchmarks/bench_tree_device.py on the CPU (what it measures, not how fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_tree_device")
from contenders import Workload  # noqa: E402


def test_every_cell_gets_a_sample_and_an_update_time_and_a_table(monkeypatch) -> None:
    # TorchRL's extension may need a compile here; the CPU run of our two backends suffices.
    ours = {label: build for label, build in bench.CONTENDERS.items() if label.startswith("ours/")}
    monkeypatch.setattr(bench, "CONTENDERS", ours)
    results = bench.run(torch.device("cpu"), [1000, 5000], [16, 64], 2, 0.001, Workload())
    assert not results["unavailable"]
    cells = {(r["capacity"], r["batch"], r["label"], r["op"]) for r in results["results"]}
    assert cells == {
        (n, b, label, op) for n in (1000, 5000) for b in (16, 64) for label in ours for op in ("sample", "update")
    }
    assert all(r["median_s"] > 0 and len(r["repeats_s"]) == 2 for r in results["results"])
    text = bench.markdown(results)
    assert "| 5,000 | 64 |" in text and "ours/cupy ÷ ours/torch" in text


def test_a_cuda_run_without_cuda_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit, match="no CUDA device"):
        bench.main(["--device", "cuda", "--quick"])
