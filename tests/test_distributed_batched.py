"""ShardedReplay with ``batches_per_call`` > 1: one call per shard draws several batches, each exact.

The law is tested as in ``test_distributed.py`` (chi-square against ``p_i / sum p`` over shards
whose masses differ 64x), and the schedule: batch ``j`` of a call starting at step ``t0`` sees the
updates of steps ``<= t0 - k - m`` (``k + m - 1 + j`` steps stale).
"""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")
scipy_stats = pytest.importorskip("scipy.stats")

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.distributed import ShardedReplay  # noqa: E402
from tests.test_distributed import PER_SHARD, SCHEMA, SHARDS, exact_law, rows, td_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_local")


def filled(seed: int, staleness: int, batches_per_call: int, stratified: bool = True) -> ShardedReplay:
    """4 shards of 64 rows (ids 64k.. on shard k), priorities td_of(id), every update applied."""
    replay = ShardedReplay(
        SHARDS, PER_SHARD, SCHEMA, alpha=1.0, eps=0.0, seed=seed, stratified=stratified, staleness=staleness,
        batches_per_call=batches_per_call,
    )  # fmt: skip
    replay.add(rows(np.arange(SHARDS * PER_SHARD)))
    ids = np.arange(SHARDS * PER_SHARD)
    batch = replay.sample(16 * SHARDS * PER_SHARD)  # equal priorities, stratified: every row is drawn
    assert set(batch.data["id"]) == set(ids)
    replay.update_priorities(batch.indices, td_of(batch.data["id"]))
    replay.flush()  # applies the held-back update (no durable_dir: nothing else to do)
    return replay


@pytest.mark.parametrize(("staleness", "per_call", "stratified"), [(2, 4, True), (1, 3, False)])
def test_every_batch_of_a_call_follows_the_global_law(staleness: int, per_call: int, stratified: bool) -> None:
    replay = filled(5, staleness, per_call, stratified)
    try:
        single = PrioritizedReplay(SHARDS * PER_SHARD, SCHEMA, alpha=1.0, eps=0.0, seed=0)
        single.add(rows(np.arange(SHARDS * PER_SHARD)))
        single.update_priorities(np.arange(SHARDS * PER_SHARD), td_of(np.arange(SHARDS * PER_SHARD)))
        counts = np.zeros((per_call, SHARDS * PER_SHARD))  # by the batch's place in its call
        for step in range(12 * per_call):
            batch = replay.sample(2000, beta=0.2 + 0.05 * (step % 3))
            np.add.at(counts[step % per_call], batch.data["id"], 1)
            assert (batch.indices["shard"] == batch.data["id"] // PER_SHARD).all()
            assert (batch.indices["slot"] == batch.data["id"] % PER_SHARD).all()
            # IS weights: the single-buffer formula, with the beta of the call that served the batch
            want = single.priorities.weights(batch.data["id"], 0.2 + 0.05 * (step % 3))
            np.testing.assert_allclose(batch.weights, want, rtol=1e-6)
        for place in range(per_call):  # the first batch of a call, the second, ...: each exact
            p = scipy_stats.chisquare(counts[place], exact_law() * counts[place].sum()).pvalue
            assert p > 1e-4, f"batch {place} of a call: chi-square p = {p}"
        # 1 + 12 calls' batches (the fill's call included), no redraw, nothing inexact
        assert replay.stats["batches"] == 1 + 12 * per_call
        assert replay.stats["redraws"] == replay.stats["inexact_batches"] == 0
    finally:
        replay.close()


@pytest.mark.parametrize(("staleness", "per_call"), [(1, 2), (1, 3), (2, 2), (2, 3)])
def test_a_call_of_m_batches_sees_the_updates_of_steps_up_to_t0_minus_k_minus_m(staleness: int, per_call: int) -> None:
    replay = ShardedReplay(
        SHARDS, PER_SHARD, SCHEMA, alpha=1.0, eps=0.0, seed=0, staleness=staleness, batches_per_call=per_call
    )
    try:
        replay.add(rows(np.arange(SHARDS * PER_SHARD)))
        dominated = []
        for step in range(14):
            batch = replay.sample(512)
            dominated.append(bool(np.mean(batch.data["id"] == 5) > 0.5))
            if step >= 1:  # from step 1 on, row 5 gets a priority that dominates the rest once applied
                replay.update_priorities(batch.indices, np.where(batch.data["id"] == 5, 1e4, 1.0))
        # The first call starting at t0 with 1 <= t0 - k - m, calls starting at multiples of m.
        first = next(t0 for t0 in range(0, 99, per_call) if 1 <= t0 - staleness - per_call)
        assert dominated.index(True) == first, dominated
        assert all(dominated[first:])
        assert replay.stats["redraws"] == 0
    finally:
        replay.close()


def test_a_seed_fixes_the_batches_of_every_call() -> None:
    a, b = filled(7, 2, 3), filled(7, 2, 3)
    try:
        for _ in range(5):
            x, y = a.sample(64), b.sample(64)
            np.testing.assert_array_equal(x.data["id"], y.data["id"])
            np.testing.assert_array_equal(x.weights, y.weights)
    finally:
        a.close()
        b.close()


def test_a_new_batch_size_drops_the_calls_other_batches_and_draws_anew() -> None:
    replay = filled(8, 1, 4)
    try:
        assert replay.sample(100).indices.shape == (100,)
        assert replay.sample(50).indices.shape == (50,)  # the call's 3 other batches of 100 are dropped
        assert replay.sample(50).indices.shape == (50,)
        assert replay.stats["batches"] == 1 + 3
    finally:
        replay.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(batches_per_call=0), ValueError, "batches_per_call"),
        (dict(batches_per_call=2.0, staleness=1), TypeError, "batches_per_call"),
        (dict(batches_per_call=2), ValueError, "staleness >= 1"),
    ],
)
def test_bad_batches_per_call_is_refused_before_ray_starts_a_shard(kwargs: dict, error: type, words: str) -> None:
    args = dict(num_shards=2, capacity_per_shard=8, schema=SCHEMA, name="refused-per-call") | kwargs
    with pytest.raises(error, match=words):
        ShardedReplay(**args)
    assert not ray.util.list_named_actors() or all("refused-per-call" not in n for n in ray.util.list_named_actors())


def test_a_refused_attach_leaves_the_running_replay_as_it_was() -> None:
    replay = filled(9, 1, 2)
    try:
        shards = replay._shards
        before = [ray.get(h.__ray_call__.remote(lambda shard: shard.replay.state_dict())) for h in shards]
        rng = str(replay.rng.bit_generator.state)
        refused = [(dict(batches_per_call=0, staleness=1), ValueError), (dict(batches_per_call=2), ValueError),
                   (dict(batches_per_call=2.0, staleness=1), TypeError)]  # fmt: skip
        for kwargs, error in refused:
            with pytest.raises(error, match="batches_per_call"):
                ShardedReplay.attach(replay.name, **kwargs)
        after = [ray.get(h.__ray_call__.remote(lambda shard: shard.replay.state_dict())) for h in shards]
        for a, b in zip(before, after):  # generator, priorities, position and size of every shard
            assert (a["rng_state"], a["position"], a["size"]) == (b["rng_state"], b["position"], b["size"])
            np.testing.assert_array_equal(a["priorities"], b["priorities"])
        assert str(replay.rng.bit_generator.state) == rng
        assert replay.sample(64).indices.shape == (64,)  # and it goes on
    finally:
        replay.close()
