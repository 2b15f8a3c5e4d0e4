"""Frame de-duplication: every distinct image plane of some fields stored once, compressed, shared by rows.

A row of a stacked observation ``(4, 84, 84)`` shares three frames with the
row before it, and its ``next_obs`` shares three with its ``obs`` and four with
the next row's ``obs``: stored as they come, each frame is kept eight times.
A :class:`FramePool` splits such fields into *frames* (the field's last two
dimensions; the leading ones are flattened) and keeps each distinct frame once,
as one compressed record, referenced by the rows that hold it. Frames are found
by content (SHA-256 cut to 128 bits), so nothing needs to know where episodes
start or end, how many environments write interleaved, or how the ring wraps:
a frame lives while a row references it and is freed when the last such row is
overwritten. Rows are rebuilt on gather by decompressing their frames into the
batch (native threads, no GIL), bit for bit as written.

The digest stands for the frame's bytes, as in content-addressed stores: two
different frames with the same 128-bit digest would be taken for one. The odds
are about ``n**2 / 2**129`` for ``n`` distinct frames (1e-26 for a billion).
SHA-256 rather than BLAKE2b: most CPUs now compute it in hardware (x86's SHA
extensions, ARMv8's crypto extensions, both used by OpenSSL behind ``hashlib``),
and hashing every written frame was the largest cost of ``add``: an 84x84 frame
took 4.3 us against 8.0 us with BLAKE2b here (benchmarks/results/compression.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetero_replay._native import compress_rows, decompress_rows
from hetero_replay.storage import records as record_arrays
from hetero_replay.storage.records import DamagedRecordError
from hetero_replay.storage.schema import Field

DIGEST_BYTES = 16


@dataclass
class FramePlan:
    """What a write will change in a :class:`FramePool` (made by :meth:`FramePool.plan`, applied by ``commit``)."""

    start: int
    ids: dict[str, list[bytes]]  # field -> the digests of its frames, rows x frames, flat
    new: dict[bytes, bytes] = field(default_factory=dict)  # digest -> compressed record of a frame not held yet
    added: int = 0  # bytes the pool grows by (negative when freed frames outweigh new ones)


class FramePool:
    """Frames of some fields, each distinct frame stored once as a compressed record, counted by reference.

    Args:
        capacity: rows of the storage.
        fields: the pooled fields (uint8, at least two dimensions).
        codec: ``(name, level)`` every frame is compressed with.
    """

    def __init__(self, capacity: int, fields: Mapping[str, Field], codec: tuple[str, int]) -> None:
        self.capacity = capacity
        self.codec = codec
        self._fields = dict(fields)
        self._per_row = {n: int(np.prod(f.shape[:-2], dtype=np.int64)) for n, f in fields.items()}
        self._plane = {n: int(f.shape[-2] * f.shape[-1]) for n, f in fields.items()}  # bytes of one frame
        #: Frame slot of each row's frames (-1: never written), per field: (capacity, frames per row).
        self._slot_of_row = {n: np.full((capacity, k), -1, np.int64) for n, k in self._per_row.items()}
        self._records: list[bytes | None] = []  # frame slot -> record
        self._digests: list[bytes] = []  # frame slot -> digest
        self._refs: list[int] = []  # frame slot -> rows x frames referencing it
        self._slot: dict[bytes, int] = {}  # digest -> frame slot
        self._free: list[int] = []
        #: Bytes the frames' records hold now.
        self.bytes_used = 0

    @property
    def frames(self) -> int:
        """Distinct frames held."""
        return len(self._slot)

    def plan(self, start: int, arrays: Mapping[str, np.ndarray]) -> FramePlan:
        """The frames of the pooled fields among ``arrays`` (rows for slots ``start, ...``): digests, the
        records of frames not held yet (compressed here), and the bytes the pool would grow by. Changes nothing.
        """
        plan = FramePlan(start, {})
        for name in self._fields:
            if name not in arrays:
                continue
            frames = np.ascontiguousarray(arrays[name]).reshape(-1, self._plane[name]).view(np.uint8)
            digests = [_digest(f) for f in frames]
            fresh: dict[bytes, np.ndarray] = {}  # frames of different sizes never share a digest
            for d, f in zip(digests, frames):
                if d not in self._slot and d not in plan.new and d not in fresh:
                    fresh[d] = f
            if fresh:
                plan.new.update(zip(fresh, compress_rows(np.stack(list(fresh.values())), *self.codec)))
            plan.ids[name] = digests
        plan.added = sum(map(len, plan.new.values())) - sum(len(self._records[s] or b"") for s in self._freed_by(plan))
        return plan

    def commit(self, plan: FramePlan) -> None:
        """Apply a :meth:`plan` (cannot fail)."""
        for digest, record in plan.new.items():
            slot = self._free.pop() if self._free else len(self._records)
            if slot == len(self._records):
                self._records.append(None)
                self._digests.append(b"")
                self._refs.append(0)
            self._records[slot], self._digests[slot], self._refs[slot] = record, digest, 0
            self._slot[digest] = slot
        # Every field's new references before any old one is dropped: a frame may move between fields
        # (a rewritten row's next_obs holding what only an overwritten row's obs held) and must not be
        # freed on the way.
        tables = []
        for name, digests in plan.ids.items():
            rows = _slots(plan.start, len(digests) // self._per_row[name], self.capacity)
            new = np.array([self._slot[d] for d in digests], np.int64).reshape(len(rows), -1)
            for s in new.ravel():
                self._refs[s] += 1
            tables.append((self._slot_of_row[name], rows, new))
        for table, rows, new in tables:
            for s in table[rows].ravel():
                if s >= 0:
                    self._refs[s] -= 1
                    if self._refs[s] == 0:
                        self._release(int(s))
            table[rows] = new
        self.bytes_used += plan.added

    def gather(self, indices: np.ndarray, names: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
        """Rows at ``indices`` of the pooled fields ``names`` rebuilt from their frames, and per field the
        slots (of ``indices``) whose frames are damaged.

        One native call for all of them: each distinct frame of the batch is decompressed once (a row's
        ``obs`` and ``next_obs`` share three), straight into the batch, and copied to its other places.
        """
        out: dict[str, np.ndarray] = {}
        damaged: dict[str, list[int]] = {}
        for like in dict.fromkeys(self._fields[n] for n in names):  # fields alike (shape, dtype) share one call
            group = [n for n in names if self._fields[n] == like]
            slots = np.stack([self._slot_of_row[n][indices] for n in group])  # (fields, rows, frames per row)
            # The fields are views of one block, each C-contiguous: the native call fills them all at once.
            block = np.empty((len(group), len(indices), *like.shape), like.dtype)
            flat = slots.reshape(-1)
            bad = np.asarray(
                decompress_rows(self._records, flat, block.reshape(flat.size, -1).view(np.uint8)), np.int64
            )
            fields, rows, _ = np.unravel_index(bad, slots.shape)
            out.update(zip(group, block))
            damaged.update({n: sorted({int(indices[r]) for r in rows[fields == k]}) for k, n in enumerate(group)})
        return out, damaged

    def export(self, count: int) -> dict[str, np.ndarray]:
        """The frames of rows ``0 .. count - 1`` as they are, as arrays (:mod:`.records`).

        ``frame_records`` and ``frame_offsets``: the distinct frames these rows hold, each once;
        ``{field}/frames``, per pooled field: each row's frames as positions in that list (-1: never written).
        """
        tables = {n: t[:count] for n, t in self._slot_of_row.items()}
        used = np.unique(np.concatenate([t.ravel() for t in tables.values()]))
        used = used[used >= 0]
        out = {f"{n}/frames": np.where(t >= 0, np.searchsorted(used, t), -1) for n, t in tables.items()}
        out["frame_records"], out["frame_offsets"] = record_arrays.join([self._records[s] for s in used])
        return out

    def restore(self, records: list[bytes | None], refs: Mapping[str, np.ndarray]) -> None:
        """Hold ``records``, the frames of rows ``0, 1, ...`` whose positions ``refs`` gives per field
        (what :meth:`export` wrote), in this new pool; the records are kept as they are.

        Each frame is decompressed once, to check it and to find it by content on later writes.

        Raises:
            ValueError: a reference outside ``[-1, frames)``, a frame no row references, an empty one,
                one referenced by fields of different frame sizes, two frames alike.
            DamagedRecordError: a frame's record is damaged (naming the fields and rows that hold it).
        """
        n = len(records)
        plane = np.full(n, -1, np.int64)  # the bytes of each frame, as the fields referencing it say
        for name, table in refs.items():
            outside = table[(table < -1) | (table >= n)]
            if len(outside):
                raise ValueError(f"field {name!r}: frame references must be in [-1, {n}), got {outside[:5].tolist()}")
            held = table[table >= 0]
            clash = held[(plane[held] >= 0) & (plane[held] != self._plane[name])]
            if len(clash):
                raise ValueError(
                    f"field {name!r}: frames {clash[:5].tolist()} are held by fields of another frame size"
                )
            plane[held] = self._plane[name]
        if (plane < 0).any() or any(r is None for r in records):
            idle = [i for i in range(n) if plane[i] < 0 or records[i] is None]
            raise ValueError(f"frame_records: frames {idle[:5]} are empty or referenced by no row")
        digests: list[bytes] = [b""] * n
        for size in np.unique(plane).tolist():
            for chunk, frames, bad in record_arrays.decoded(records, np.flatnonzero(plane == size), size):
                if len(bad):
                    holders = {m: np.flatnonzero(np.isin(t, chunk[bad]).any(axis=1)).tolist() for m, t in refs.items()}
                    where = ", ".join(f"field {m!r} rows {rows[:5]}" for m, rows in holders.items() if rows)
                    raise DamagedRecordError(
                        f"frame_records: frames {chunk[bad][:5].tolist()} are damaged (held by {where})"
                    )
                for i, frame in zip(chunk.tolist(), frames):
                    digests[i] = _digest(frame)
        slot = dict(zip(digests, range(n)))
        if len(slot) < n:
            raise ValueError("frame_records: holds a frame twice (frames are stored once)")
        counts = np.zeros(n, np.int64)
        for name, table in refs.items():
            counts += np.bincount(table[table >= 0], minlength=n)
            self._slot_of_row[name][: len(table)] = table
        self._records, self._digests, self._refs, self._slot = list(records), digests, counts.tolist(), slot
        self.bytes_used = sum(map(len, records))  # type: ignore[arg-type]

    def _freed_by(self, plan: FramePlan) -> list[int]:
        """Frame slots a plan's overwrites would leave unreferenced."""
        delta: dict[int, int] = {}
        for name, digests in plan.ids.items():
            rows = _slots(plan.start, len(digests) // self._per_row[name], self.capacity)
            for s in self._slot_of_row[name][rows].ravel():
                if s >= 0:
                    delta[int(s)] = delta.get(int(s), 0) - 1
            for d in digests:
                s = self._slot.get(d)
                if s is not None:
                    delta[s] = delta.get(s, 0) + 1
        return [s for s, change in delta.items() if change < 0 and self._refs[s] + change == 0]

    def _release(self, slot: int) -> None:
        del self._slot[self._digests[slot]]
        self._records[slot] = None
        self._free.append(slot)


def _digest(frame: np.ndarray) -> bytes:
    """What a frame (C-contiguous uint8) is found by: its SHA-256, cut to :data:`DIGEST_BYTES`."""
    return hashlib.sha256(frame.data).digest()[:DIGEST_BYTES]


def _slots(start: int, rows: int, capacity: int) -> np.ndarray:
    return (start + np.arange(rows, dtype=np.int64)) % capacity


def pooled_fields(fields: Mapping[str, Field], frames: Any, compressed: Sequence[str]) -> list[str]:
    """The fields ``frames`` names: ``None``/``False`` none, ``True`` every compressed image field, or a list.

    Raises:
        ValueError: a named field is not compressed (frames are compressed records) or has fewer than two dimensions.
    """
    if frames is None or frames is False:
        return []
    if frames is True:
        return [n for n in compressed if len(fields[n].shape) >= 2]
    names = [frames] if isinstance(frames, str) else list(frames)
    for n in names:
        if n not in compressed:
            raise ValueError(f"frames: field {n!r} has no codec; frames are stored compressed (give it one in codec=)")
        if len(fields[n].shape) < 2:
            raise ValueError(f"frames: field {n!r} of shape {fields[n].shape} has no frames (needs >= 2 dimensions)")
    return names
