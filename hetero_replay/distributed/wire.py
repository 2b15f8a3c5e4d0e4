"""How arrays travel between a sharded replay's learner and its shards: as the bytes of one contiguous array.

Ray serialises each argument of an actor call, and each reply, on its own.
Ints, floats, bools and ``bytes`` (and tuples of them) go through msgpack;
NumPy arrays, and tuples nesting them, go through pickle, at tens of
microseconds of the caller's CPU each. The learner makes one call per shard
every ``batches_per_call`` steps, and that CPU was most of its cost per call
(the profile in ``docs/distributed.md``). So every array of a draw or an
update crosses as one byte string:

- a draw's offsets: ``float64``, in the routed order of the call's batches;
- priority updates: records of :data:`UPDATE_DTYPE`, one per entry (each entry
  names its shard's incarnation, so one string carries a shard's entries of
  several steps);
- a draw's reply: slots (``int64``), priorities (``float64``) and the rows,
  records of :func:`row_dtype` one after another, so that the learner joins the
  shards' strings and puts every field back in routed order in one pass.

Each string costs one copy of its array on the sending side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hetero_replay.storage import Schema

#: One priority update entry as it travels to its shard: slot, write epoch at the draw, incarnation, TD error.
UPDATE_DTYPE = np.dtype([("slot", np.int64), ("epoch", np.int64), ("incarnation", np.int64), ("td", np.float64)])


def row_dtype(schema: Schema) -> np.dtype:
    """One transition of ``schema`` as a packed record: its fields in schema order."""
    return np.dtype([(name, f.dtype, f.shape) for name, f in schema.items()])


def rows_to_bytes(rows: Mapping[str, np.ndarray], dtype: np.dtype) -> bytes:
    """``rows`` (one array per field, equal lengths) as the bytes of records of ``dtype``."""
    records = np.empty(len(next(iter(rows.values()))) if rows else 0, dtype)
    for name in dtype.names or ():
        records[name] = rows[name]
    return records.tobytes()


def updates_by_shard(
    shards: np.ndarray, slots: np.ndarray, epochs: np.ndarray, incarnations: np.ndarray, td: np.ndarray,
    num_shards: int,
) -> list[bytes]:  # fmt: skip
    """Update entries as one byte string of :data:`UPDATE_DTYPE` records per shard (``b""`` for none).

    Each shard's entries keep their order: a later entry for a slot wins, as in one buffer.
    """
    records = np.empty(len(shards), UPDATE_DTYPE)
    records["slot"], records["epoch"], records["incarnation"], records["td"] = slots, epochs, incarnations, td
    return split_by_shard(shards, records, num_shards)[1]


def read_updates(data: bytes) -> np.ndarray:
    """The :data:`UPDATE_DTYPE` records of ``data`` (a view, read-only)."""
    return np.frombuffer(data, UPDATE_DTYPE)


def split_by_shard(shard_of: np.ndarray, values: np.ndarray, num_shards: int) -> tuple[np.ndarray, list[bytes]]:
    """``values`` grouped by shard (stable) as one byte string per shard, and the order that grouped them."""
    order = np.argsort(shard_of, kind="stable")
    grouped = values[order]
    bounds = np.searchsorted(shard_of[order], np.arange(num_shards + 1))
    return order, [grouped[bounds[k] : bounds[k + 1]].tobytes() for k in range(num_shards)]


def join(parts: list[bytes], dtype: Any) -> np.ndarray:
    """The arrays of ``dtype`` that ``parts`` hold, one after another (one copy)."""
    return np.frombuffer(b"".join(parts), dtype)


__all__ = ["UPDATE_DTYPE", "join", "read_updates", "row_dtype", "rows_to_bytes", "split_by_shard", "updates_by_shard"]
