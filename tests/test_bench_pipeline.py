"""benchmarks/bench_pipeline.py: one small cell end to end (what it reports, not how fast)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_pipeline")


def test_a_cell_reports_the_training_time_inside_the_loop(tmp_path: Path) -> None:
    argv = ["--capacities", "2000", "--batches", "16", "--hidden", "4x4", "--staleness", "1", "--repeats", "2",
            "--min-time", "0.01", "--out", str(tmp_path), "--name", "t"]  # fmt: skip
    assert bench.main(argv) == 0
    results = json.loads((tmp_path / "pipeline-t.json").read_text())
    [cell] = results["summary"]
    loops = {r["variant"]: r for r in results["results"] if "train_in_loop_s" in r}
    assert set(loops) == {"strict", "k=1"}  # the loops, not the parts timed alone
    assert cell["t_train_in_loop_s"] > 0  # (no timing compared: tests run on busy machines)
    assert math.isclose(cell["loop_bound_steps_per_s"], 1 / max(cell["t_replay_s"], cell["t_train_in_loop_s"]))
    assert math.isclose(cell["of_loop_bound"], cell["steps_per_s"]["k=1"] / cell["loop_bound_steps_per_s"])
    md = (tmp_path / "pipeline-t.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| B |"))
    assert "T_train in loop µs" in header and "k=1 % loop bound" in header
    assert (tmp_path / "pipeline-t.png").stat().st_size > 0
