"""One shard of a :class:`~hetero_replay.distributed.ShardedReplay`: an engine buffer in a Ray actor.

:class:`ReplayShard` is a plain class; :mod:`.cluster` runs it as a Ray actor
(restarted by Ray when its process dies). It holds a
:class:`~hetero_replay.PrioritizedReplay` with write tracking on, and every
reply carries a :class:`ShardSummary`: what the learner needs to route global
draws (total mass, smallest positive priority, size) and to know whether the
shard changed since (incarnation, version).

Versions: every change of the tree adds one. A draw names the version the
learner routed by; a shard that has changed since serves nothing (the learner
redraws the whole batch), so an accepted batch is exact with respect to the
state the learner saw.

Writers' rows are staged: a writer's add only queues its rows, and the shard
takes them into its tree during the learner's next call (after serving a draw,
with an update or a learner's add), whose reply carries the new summary. So
the tree changes only inside the learner's own calls, and writers never make
a draw stale. The rows become sampleable one learner call later. When
``stage_rows`` rows wait (no learner calls), the shard takes them in at once,
and the learner redraws once.

Durable points: with a ``durable_dir``, the shard makes one every
``flush_every`` added rows or ``flush_seconds`` seconds (whichever comes
first, checked at each call: :class:`~hetero_replay.storage.durable.FlushSchedule`),
atomically (``storage="host"``: :meth:`PrioritizedReplay.save` of the whole
shard; ``"disk"``: the storage's own durable points). A restarted shard starts
from its last durable point; rows added (or staged) and priorities set after it
are lost: that is the loss window.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from hetero_replay.distributed.wire import read_updates, row_dtype, rows_to_bytes
from hetero_replay.options import PEROptions
from hetero_replay.replay import PrioritizedReplay
from hetero_replay.storage import DISK, HOST, Schema
from hetero_replay.storage.base import check_host_batch
from hetero_replay.storage.disk import CONTROL_FILE
from hetero_replay.storage.disk import check_options as check_disk_options
from hetero_replay.storage.durable import FlushSchedule

#: Storages a shard can hold. A Ray actor's rows arrive through Ray, so a
#: "shared" ring (for writer processes on one machine) has nothing to add.
SHARD_STORAGES = (HOST, DISK)


class ShardSummary(NamedTuple):
    """What one shard's reply tells the learner about it."""

    shard: int
    incarnation: int  # random per process start: indices drawn before a restart are recognised
    version: int  # changes of the tree in this incarnation
    total: float  # sum of p ** alpha
    min: float  # smallest positive p ** alpha (inf when empty)
    size: int  # transitions stored
    max_priority: float  # largest |td| + eps this shard has seen or been told
    added: int  # rows added in this incarnation (after its durable point)
    flushed_rows: int  # size at the last durable point that reached the disk (0 without one)
    staged: int  # writers' rows waiting to join the tree


class DrawRequest(NamedTuple):
    """What a learner's draw call asks a shard (see :meth:`ReplayShard.draw`).

    It travels as a plain tuple, ``tuple(request)``: Ray validates and
    serialises one argument instead of seven, and packs a tuple of numbers and
    bytes without pickling (about 170 µs less of the learner's CPU per call, measured).
    """

    offsets: bytes  # float64 masses in [0, routed_total)
    incarnation: int  # the shard state the learner routed by
    version: int
    routed_total: float  # that state's total
    serve_changed: bool  # serve even if the shard changed since (the last redraw)
    updates: bytes = b""  # priority updates to apply after serving: records of wire.UPDATE_DTYPE
    max_priority: float = 1.0  # the largest |td| + eps the learner knows


