"""Rows rewritten in place (``write_rows``) in a storage that keeps compressed fields in a record log.

A rewrite appends the rows' new records with their stamps unchanged. Eviction must follow the new
records: the old ones being overwritten must not evict the row, and the new ones being overwritten must.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES, Evictions

SCHEMA = {"obs": ((2, 32, 32), "uint8"), "action": ((), "int64"), "next_obs": ((2, 32, 32), "uint8")}
CAP = 8


def image(row_id: int) -> np.ndarray:
    """An incompressible stack (every record the same size), a function of the row's id."""
    return np.random.default_rng(row_id).integers(0, 256, SCHEMA["obs"][0], np.uint8)


def rows(ids: np.ndarray) -> dict[str, np.ndarray]:
    """Rows told apart by ``action``: the row's id."""
    obs = np.stack([image(int(i)) for i in ids])
    return {"obs": obs, "action": ids, "next_obs": obs[:, ::-1].copy()}


def make(kind: str, tmp_path, budget: int) -> PrioritizedReplay:
    options = {"codec": "lz4", "byte_budget": budget}
    options.update({"dir": str(tmp_path)} if kind == "shared" else {"path": str(tmp_path / "buf")})
    return PrioritizedReplay(CAP, SCHEMA, storage=kind, storage_options=options, seed=0)


@pytest.mark.parametrize("kind", ["shared", "disk"])
def test_rows_rewritten_in_place_are_evicted_by_their_new_records_only(kind, tmp_path):
    per_row = 2 * (2 * 32 * 32 + 36 + RECORD_HEADER_BYTES)  # two incompressible records and their headers
    buf = make(kind, tmp_path, budget=int(10.5 * per_row))  # the log holds 10 rows' records
    assert buf.storage.bytes_per_row == 0
    buf.add(rows(np.arange(CAP)))  # slots 0-7: records at rows 0-7 of the log
    buf.sample(4)
    assert buf.storage.bytes_per_row == per_row  # the arithmetic above is the log's

    written = {slot: slot for slot in range(CAP)}  # slot -> id of the row it holds

    def rewrite(first: int, ids: np.ndarray) -> None:
        new = rows(ids)
        buf.write_rows(first, {"obs": new["obs"], "next_obs": new["next_obs"], "action": ids})
        written.update({first + k: int(i) for k, i in enumerate(ids)})

    # Slots 0-3 rewritten (log rows 8-11): the head is 1.5 rows past the old records of slots 0 and 1,
    # which are stale; no row has lost its current records.
    rewrite(0, np.arange(100, 104))
    # Slots 4-7 rewritten (log rows 12-15): still every row's current records are held.
    rewrite(4, np.arange(104, 108))
    buf.sample(4)  # the owner's poll: its eviction pass
    assert buf.storage.evicted_rows == 0
    assert (buf.leaves() > 0).all()
    held = buf.storage.gather(np.arange(CAP))
    assert held["action"].tolist() == [written[s] for s in range(CAP)]
    for name, values in rows(held["action"]).items():
        np.testing.assert_array_equal(held[name], values, err_msg=name)

    # Slots 4-7 rewritten again (log rows 16-19): now the records of slots 0 and 1 (log rows 8, 9) are gone.
    rewrite(4, np.arange(200, 204))
    for _ in range(20):
        s = buf.sample(16)
        assert not np.isin(s.indices, [0, 1]).any()
        assert s.data["action"].tolist() == [written[int(i)] for i in s.indices]
        np.testing.assert_array_equal(s.data["next_obs"], rows(s.data["action"])["next_obs"])
    assert buf.storage.evicted_rows == 2
    np.testing.assert_array_equal(np.flatnonzero(buf.leaves() == 0), [0, 1])
    buf.close()


def test_a_row_whose_slot_a_writer_reserved_again_is_replaced_not_evicted() -> None:
    """The eviction count's rule, shared by the shared and the disk storages (a ring of 4 slots)."""
    evictions = Evictions(4)
    stamps = np.array([1, 2, 3, 4])  # tickets 0-3 committed
    evictions.count(np.array([0, 1]), stamps[:2], tickets=5)  # ticket 4 reserved: slot 0's row is being replaced
    assert evictions.rows == 1
    evictions.count(np.array([1, 2]), stamps[1:3], tickets=5)  # slot 1's row counted once
    assert evictions.rows == 2
