"""benchmarks/bench_distributed_scaling.py: what its byte probe counts and what its model fits (not how fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SCHEMA, make_batch

pytest.importorskip("ray")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_distributed_scaling")


def test_fit_recovers_per_step_per_round_and_per_call_costs_and_reports_held_out_points() -> None:
    def cost(s: int, m: int) -> float:
        return 300.0 + (100.0 + 250.0 * s) / m

    points = [(s, m, w, cost(s, m)) for s in (1, 2, 4, 8) for m in (4, 2 * s) for w in (1, 2)]
    model = bench.fit_learner_cpu(points, held_out={(8, 1), (8, 2)})

    assert model["a_us"] == pytest.approx(300.0)
    assert model["r_us"] == pytest.approx(100.0)
    assert model["c_us"] == pytest.approx(250.0)
    assert [p["held_out"] for p in model["points"]] == [s == 8 for s, *_ in points]
    assert all(abs(p["error"]) < 1e-9 for p in model["points"])


def test_batches_per_call_is_a_number_or_a_number_per_shard() -> None:
    assert [bench.per_call("4", s) for s in (1, 8)] == [4, 4]
    assert [bench.per_call("2S", s) for s in (1, 8)] == [2, 16]


def test_projection_is_bound_by_the_slower_of_learner_cpu_and_network() -> None:
    model = {"a_us": 300.0, "r_us": 100.0, "c_us": 250.0}
    cpu_bound = bench.project(model, "4", 100.0, [8])
    per_shard = bench.project(model, "2S", 100.0, [8, 64])
    net_bound = bench.project({"a_us": 0.0, "r_us": 0.0, "c_us": 0.0}, "4", 1e6, [8])

    assert cpu_bound[0]["sampled_per_s"] == pytest.approx(256 / ((300 + (100 + 250 * 8) / 4) * 1e-6))
    assert [p["batches_per_call"] for p in per_shard] == [16, 128]
    assert per_shard[1]["sampled_per_s"] > per_shard[0]["sampled_per_s"]  # the calls per step stay S/m = 1/2
    assert net_bound[0]["sampled_per_s"] == pytest.approx(256 / (256 * 1e6 * 8 / 25e9))


@pytest.mark.usefixtures("ray_local")
def test_byte_probe_counts_calls_and_replies_and_restores_the_replay() -> None:
    from hetero_replay.distributed import ShardedReplay

    replay = ShardedReplay(2, 512, SCHEMA, seed=0, staleness=2, batches_per_call=2)
    try:
        replay.add(make_batch(1024))
        shards, ray = replay._shards, replay._ray
        tds = [np.ones(256, np.float32)]

        got = bench.probe_bytes(replay, tds, steps=4)

        assert replay._shards is shards and replay._ray is ray
        # Each sampled transition's offset goes out (8 bytes) and its row comes back (at least its bytes).
        row = sum(np.dtype(dtype).itemsize * int(np.prod(shape)) for shape, dtype in SCHEMA.values())
        assert got["sent_bytes_per_transition"] > 8
        assert got["received_bytes_per_transition"] > row
        assert 0 < got["calls_per_step"] <= 2 * 2  # at most a draw and an update per shard and step
        assert len(replay.sample(256).indices) == 256  # the replay still samples after the probe
    finally:
        replay.close()
