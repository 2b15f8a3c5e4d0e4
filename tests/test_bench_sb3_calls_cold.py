"""benchmarks/bench_sb3_calls_cold.py: it times every buffer call of both buffers, cold and back to back (not how fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_sb3_calls_cold")


def test_main_prints_each_buffers_calls(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--repeats", "1", "--calls", "3", "--learn", "1100"])
    rows = [
        line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "µ" not in line
    ]
    calls = {(row[0].strip("| "), row[1]) for row in rows[1:]}  # after the header (the rule starts "|-")
    assert calls == {
        ("SB3 (DQN)", "add"), ("SB3 (DQN)", "sample"),
        ("ours (PERDQN)", "add"), ("ours (PERDQN)", "sample"), ("ours (PERDQN)", "update_priorities"),
    }  # fmt: skip
    for row in rows[1:]:
        assert float(row[2]) > 0 and float(row[3].strip(" |")) > 0