class ShardDraw(NamedTuple):
    """The transitions at the offsets a learner sent, or ``rows=None`` when the shard had changed.

    It travels as a plain tuple (:meth:`plain`, :meth:`of`), its arrays as bytes
    (:mod:`.wire`): what Ray moves without pickling.
    """

    rows: bytes | None  # records of wire.row_dtype(schema), one per offset
    slots: bytes  # int64, one per offset
    priorities: bytes  # float64 p ** alpha, one per offset
    epoch: int  # write epoch at the draw: later writes to these slots make their updates stale
    summary: ShardSummary  # after the draw, and after the updates and queued rows the call brought in
    current: bool  # served at the routed version (False: rescaled to a newer total, or nothing served)
    min: float  # the smallest positive priority when served (the IS weights' normaliser)
    dropped: int  # entries of the carried updates dropped (slot rewritten, or drawn before a restart)

    def plain(self) -> tuple[Any, ...]:
        """This reply as a plain tuple of numbers and bytes (its summary too), as it travels."""
        return (*self[:4], tuple(self.summary), *self[5:])

    @classmethod
    def of(cls, reply: tuple[Any, ...]) -> ShardDraw:
        """The reply a shard sent as :meth:`plain`."""
        rows, slots, priorities, epoch, summary, *rest = reply
        return cls(rows, slots, priorities, epoch, ShardSummary(*summary), *rest)


@dataclass(frozen=True)
class ShardConfig:
    """How every shard of one sharded replay is built (the same for all; sent once)."""

    capacity: int
    schema: dict[str, dict[str, Any]]  # Schema.to_json()
    options: dict[str, Any]  # PEROptions fields
    storage: str = HOST
    storage_options: Mapping[str, Any] | None = None
    durable_dir: str | None = None
    flush_every: int = 10_000
    flush_seconds: float = 60.0
    stage_rows: int = 4096  # writers' rows a shard queues before taking them in unasked; 0: never queue

    def per_options(self) -> PEROptions:
        return PEROptions(**self.options)


#: Disk storage arguments a shard sets itself, from the ShardedReplay's own arguments.
_SHARD_SETS = {
    "path": "durable_dir",
    "reopen": "reopen",
    "flush_every": "flush_every",
    "flush_seconds": "flush_seconds",
}


def check_storage_options(storage: str, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The shards' ``storage_options``, checked on the learner by the storage's own rule
    (:func:`hetero_replay.storage.disk.check_options`): a name the storage does not take or a value it
    refuses is an error here, as a call with it would be, not in the shards after they started."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(options).__name__}")
    if options and storage != DISK:
        raise TypeError(f"storage={storage!r} shards take no storage_options, got {sorted(options)}")
    for key in options:
        if key in _SHARD_SETS:
            raise ValueError(
                f"storage_options {key!r} is set by the shards themselves: pass ShardedReplay({_SHARD_SETS[key]}=...)"
            )
    check_disk_options(options)
    return dict(options)


