"""Durable points of the Tianshou buffers: the whole buffer, written atomically, to survive ``kill -9``.

A buffer built with ``durable_path=`` writes its complete state to that file
every ``flush_every`` added transitions or ``flush_seconds`` seconds, whichever
comes first (checked after each ``add``), and ``reopen(path)`` builds the buffer
of the last durable point. This module holds the pieces the buffers share:

* :class:`DurableSchedule` and :func:`check_schedule`: when to write, and the
  checks of the constructor's three arguments;
* :func:`encode`: a buffer's state as a header and named arrays for
  :func:`hetero_replay.checkpoint.write` (atomic: temporary file, fsync,
  rename, fsync of the directory; not pickle);
* :func:`decode` and :func:`restore`: a file checked into plain values, then
  poured into a freshly built buffer.

The file is a :mod:`hetero_replay.checkpoint` file whose core part (config,
size, position, max priority, generator state, ``storage/*`` arrays and
``priorities``) passes :func:`~hetero_replay.checkpoint.read`'s checks; what
only a Tianshou buffer has (the ``Batch`` layout, the sub-buffers' insertion
and episode counters, Tianshou's legacy ``RandomState``, the buffer's
constructor options) lives in the header's ``"tianshou"`` section. Only stored
rows are written, in global slot order, with their slots in ``storage/slot``.

A durable point writes the whole buffer, so its cost grows with what the buffer
holds: meant for buffers that fit in RAM (the core engine's disk tier handles
bigger ones incrementally).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tianshou.data import Batch

from hetero_replay import checkpoint
from hetero_replay.adapters.tianshou.episode_book import EpisodeBook
from hetero_replay.checkpoint import ReplayFileError
from hetero_replay.options import PEROptions
from hetero_replay.storage.schema import PLAIN_KINDS

#: Version of the ``"tianshou"`` header section; a file of another version is refused.
LAYOUT_VERSION = 1

#: The header section holding what only a Tianshou buffer has.
SECTION = "tianshou"

#: The array field holding each written row's global slot (the other fields' rows are in this order).
SLOT = "slot"

#: Names ``reopen`` accepts as overrides: where the tree lives and when to write; the rest is the file's.
OVERRIDES = ("backend", "mapping", "flush_every", "flush_seconds")

_COLUMNS = 5  # EpisodeBook's counters: insertion, stored, last, episode length, episode start
_STORAGE_OPTIONS = ("stack_num", "ignore_obs_next", "save_only_last_obs")

#: The clock of the time threshold (monotonic: a wall-clock jump neither forces nor delays a point).
_clock = time.monotonic


# -- when to write ----------------------------------------------------------------------------


@dataclass
class DurableSchedule:
    """Where and when a buffer writes its durable points, and what it has written so far.

    Attributes:
        path: the durable file.
        flush_every: a point is due once this many transitions were added since the last one.
        flush_seconds: ... or once this many seconds have passed since it (checked on ``add``).
        pending: transitions added since the last durable point.
        last: :func:`_clock` time of the last durable point.
        points: durable points written over the buffer's life (kept across ``reopen``).
        added: transitions added over the buffer's life, as of now (kept across ``reopen``).
    """

    path: Path
    flush_every: int
    flush_seconds: float
    pending: int = 0
    last: float = field(default_factory=lambda: _clock())
    points: int = 0
    added: int = 0

    def count(self, n: int) -> bool:
        """Record ``n`` added transitions; say whether a durable point is now due."""
        self.pending += n
        self.added += n
        return self.pending >= self.flush_every or _clock() - self.last >= self.flush_seconds

    def written(self) -> None:
        """Record that a durable point of the current state is on disk."""
        self.pending, self.last, self.points = 0, _clock(), self.points + 1


def check_path(value: Any, name: str = "durable_path") -> Path:
    """``value`` as a :class:`~pathlib.Path`; ``TypeError`` unless a ``str`` or ``os.PathLike`` of one, ``ValueError`` if empty."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(value).__name__} {value!r}")
    text = os.fspath(value)
    if not isinstance(text, str):  # a PathLike of bytes
        raise TypeError(f"{name} must name a path as text, got {type(text).__name__} {text!r}")
    if not text:
        raise ValueError(f"{name} must not be empty")
    return Path(text)


