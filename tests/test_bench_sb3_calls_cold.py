"""benchmarks/bench_sb3_calls_cold.py: it times every buffer call of both buffers, cold and back to back, and a
train() cycle of each buffer (not how fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_sb3_calls_cold")


def test_main_prints_each_buffers_calls(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--repeats", "1", "--calls", "3", "--learn", "1100"])
    out = capsys.readouterr().out
    single, cycles = out.split("train() cycle")
    rows = [line.split(" | ") for line in single.splitlines() if line.startswith("| ")]
    calls = {(row[0].strip("| "), row[1]) for row in rows[1:]}  # after the header (the rule starts "|-")
    assert calls == {
        ("SB3 (DQN)", "add"), ("SB3 (DQN)", "sample"),
        ("ours (PERDQN)", "add"), ("ours (PERDQN)", "sample"), ("ours (PERDQN)", "update_priorities"),
    }  # fmt: skip
    for row in rows[1:]:
        assert float(row[2]) > 0 and float(row[3].strip(" |")) > 0
    cycle_rows = {row[0].strip("| "): [float(x.strip(" |")) for x in row[1:]] for row in (
        line.split(" | ") for line in cycles.splitlines() if line.startswith("| ")) if row[1] != "cycle"}  # fmt: skip
    assert set(cycle_rows) == {"SB3 (DQN)", "ours (PERDQN)", "ours (PERDQN, staleness=1)"}
    for name, (total, adds, sample, update) in cycle_rows.items():
        assert total == pytest.approx(adds + sample + update, abs=0.2) and adds > 0 and sample > 0
        assert (update > 0) == (name != "SB3 (DQN)")
