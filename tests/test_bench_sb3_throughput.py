"""benchmarks/bench_sb3_throughput.py: its per-phase CPU split adds up and names the buffer's calls (not how fast)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_sb3_throughput")


def test_phases_split_the_run_and_time_the_buffers_calls() -> None:
    phases: Counter[str] = Counter()
    rate = bench.run("cartpole", "per-k0", steps=1_100, seed=0, phases=phases)

    assert rate > 0
    # learn() is collecting plus training (SB3's few other lines between them take little)
    assert phases["collect_rollouts"] + phases["train"] <= phases["total"] * 1.0001
    assert phases["collect_rollouts"] + phases["train"] > 0.8 * phases["total"]
    # the buffer's calls and the policy's are inside those phases, and all were timed
    assert 0 < phases["add"] + phases["predict"] < phases["collect_rollouts"]
    assert 0 < phases["sample"] + phases["update_priorities"] < phases["train"]
    assert phases["sample"] > 0 and phases["update_priorities"] > 0


def test_main_prints_the_phase_table(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--case", "cartpole", "--steps", "1100", "--repeats", "1", "--staleness", "0", "--phases"])
    out = capsys.readouterr().out
    assert "| PERDQN(staleness=0) |" in out and "| DQN |" in out
    header = next(line for line in out.splitlines() if line.startswith("| variant | total"))
    assert header.split(" | ")[1:4] == ["total", "collect_rollouts", "predict"]
