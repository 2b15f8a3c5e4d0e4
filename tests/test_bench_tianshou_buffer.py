"""Smoke test of benchmarks/bench_tianshou_buffer.py (what it measures, not how fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tianshou")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_tianshou_buffer")


def test_every_contender_gets_every_op_it_has_and_a_table() -> None:
    results = bench.run([1, 3], size=300, repeats=2, min_time=0.001)
    cells = {(r["envs"], r["label"], r["op"]) for r in results["results"]}
    expected = {(envs, label, op) for envs in (1, 3) for label in bench.CONTENDERS for op in bench.OPS
                if not (label == "tianshou-uniform" and op == "update")}  # fmt: skip
    assert cells == expected
    assert all(r["median_s"] > 0 and len(r["repeats_s"]) == 2 for r in results["results"])
    text = bench.markdown(results)
    assert "## add" in text and "| 3 |" in text and "tianshou-per ÷ ours" in text


def test_end_to_end_runs_every_contender_in_turns_and_prints_each_repeats_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.end_to_end(steps=64, repeats=2, warmup=200, chunk=32) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert set(bench.E2E) <= set(rows)
    assert rows["tianshou-per"].split(" | ")[2:4] == ["1.00", "1.00, 1.00"]  # the baseline, against itself
    for label in bench.E2E:
        assert out.count(f" {label} ") >= 2  # a line per repeat
