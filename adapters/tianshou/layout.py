"""A Tianshou buffer in the common durable-point format: its ``Batch`` layout, to and from named arrays.

The Tianshou buffers make durable points by the storage layer's one scheme
(:mod:`hetero_replay.storage.durable`: when one is due, the atomic write, the
read and its checks). This module only translates: a buffer's state into the
core header and arrays every replay file has (config, size, position, max
priority, generator state, ``storage/*`` arrays, ``priorities``), and back.

* :func:`encode`: a buffer's state as a header and named arrays;
* :func:`decode` and :func:`restore`: a checked file into plain values, then
  poured into a freshly built buffer.

What only a Tianshou buffer has (the ``Batch`` layout, the sub-buffers'
insertion and episode counters, Tianshou's legacy ``RandomState``, the
buffer's constructor options) lives in the header's ``"tianshou"`` section.
Only stored rows are written, in global slot order, with their slots in
``storage/slot``.

A durable point holds the whole buffer, so its cost grows with what the
buffer holds: meant for buffers that fit in RAM (the core engine's ``"disk"``
storage writes bigger ones incrementally).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tianshou.data import Batch

from hetero_replay import PEROptions, ReplayFileError
from hetero_replay.adapters.tianshou.episode_book import EpisodeBook
from hetero_replay.extend import DURABLE, PLAIN_KINDS, is_int, read_point

#: Version of the ``"tianshou"`` header section; a file of another version is refused.
LAYOUT_VERSION = 1

#: The header section holding what only a Tianshou buffer has.
SECTION = "tianshou"

#: The array field holding each written row's global slot (the other fields' rows are in this order).
SLOT = "slot"

#: Names ``reopen`` accepts as overrides: where the tree lives, when to write, the rate limiter; the rest is the file's.
OVERRIDES = ("backend", "placement", "flush_every", "flush_seconds", "rate_limiter")

_COLUMNS = 5  # EpisodeBook's counters: insertion, stored, last, episode length, episode start
_STORAGE_OPTIONS = ("stack_num", "ignore_obs_next", "save_only_last_obs")

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


def encode(buffer: Any, kind: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The state of ``buffer`` as a durable point's header and arrays (the schedule adds its section). Hold its lock.

    Arrays are views of the storage where the stored rows are one block (a
    single buffer, or every sub-buffer full), copies of the stored rows otherwise.

    Args:
        buffer: a Tianshou buffer of this package.
        kind: ``"single"`` or ``"vector"``.

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
            # With a placement the tree's backend is the placement's choice; reopen(placement=...) places it again.
            "backend": "auto" if buffer.placement is not None else o.tree,
            "layout": layout,
            "counters": counters.tolist(),
            "ep_return": ep_return.tolist(),
            "legacy_rng": {**legacy, "state": {**legacy["state"], "key": legacy["state"]["key"].tolist()}},
        },
    }
    if buffer.rate_limiter is not None:
        header["rate_limiter"] = buffer.rate_limiter.state_dict()
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


# -- reading ----------------------------------------------------------------------------------


@dataclass
class DurableImage:
    """A durable file's contents, checked: everything needed to rebuild its buffer."""

    kind: str
    buffer_num: int
    maxsize: int
    options: PEROptions  # tree as recorded ("auto" where a placement chose it)
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
    header: dict[str, Any]  # the core header, with the schedule's durable section


def decode(path: Path, kind: str) -> DurableImage:
    """Read and check the durable file at ``path`` for a buffer of ``kind`` (:func:`~hetero_replay.storage.durable.read_point`).

    Raises:
        ReplayFileError: the file is damaged, foreign (another format, the core
            buffer's ``save``, the other Tianshou buffer kind) or inconsistent.
        OSError: ``path`` cannot be opened.
    """
    header, arrays = read_point(path)
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
    _require(is_int(buffer_num) and buffer_num >= 1, f"buffer_num {buffer_num!r}")
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
    _require(is_int(stack_num) and stack_num >= 1, f"stack_num {stack_num!r}")
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

    _require(DURABLE in header, f"no {DURABLE!r} section: not a durable point")  # checked by read_point if there
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
        header=header,
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
    if buffer.rate_limiter is not None and "rate_limiter" in image.header:
        buffer.rate_limiter.load_state_dict(image.header["rate_limiter"])  # a ValueError names what differs


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)
