"""benchmarks/bench_executor_rhythm.py: it measures strict and relaxed replay at each rhythm (not how fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_executor_rhythm")


def test_main_prints_a_row_per_rhythm_and_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--train-us", "200", "2000", "--repeats", "1", "--seconds", "0.05", "--evict-mb", "1"]) == 0
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    table = {(row[0], row[1]): row[2:] for row in rows[1:]}  # after the header
    assert set(table) == {(t, r) for t in ("200", "2000") for r in ("strict", "staleness 1")}
    for (_, replay), (learner, late, other) in table.items():
        assert float(learner) > 0 and late.endswith("%") and float(other) >= 0
        if replay == "strict":
            assert late == "0.0%"  # no executor: nothing is ever late
