"""The replay contract: every replay implements :class:`hetero_replay.Replay`, and behaves alike through it."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, RelaxedReplay, Replay, Sample, ShardedReplay, StalenessOptions

SCHEMA = {"obs": ((3,), "float32"), "reward": ((), "float32")}


def protocol_members() -> set[str]:
    """The names :class:`Replay` declares (methods, properties and attributes)."""
    names = {n for n, v in vars(Replay).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names | {"__len__"}


def rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n, dtype=np.float32)
    return {"obs": np.repeat(ids[:, None], 3, axis=1), "reward": ids}


@pytest.mark.parametrize("cls", [PrioritizedReplay, RelaxedReplay, ShardedReplay])
def test_every_replay_class_defines_the_whole_protocol(cls: type) -> None:
    defined = {name for name, _ in inspect.getmembers(cls)}
    missing = sorted(
        protocol_members() - defined - {"options", "schema", "rng", "capacity"}
    )  # may be instance attributes
    assert missing == [], f"{cls.__name__} lacks {missing}"


def local_replays() -> list[Replay]:
    return [
        PrioritizedReplay(64, SCHEMA, seed=3),
        RelaxedReplay(PrioritizedReplay(64, SCHEMA, seed=3), staleness=0),
        RelaxedReplay(PrioritizedReplay(64, SCHEMA, seed=3), StalenessOptions(2, prefetch=2, worker="thread")),
    ]


def test_local_replays_are_replays_and_agree_where_the_schedule_says() -> None:
    """Through the protocol alone: add, sample, update, leaves, flush, state; strict ones draw the same batches."""
    seen = []
    for replay in local_replays():
        try:
            assert isinstance(replay, Replay)
            replay.add(rows(40))
            assert (len(replay), replay.filled, replay.position, replay.capacity) == (40, 40, 40, 64)
            batch = replay.sample(8)
            assert isinstance(batch, Sample) and batch.data["obs"].shape == (8, 3)
            replay.update_priorities(batch.indices, np.full(8, 2.0))
            replay.flush()
            leaves = replay.leaves()
            assert leaves.shape == (64,) and leaves[40:].sum() == 0
            assert np.isclose(replay.max_priority, 2.0 + replay.eps)
            assert replay.dropped_updates == 0
            assert replay.state_dict()["size"] == 40
            seen.append(batch.indices.copy())
        finally:
            replay.close()
    np.testing.assert_array_equal(seen[0], seen[1])  # staleness 0 is strict PER: the same draws
    np.testing.assert_array_equal(seen[0], seen[2])  # the first batch sees no update under any schedule


def test_relaxed_replay_reads_the_wrapped_buffers_settings_through() -> None:
    inner = PrioritizedReplay(32, SCHEMA, alpha=0.7, seed=0)
    with RelaxedReplay(inner, StalenessOptions(1)) as relaxed:
        assert (relaxed.capacity, relaxed.schema, relaxed.options, relaxed.tree) == (
            inner.capacity,
            inner.schema,
            inner.options,
            inner.tree,
        )
        assert relaxed.alpha == 0.7 and relaxed.staleness == 1 and relaxed.prefetch == 1
        with pytest.raises(AttributeError):
            relaxed.capacity = 5  # type: ignore[misc]