def check_flush_every(value: Any) -> int:
    """``value`` as an int ``>= 1``; ``TypeError``/``ValueError`` naming ``flush_every`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"flush_every must be an integer, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"flush_every must be >= 1 (transitions added between durable points), got {value}")
    return int(value)


def check_flush_seconds(value: Any) -> float:
    """``value`` as a finite float ``> 0``; ``TypeError``/``ValueError`` naming ``flush_seconds`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"flush_seconds must be a real number, got {type(value).__name__} {value!r}")
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"flush_seconds must be finite and > 0, got {value!r}")
    return seconds


def check_schedule(durable_path: Any, flush_every: Any, flush_seconds: Any) -> DurableSchedule | None:
    """The constructor's durable arguments, all checked (also without a path); ``None`` without ``durable_path``.

    Raises:
        TypeError: ``durable_path`` is not a ``str``/``os.PathLike`` (or ``None``),
            ``flush_every`` not an integer, ``flush_seconds`` not a real number.
        ValueError: ``flush_every < 1``; ``flush_seconds`` not finite and positive;
            ``durable_path`` is empty, lies in a folder that does not exist, or
            already exists (a buffer of an earlier run, which ``reopen`` continues).
    """
    every, seconds = check_flush_every(flush_every), check_flush_seconds(flush_seconds)
    if durable_path is None:
        return None
    path = check_path(durable_path)
    if os.path.lexists(path):  # lexists: a dangling link would still be replaced by the first write
        what = "is a directory" if path.is_dir() else "already exists"
        raise ValueError(
            f"durable_path {str(path)!r} {what}; a new buffer never replaces it. To continue the run whose "
            f"buffer it holds, call reopen({str(path)!r}); to start a new one, choose another path"
        )
    if not path.parent.is_dir():
        raise ValueError(f"durable_path {str(path)!r}: the folder {str(path.parent)!r} does not exist")
    return DurableSchedule(path, every, seconds)


# -- writing ----------------------------------------------------------------------------------


def check_storable(rows: Batch, prefix: str = "") -> None:
    """``TypeError`` naming the first key of ``rows`` (a ``Batch``, nested) that a durable point cannot hold.

    Durable points hold NumPy arrays of booleans and numbers (and Batches of
    them, empty ones included): no objects, text or tensors, which would need pickle.
    """
    for key, value in rows.__dict__.items():
        if isinstance(value, Batch):
            check_storable(value, f"{prefix}{key}.")
        elif not (isinstance(value, np.ndarray) and value.dtype.kind in PLAIN_KINDS):
            what = f"{value.dtype} values" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
            raise TypeError(
                f"{prefix}{key}: a buffer with durable_path stores NumPy arrays of numbers or booleans only "
                f"(durable points do not pickle), got {what}; leave that key out of the batch, or use a "
                "buffer without durable_path"
            )


def encode(buffer: Any, kind: str, schedule: DurableSchedule) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The durable point of ``buffer`` as :func:`~hetero_replay.checkpoint.write` takes it. Hold its lock.

    Arrays are views of the storage where the stored rows are one block (a
    single buffer, or every sub-buffer full), copies of the stored rows otherwise.

    Args:
        buffer: a Tianshou buffer of this package.
        kind: ``"single"`` or ``"vector"``.
        schedule: its durable schedule (the file records its settings and
            counts; the count of points includes this one).

    Raises:
        TypeError: the storage holds a value :func:`check_storable` refuses.
    """
    starts, stops = buffer._stored_bounds()
    lengths = stops - starts
    rows: slice | np.ndarray
    if len(starts) == 1 or np.all(lengths == buffer.maxsize // len(starts)):
        end = int(stops[-1]) if len(starts) == 1 else buffer.maxsize
        rows, slots = slice(0, end), np.arange(end, dtype=np.int64)
    else:  # stored rows of partly filled sub-buffers: gather them
        slots = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(starts, stops)])
        rows = slots
    fields: dict[str, np.ndarray] = {SLOT: slots}
    check_storable(buffer._meta)
    layout = _flatten(buffer._meta, rows, fields)

    o = buffer.priorities.options
    schema = {name: {"shape": list(arr.shape[1:]), "dtype": arr.dtype.str} for name, arr in fields.items()}
    if kind == "vector":
        book: EpisodeBook = buffer._book
        counters, ep_return = book.counters, book.ep_return
    else:
        counters = np.array(
            [[buffer._insertion_idx, buffer._size, buffer.last_index[0], buffer._ep_len, buffer._ep_start_idx]]
        )
        ep_return = np.asarray(buffer._ep_return, np.float64)[None]
    legacy = buffer._random_state.get_state(legacy=False)
    header = {
        "config": {
            "capacity": buffer.maxsize,
            "alpha": buffer.alpha,
            "beta": buffer.beta,
            "eps": buffer.eps,
            "fanout": o.fanout,
            "priority_dtype": o.priority_dtype,
            "stratified": o.stratified,
            "schema": schema,
        },
        # The core's ring position; a vector buffer has one per sub-buffer, in "counters".
        "position": int(counters[0, EpisodeBook.INSERTION]) if kind == "single" else 0,
        "size": len(slots),
        "max_priority": buffer.max_priority,
        "rng_state": buffer._rng.bit_generator.state,
        SECTION: {
            "layout_version": LAYOUT_VERSION,
            "buffer": kind,
            "buffer_num": len(starts),
            "storage_options": {name: buffer.options[name] for name in _STORAGE_OPTIONS},
            "weight_norm": buffer._weight_norm,
            # With a mapping the tree's backend is the mapping's choice; reopen(mapping=...) places it again.
            "backend": "auto" if buffer.mapping is not None else o.tree,
            "layout": layout,
            "counters": counters.tolist(),
            "ep_return": ep_return.tolist(),
            "legacy_rng": {**legacy, "state": {**legacy["state"], "key": legacy["state"]["key"].tolist()}},
            "durable": {
                "flush_every": schedule.flush_every,
                "flush_seconds": schedule.flush_seconds,
                "points": schedule.points + 1,  # this one included
                "added": schedule.added,
            },
        },
    }
    arrays = {f"storage/{name}": arr for name, arr in fields.items()}
    arrays["priorities"] = np.asarray(buffer.priorities.leaves())[slots]
    return header, arrays


def _flatten(batch: Batch, rows: slice | np.ndarray, fields: dict[str, np.ndarray]) -> dict[str, Any]:
    """The layout of ``batch`` (key -> field name, or a nested layout for a ``Batch``); fills ``fields``.

    Fields are named by number, not by key: Batch keys may hold any text, and
    the layout (JSON, in key order) says which key each field belongs to.
    """
    layout: dict[str, Any] = {}
    for key, value in batch.__dict__.items():
        if isinstance(value, Batch):
            layout[key] = _flatten(value, rows, fields)
        else:
            name = f"field{len(fields) - 1}"  # fields already holds the slots
            fields[name] = value[rows]
            layout[key] = name
    return layout


def write(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write a durable point atomically (:func:`hetero_replay.checkpoint.write`)."""
    checkpoint.write(path, header, arrays)


# -- reading ----------------------------------------------------------------------------------


@dataclass
class DurableImage:
    """A durable file's contents, checked: everything needed to rebuild its buffer."""

    kind: str
    buffer_num: int
    maxsize: int
    options: PEROptions  # tree as recorded ("auto" where a mapping placed it)
    weight_norm: bool
    storage_options: dict[str, Any]
    meta: Batch  # full-size storage, stored rows in place
    slots: np.ndarray
    priorities: np.ndarray  # of the stored slots, float64
    max_priority: float
    rng_state: dict[str, Any]
    legacy_rng: dict[str, Any]
    counters: np.ndarray  # (buffer_num, 5), local slots, as EpisodeBook.counters
    ep_return: np.ndarray  # (buffer_num, *reward shape)
    flush_every: int
    flush_seconds: float
    points: int
    added: int


def decode(path: Path, kind: str) -> DurableImage:
    """Read and check the durable file at ``path`` for a buffer of ``kind``.

    Raises:
        ReplayFileError: the file is damaged, foreign (another format, the core
            buffer's ``save``, the other Tianshou buffer kind) or inconsistent.
        OSError: ``path`` cannot be opened.
    """
    header, arrays = checkpoint.read(path)
    section = header.get(SECTION)
    if not isinstance(section, dict):
        raise ReplayFileError(
            f"{path}: not a durable Tianshou buffer (no {SECTION!r} section; a file of "
            "PrioritizedReplay.save is read by PrioritizedReplay.load)"
        )
    if section.get("layout_version") != LAYOUT_VERSION:
        raise ReplayFileError(
            f"{path}: durable layout version {section.get('layout_version')!r}, this library reads {LAYOUT_VERSION}"
        )
    if section.get("buffer") != kind:
        other = "HeteroPrioritizedVectorReplayBuffer" if kind == "single" else "HeteroPrioritizedReplayBuffer"
        raise ReplayFileError(f"{path}: holds a {section.get('buffer')!r} buffer; reopen it with {other}.reopen")
    try:
        return _decode(header, section, arrays, kind)
    except ReplayFileError:
        raise
    except MemoryError as e:  # read() bounds the file, not the capacity it declares
        raise ReplayFileError(
            f"{path}: describes a buffer of capacity {header['config']['capacity']}, more than this machine "
            f"can allocate ({e})"
        ) from e
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        raise ReplayFileError(f"{path}: inconsistent durable Tianshou buffer ({e!r})") from e


def _decode(header: dict[str, Any], section: dict[str, Any], arrays: dict[str, np.ndarray], kind: str) -> DurableImage:
    """:func:`decode` past the format checks; any ``KeyError``/``TypeError``/``ValueError`` means a bad file."""
    cfg = header["config"]
    maxsize, buffer_num = cfg["capacity"], section["buffer_num"]
    _require(_is_int(buffer_num) and buffer_num >= 1, f"buffer_num {buffer_num!r}")
    _require(kind == "vector" or buffer_num == 1, "a single buffer with several sub-buffers")
    _require(maxsize % buffer_num == 0, f"capacity {maxsize} is not a multiple of buffer_num {buffer_num}")
    size = maxsize // buffer_num

    backend = section["backend"]
    _require(isinstance(backend, str), f"backend {backend!r}")
    options = PEROptions.from_config(cfg, backend)
    _require(options.eps > 0, f"eps {options.eps!r} (these buffers need eps > 0)")
    weight_norm = section["weight_norm"]
    _require(isinstance(weight_norm, bool), f"weight_norm {weight_norm!r}")
    storage_options = section["storage_options"]
    _require(isinstance(storage_options, dict) and set(storage_options) == set(_STORAGE_OPTIONS), "storage options")
    stack_num = storage_options["stack_num"]
    _require(_is_int(stack_num) and stack_num >= 1, f"stack_num {stack_num!r}")
    _require(
        all(isinstance(storage_options[k], bool) for k in _STORAGE_OPTIONS[1:]),
        f"storage options {storage_options!r}",
    )

    counters = np.asarray(section["counters"])
    _require(counters.shape == (buffer_num, _COLUMNS) and counters.dtype.kind in "iu", "counters' shape")
    counters = counters.astype(np.int64)
    B = EpisodeBook
    insertion, stored = counters[:, B.INSERTION], counters[:, B.STORED]
    _require(bool(np.all(counters >= 0)), "negative counters")
    _require(bool(np.all(counters[:, [B.INSERTION, B.LAST, B.EP_START]] < size)), f"slots beyond {size}")
    _require(bool(np.all(stored <= size)), "more stored rows than slots")
    # A ring fills from slot 0, so a partly filled one inserts next after its stored rows.
    _require(bool(np.all((stored == size) | (insertion == stored))), "insertion slot of a partly filled ring")
    _require(bool(np.all(counters[:, B.EP_START] <= stored)), "an episode starting beyond the stored rows")
    ep_return = np.asarray(section["ep_return"], np.float64)
    _require(ep_return.shape[:1] == (buffer_num,), f"ep_return of shape {ep_return.shape}")

    # Rows and slots: exactly the stored ones, in global slot order.
    offsets = np.arange(buffer_num, dtype=np.int64) * size
    expected = np.concatenate([np.arange(o, o + n, dtype=np.int64) for o, n in zip(offsets, stored)])
    slots = arrays[f"storage/{SLOT}"]
    _require(slots.dtype == np.int64 and np.array_equal(slots, expected), "storage/slot is not the stored slots")
    priorities = arrays["priorities"].astype(np.float64)
    _require(bool(np.all(np.isfinite(priorities) & (priorities > 0))), "a stored row without a positive priority")
    names = {n[len("storage/") :] for n in arrays if n.startswith("storage/")} - {SLOT}
    meta = _unflatten(section["layout"], arrays, slots, maxsize, names)
    _require(not names, f"fields {sorted(names)} are in no key of the layout")

    durable = section["durable"]
    every, seconds = durable["flush_every"], durable["flush_seconds"]
    points, added = durable["points"], durable["added"]
    _require(_is_int(points) and _is_int(added) and points >= 0 and added >= 0, "durable counts")
    return DurableImage(
        kind=kind,
        buffer_num=buffer_num,
        maxsize=maxsize,
        options=options,
        weight_norm=weight_norm,
        storage_options=dict(storage_options),
        meta=meta,
        slots=slots,
        priorities=priorities,
        max_priority=float(header["max_priority"]),
        rng_state=header["rng_state"],
        legacy_rng=_legacy_state(section["legacy_rng"]),
        counters=counters,
        ep_return=ep_return,
        flush_every=check_flush_every(every),
        flush_seconds=check_flush_seconds(seconds),
        points=points,
        added=added,
    )


def _unflatten(layout: Any, arrays: dict[str, np.ndarray], slots: np.ndarray, maxsize: int, unused: set[str]) -> Batch:
    """The full-size storage ``Batch`` of ``layout``, rows at ``slots`` (0 elsewhere); removes used names from ``unused``."""
    _require(isinstance(layout, dict), "layout is not a mapping")
    batch = Batch()
    for key, entry in layout.items():
        if isinstance(entry, dict):
            batch.__dict__[key] = _unflatten(entry, arrays, slots, maxsize, unused)
            continue
        _require(isinstance(entry, str) and entry in unused, f"key {key!r} names field {entry!r} twice or not at all")
        unused.discard(entry)
        rows = arrays[f"storage/{entry}"]
        column = np.zeros((maxsize, *rows.shape[1:]), rows.dtype)
        column[slots] = rows
        batch.__dict__[key] = column
    return batch


def _legacy_state(state: Any) -> dict[str, Any]:
    """Tianshou's ``RandomState`` state from JSON, checked by setting it on a scratch generator."""
    _require(isinstance(state, dict) and isinstance(state.get("state"), dict), "legacy_rng")
    key = np.asarray(state["state"]["key"])
    _require(key.shape == (624,) and key.dtype.kind in "iu", "legacy_rng key")
    restored = {**state, "state": {**state["state"], "key": key.astype(np.uint32)}}
    np.random.RandomState().set_state(restored)  # raises on anything but an MT19937 state
    return restored


def restore(buffer: Any, image: DurableImage) -> None:
    """Pour ``image`` into ``buffer``, freshly built from its options. ``ValueError``/``TypeError`` mean a bad file."""
    buffer._meta = image.meta
    B = EpisodeBook
    if image.kind == "vector":
        book: EpisodeBook = buffer._book
        book.counters[:] = image.counters
        book.ep_return = image.ep_return.copy()
        buffer._lengths = image.counters[:, B.STORED].copy()
        buffer.last_index = buffer._offset + image.counters[:, B.LAST]  # global, as add_rows keeps it
        if image.meta.get_keys():
            buffer._set_batch_for_children()
    else:
        row = image.counters[0]
        buffer._insertion_idx, buffer._size = int(row[B.INSERTION]), int(row[B.STORED])
        buffer.last_index = np.array([row[B.LAST]])
        buffer._ep_len, buffer._ep_start_idx = int(row[B.EP_LEN]), int(row[B.EP_START])
        ep_return = image.ep_return[0]
        buffer._ep_return = float(ep_return) if ep_return.ndim == 0 else ep_return.copy()
    tree = buffer.priority_tree
    leaves = np.zeros(tree.capacity, tree.dtype)
    with np.errstate(over="ignore", under="ignore"):
        leaves[image.slots] = image.priorities.astype(tree.dtype)
    kept = leaves[image.slots]
    _require(bool(np.all(np.isfinite(kept) & (kept > 0))), f"a stored priority rounds to 0 or inf in {tree.dtype}")
    buffer.priorities.load(leaves, image.max_priority)
    buffer._rng.bit_generator.state = image.rng_state
    buffer._random_state.set_state(image.legacy_rng)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)
