"""Smoke test of benchmarks/bench_compression_million.py and its stream of transitions (what, not how fast)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ale_py")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
atari_frames = pytest.importorskip("atari_frames")
bench = pytest.importorskip("bench_compression_million")


def test_streamed_transitions_are_plays_stacks_with_the_real_terminal_frames() -> None:
    chunks = list(atari_frames.transition_chunks("Pong", 1100, seed=3, chunk=400))
    assert [len(c["obs"]) for c in chunks] == [400, 400, 300]
    got = {name: np.concatenate([c[name] for c in chunks]) for name in atari_frames.SCHEMA}
    frames, starts = atari_frames.play("Pong", 1100, seed=3)
    stacks = atari_frames.stacks(frames, starts)
    assert np.array_equal(got["obs"], stacks[:-1])
    assert np.array_equal(got["done"].astype(bool), starts[1:]) and got["done"].any()
    going = got["done"] == 0
    assert np.array_equal(got["next_obs"][going], stacks[1:][going])
    ended = np.flatnonzero(~going)  # the stack shifted by the episode's own last frame, not the next one's first
    assert np.array_equal(got["next_obs"][ended, :3], got["obs"][ended, 1:])


def test_a_small_run_fills_the_buffer_checks_it_and_writes_its_results(tmp_path: Path) -> None:
    out = tmp_path / "million.json"
    results = bench.main(["--game", "Pong", "--rows", "1500", "--codec", "lz4", "--keep", "100", "--steps", "20",
                          "--out", str(out)])  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["rows"] == 1500 and results["codec"] == ["lz4", 1]
    assert results["checked"] == {"kept_rows": 100, "sampled_rows": 640, "bit_exact": True}
    assert 0 < results["distinct_frames"] <= 1500 + 4 * (results["episodes_ended"] + 1)  # ~one new frame a step
    assert 0 < results["records_bytes"] < results["pool_accounting_total"] < results["raw_bytes"] / 10
    assert {"start", "empty_buffer", "full", "after_learner_steps"} <= results["rss_mb"].keys()
    assert len(results["rss_mb"]["while_filling"]) == 2  # every tenth: after rows 1000 and 1500 (chunks of 1000)
    assert {"play", "add", "learner_steps"} <= results["seconds"].keys()  # where the time went, reported