def validate_rows(schema: Schema, capacity: int, batch: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
    """A batch checked (and cast) against ``schema`` before any shard sees it, as one buffer checks it."""
    return check_host_batch(schema, capacity, batch)


class ReplayShard:
    """A :class:`PrioritizedReplay` that answers a sharded replay's learner and writers.

    Args:
        shard: this shard's number (``0 .. num_shards - 1``).
        config: see :class:`ShardConfig`.
    """

    def __init__(self, shard: int, config: ShardConfig) -> None:
        self.shard = shard
        self.config = config
        self.incarnation = secrets.randbits(31)
        self.version = 0
        self.added = 0
        self.replay = self._open()
        self.replay.track_writes()
        self.flushed_rows = len(self.replay) if self._durable_path() else 0
        self._flushes = FlushSchedule(config.flush_every, config.flush_seconds)
        self._staged: list[Mapping[str, Any]] = []
        self._staged_rows = 0
        self._row_dtype = row_dtype(self.replay.schema)

    # -- building and restoring ---------------------------------------------------

    def _durable_path(self) -> str | None:
        d = self.config.durable_dir
        if d is None:
            return None
        name = f"shard-{self.shard}" + (".hrp" if self.config.storage == HOST else "")
        return os.path.join(d, name)

    def _open(self) -> PrioritizedReplay:
        c, path = self.config, self._durable_path()
        options = c.per_options()
        if c.storage == DISK:
            if path is None:
                raise ValueError("storage='disk' shards need durable_dir (their ring files go there)")
            # Ring files here are this shard's own (the learner refused another run's unless reopen=True):
            # a restart continues them, from the last durable point, or empty when killed before its first.
            reopen = os.path.exists(os.path.join(path, CONTROL_FILE))
            return PrioritizedReplay(
                c.capacity, Schema.from_json(c.schema), options=options, storage=DISK,
                storage_options={
                    **(c.storage_options or {}), "flush_every": c.flush_every, "flush_seconds": c.flush_seconds,
                    "path": path, "reopen": reopen,
                },
            )  # fmt: skip
        if path is not None and os.path.exists(path):
            return PrioritizedReplay.load(path, tree=options.tree)
        return PrioritizedReplay(c.capacity, Schema.from_json(c.schema), options=options)

    # -- what the learner and writers call ------------------------------------------

    def summary(self) -> ShardSummary:
        tree = self.replay.tree
        return ShardSummary(
            self.shard, self.incarnation, self.version, tree.total(), tree.min(), len(self.replay),
            self.replay.max_priority, self.added, self._durable_rows(), self._staged_rows,
        )  # fmt: skip

    def _durable_rows(self) -> int:
        # "disk" writes its points on a background thread: count the last one that reached the disk.
        return self.replay.durable_rows if self.config.storage == DISK else self.flushed_rows

    def refresh(self) -> ShardSummary:
        """The learner asks how this shard stands: queued writer rows join the tree first."""
        if self._staged:
            self._take_staged()
            self._changed()
        return self.summary()

    def add(self, batch: Mapping[str, Any], max_priority: float) -> ShardSummary:
        """The learner's add: rows join the tree now (with the larger of this shard's and the learner's max priority)."""
        self.replay.lift_max_priority(max_priority)
        self._take_staged()
        self._append(batch)
        self._changed()
        return self.summary()

    def stage(self, batch: Mapping[str, Any], max_priority: float) -> ShardSummary:
        """A writer's add (a batch the writer checked): queued until the learner's next call, see the module docstring."""
        self.replay.lift_max_priority(max_priority)
        rows = len(next(iter(batch.values())))
        if self._staged_rows + rows > self.config.stage_rows:
            self._take_staged()
            self._append(batch)
            self._changed()
        else:
            self._staged.append(batch)
            self._staged_rows += rows
        return self.summary()

    def _append(self, batch: Mapping[str, Any]) -> None:
        rows = len(self.replay.add(batch))
        self.version += 1
        self.added += rows
        self._flushes.count(rows)

    def _take_staged(self) -> None:
        """The writers' queued rows join the tree (one add per queued batch, in arrival order)."""
        staged, self._staged, self._staged_rows = self._staged, [], 0
        for batch in staged:
            self._append(batch)

    def draw(self, request: tuple[Any, ...]) -> tuple[Any, ...]:
        """The transitions at a :class:`DrawRequest`'s offsets (given as a plain tuple): a :class:`ShardDraw`, plain.

        If this shard is no longer at the routed ``(incarnation, version)`` it
        serves nothing, unless ``serve_changed``: then the offsets are rescaled
        to its current total (exact within the shard, the split across shards
        one version old). The request's ``updates`` (as :meth:`update` takes
        them) are applied after serving: a learner with staleness carries its
        updates on its next draw.
        """
        offsets, incarnation, version, routed_total, serve_changed, updates, max_priority = DrawRequest(*request)
        current = (incarnation, version) == (self.incarnation, self.version)
        epoch, served_min = self.replay.write_epoch, self.replay.tree.min()
        rows, slots, priorities = self._serve(np.frombuffer(offsets, np.float64), current, serve_changed, routed_total)
        dropped = self._apply_update(updates)
        if updates:
            self.replay.lift_max_priority(max_priority)
        took = bool(self._staged)
        if took:  # after serving, on every path: the reply's summary is what the learner routes by next
            self._take_staged()
        if updates or took:
            self._changed()
        return ShardDraw(
            None if rows is None else rows_to_bytes(rows, self._row_dtype), slots.tobytes(),
            priorities.astype(np.float64).tobytes(), epoch, self.summary(), current and rows is not None,
            served_min, dropped,
        ).plain()  # fmt: skip

    def _serve(
        self, offsets: np.ndarray, current: bool, serve_changed: bool, routed_total: float
    ) -> tuple[dict[str, np.ndarray] | None, np.ndarray, np.ndarray]:
        """Rows, slots and priorities at ``offsets``; ``None`` rows when this shard must not serve."""
        nothing = np.empty(0, np.int64), np.empty(0, self.replay.tree.dtype)
        if not current and not serve_changed:
            return None, *nothing
        if offsets.size == 0:
            return {name: np.empty((0, *f.shape), f.dtype) for name, f in self.replay.schema.items()}, *nothing
        total = self.replay.tree.total()
        if total <= 0:  # changed to all-zero priorities since the routing: nothing to serve
            return None, *nothing
        if not current:
            offsets = offsets * (total / routed_total)
        # Float sums may put an offset a rounding step past this tree's total.
        rows, slots, priorities = self.replay.gather_at(np.minimum(offsets, np.nextafter(total, 0.0)))
        if rows is None:  # a row under an offset was being rewritten or is damaged: its slot left the tree
            self.version += 1
            return None, *nothing
        return rows, np.asarray(slots, np.int64), priorities

    def update(self, updates: bytes, max_priority: float) -> tuple[int, ShardSummary]:
        """Set priorities from ``|td|`` (records of :data:`~.wire.UPDATE_DTYPE`), dropping entries whose slot was
        rewritten since their draw or that were drawn before this shard restarted.

        Returns ``(entries dropped, summary)``. The learner has checked the values.
        """
        dropped = self._apply_update(updates)
        self.replay.lift_max_priority(max_priority)
        self._take_staged()
        self._changed()
        return dropped, self.summary()

    def _apply_update(self, updates: bytes) -> int:
        """Apply the update records of ``updates``; the number of entries dropped."""
        records = read_updates(updates)
        mine = records[records["incarnation"] == self.incarnation]  # others were drawn before a restart
        if not mine.size:
            return len(records)
        dropped, _ = self.replay.update_priorities_since(
            np.ascontiguousarray(mine["slot"]), np.ascontiguousarray(mine["td"]), np.ascontiguousarray(mine["epoch"])
        )
        self.version += 1
        return dropped + len(records) - len(mine)

    def read(self, name: str, slots: np.ndarray) -> np.ndarray:
        return np.asarray(self.replay.read_rows(name, slots))

    def flush(self) -> ShardSummary:
        """Make a durable point now (with a ``durable_dir``; otherwise nothing to do)."""
        path = self._durable_path()
        if path is not None:
            if self.config.storage == HOST:
                self.replay.save(path)
                self.flushed_rows = len(self.replay)
            else:
                self.replay.flush()
        self._flushes.written()
        return self.summary()

    def close(self) -> None:
        """The learner closes the replay: queued rows join, a last durable point is made, the files are released.

        Releasing them here, not when Ray ends the process, lets a learner reopen
        ``durable_dir`` at once (a killed process holds its buffer's lock until it is gone).
        """
        self._take_staged()
        if self.config.storage == HOST and self._durable_path() is not None:
            self.flush()
        self.replay.close()  # "disk" makes its last durable point here

    def pid(self) -> int:
        """The process this shard runs in (tests kill it)."""
        return os.getpid()

    def _changed(self) -> None:
        c = self.config
        if c.durable_dir is None or c.storage != HOST:  # "disk" makes its durable points itself
            return
        if self._flushes.due():
            self.flush()


__all__ = [
    "SHARD_STORAGES",
    "ReplayShard",
    "check_storage_options",
    "ShardConfig",
    "ShardDraw",
    "ShardSummary",
    "validate_rows",
]
