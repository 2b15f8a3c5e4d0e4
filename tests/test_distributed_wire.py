"""How a sharded replay's learner and shards talk: arrays as bytes, calls and replies as plain tuples.

Ray pickles NumPy arrays and named tuples (tens of µs of the learner's CPU each), and packs numbers
and bytes without pickling: these tests pin down that the learner's draw and update calls, and the
draw replies, carry only the latter, and that the byte strings carry exactly the arrays.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

from hetero_replay.distributed import ShardedReplay, wire
from hetero_replay.distributed.shard import ReplayShard, ShardConfig, ShardDraw, ShardSummary
from hetero_replay.options import PEROptions
from hetero_replay.storage import Schema

SCHEMA = Schema({"obs": ((2, 3), "uint8"), "id": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")})
PLAIN = (int, float, bool, bytes, type(None))


def is_plain(value: Any) -> bool:
    """Numbers, bools, bytes and None, in plain tuples: what Ray packs with msgpack, without pickle."""
    if type(value) is tuple:
        return all(is_plain(v) for v in value)
    return type(value) in PLAIN


def rows(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "obs": (ids[:, None, None] + np.arange(6).reshape(2, 3)).astype(np.uint8),
        "id": ids.astype(np.int64),
        "reward": ids.astype(np.float32) / 2,
        "done": ids % 3 == 0,
    }


def shard() -> ReplayShard:
    s = ReplayShard(0, ShardConfig(capacity=64, schema=SCHEMA.to_json(), options=asdict(PEROptions(alpha=1.0))))
    s.add(rows(np.arange(64)), 1.0)
    return s


def test_rows_travel_as_records_and_come_back_field_for_field() -> None:
    dtype = wire.row_dtype(SCHEMA)
    first, second = rows(np.arange(5)), rows(np.arange(5, 8))
    joined = wire.join([wire.rows_to_bytes(first, dtype), wire.rows_to_bytes(second, dtype)], dtype)
    for name in SCHEMA:
        np.testing.assert_array_equal(joined[name], np.concatenate([first[name], second[name]]))
    assert wire.join([wire.rows_to_bytes(rows(np.arange(0)), dtype)], dtype).shape == (0,)


def test_update_entries_go_to_their_shard_in_their_order() -> None:
    shards = np.array([2, 0, 2, 1, 0, 2])
    slots, epochs = np.array([5, 6, 5, 7, 8, 9]), np.arange(6) * 10
    incarnations, td = np.array([1, 2, 1, 3, 2, 4]), np.linspace(0.5, 3.0, 6)
    parts = wire.updates_by_shard(shards, slots, epochs, incarnations, td, num_shards=4)
    assert parts[3] == b""
    for k in range(4):
        got, mine = wire.read_updates(parts[k]), shards == k
        np.testing.assert_array_equal(got["slot"], slots[mine])  # (slot 5 twice on shard 2: the later one wins there)
        np.testing.assert_array_equal(got["epoch"], epochs[mine])
        np.testing.assert_array_equal(got["incarnation"], incarnations[mine])
        np.testing.assert_array_equal(got["td"], td[mine])


def test_a_draw_request_and_its_reply_are_plain_and_carry_the_drawn_rows() -> None:
    s = shard()
    offsets = np.array([0.5, 10.5, 63.5])  # equal priorities 1: slots 0, 10, 63
    request = (offsets.tobytes(), s.incarnation, s.version, s.replay.tree.total(), False)
    reply = s.draw(request)
    assert is_plain(request) and is_plain(reply)
    draw = ShardDraw.of(reply)
    assert isinstance(draw.summary, ShardSummary) and draw.current
    np.testing.assert_array_equal(np.frombuffer(draw.slots, np.int64), [0, 10, 63])
    np.testing.assert_array_equal(np.frombuffer(draw.priorities, np.float64), [1.0, 1.0, 1.0])
    got = wire.join([draw.rows], wire.row_dtype(SCHEMA))
    for name, column in rows(np.array([0, 10, 63])).items():
        np.testing.assert_array_equal(got[name], column)


def test_a_shard_drops_each_update_entry_of_another_incarnation_and_applies_the_rest() -> None:
    s = shard()
    epoch, other = s.replay.write_epoch, s.incarnation ^ 1
    entries = wire.updates_by_shard(
        np.zeros(3, np.int64), np.array([1, 2, 3]), np.full(3, epoch), np.array([s.incarnation, other, s.incarnation]),
        np.array([4.0, 5.0, 6.0]), num_shards=1,
    )[0]  # fmt: skip
    dropped, summary = s.update(entries, 1.0)
    assert dropped == 1
    np.testing.assert_allclose(s.replay.tree.get(np.array([1, 2, 3])), [4.0, 1.0, 6.0], rtol=1e-6)
    assert summary.total == pytest.approx(62 + 4.0 + 6.0)


Calls = list[tuple[str, tuple[Any, ...]]]


class _Recorded:
    """A shard's actor handle that records the arguments of every call (the calls still go to the shard)."""

    def __init__(self, handle: Any, calls: Calls) -> None:
        self.handle, self.calls = handle, calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.handle, name)

        class _Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                self.calls.append((name, args))
                return method.remote(*args)

        return _Method


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("staleness", [0, 2])
def test_the_learners_draw_and_update_calls_carry_only_numbers_and_bytes(staleness: int) -> None:
    replay = ShardedReplay(2, 64, SCHEMA, seed=0, staleness=staleness, batches_per_call=2 if staleness else 1)
    handles = replay._shards
    calls: Calls = []
    try:
        replay.add(rows(np.arange(128)))
        replay._shards = [_Recorded(h, calls) for h in handles]
        for _ in range(6):
            batch = replay.sample(16)
            replay.update_priorities(batch.indices, np.abs(batch.data["reward"]) + 0.5)
        replay.flush()
    finally:
        replay._shards = handles
        replay.close()
    hot = [(name, args) for name, args in calls if name in ("draw", "update")]
    assert {name for name, _ in hot} == {"draw", "update"}  # (staleness 2: the updates flush() sends)
    assert all(is_plain(args) for _, args in hot), [a for _, a in hot if not is_plain(a)][:1]
