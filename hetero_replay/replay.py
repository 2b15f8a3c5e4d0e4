"""PrioritizedReplay: storage + sum tree + the PER rules (alpha, beta, eps, max priority).

Prioritized experience replay (Schaul et al., 2016) samples transition ``i``
with probability ``P(i) = p_i^alpha / sum_k p_k^alpha`` and corrects the bias
with importance-sampling weights ``w_i = (N P(i))^-beta / max_j w_j``. Here the
maximum is taken over the whole buffer (from the tree's exact minimum), not
over the sampled batch, so weights mean the same thing from batch to batch.

Placement: by default transitions live in NumPy arrays on the host and
batches come back as NumPy arrays. With ``storage=`` a torch device (or
``"pinned"``) and/or ``device=`` the learner's device, batches come back as
torch tensors already on that device (see
:class:`~hetero_replay.torch_replay.TorchBatchReplay`); with a
device tree (``tree="torch"`` or ``"cupy"`` and ``tree_device=``), sampling and
priority updates run there too. :class:`hetero_replay.mapping.Mapping` builds
these arguments from a device per primitive.

Threads and processes: every public method may be called from several threads
at once. Each takes the buffer's lock, so an ``add`` is never seen half
written, no row is lost, and a sample never returns a slot that was not
written. Before ``fork`` every live buffer's lock is taken (operations in
flight finish first), so a child process gets a consistent, usable buffer.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Mapping, NamedTuple

import numpy as np

from hetero_replay import _native, checkpoint
from hetero_replay.storage import HOST, HostStorage, Schema, make_storage
from hetero_replay.trees import SumTree, make_tree
from hetero_replay.trees.base import MAX_CAPACITY, describe_max_leaf

#: Largest batch one ``sample`` call draws.
MAX_BATCH = 2**30

#: Added to every ``|TD error|`` (the ``eps`` of every buffer in this package). It also floors
#: the smallest priority, and with it the largest IS weight that normalises all the others:
#: the smaller it is, the smaller the typical weight (see docs/design-notes.md, "eps").
DEFAULT_EPS = 1e-6


class Sample(NamedTuple):
    """A sampled batch: ``data[field]`` rows, their buffer ``indices``, IS ``weights``.

    NumPy arrays from a host buffer; torch tensors from a
    :class:`~hetero_replay.torch_replay.TorchBatchReplay` (``data`` and ``weights`` on the learner's
    device, ``indices`` where the tree is, ready for ``update_priorities``).
    """

    data: dict[str, Any]
    indices: Any
    weights: Any


class PrioritizedReplay:
    """A prioritized replay buffer over a fixed schema of transition fields.

    Args:
        capacity: transitions kept; the oldest is overwritten first.
        schema: ``{name: (shape, dtype)}``, a :class:`~hetero_replay.storage.Schema`,
            or ``Schema.from_spaces(env.observation_space, env.action_space)``.
        alpha: priority exponent; 0 samples uniformly.
        beta: IS-weight exponent in ``[0, 1]``; 1 corrects the bias fully.
            Anneal it towards 1 with the :attr:`beta` setter or per call.
        eps: added to every ``|TD error|`` so no transition gets priority 0.
        tree: sum-tree backend, ``"auto"`` or a name from
            :func:`hetero_replay.trees.backends`.
        fanout: children per tree node (power of two; 16 = one cache line).
        priority_dtype: ``"float32"`` (default) or ``"float64"`` tree values.
        stratified: draw one sample from each of ``batch_size`` equal slices of
            the priority mass (lower variance); ``False`` draws i.i.d.
        seed: seed of the buffer's own ``numpy.random.Generator``; the same seed
            and the same calls give the same samples.
        tree_device: where a device tree lives (``tree="torch"``: any torch
            device; ``"cupy"``: a CUDA device); ``None`` for the CPU trees.
        storage: where transitions live: ``"host"`` (NumPy, the default),
            ``"pinned"`` (page-locked host memory, asynchronous copies to a GPU)
            or a torch device (``"cpu"``, ``"cuda"``, ...).
        device: the learner's torch device. When set, or when ``storage`` is
            not ``"host"``, the buffer is a
            :class:`~hetero_replay.torch_replay.TorchBatchReplay` and
            :meth:`sample` returns torch tensors already on this device
            (default: the storage's device).

    Example:
        >>> buf = PrioritizedReplay(1000, {"obs": ((4,), "float32"), "reward": ((), "float32")}, seed=0)
        >>> idx = buf.add({"obs": np.zeros((8, 4)), "reward": np.ones(8)})
        >>> batch = buf.sample(4)
        >>> buf.update_priorities(batch.indices, np.abs(np.random.randn(4)))
    """

    _lock: threading.RLock

    def __new__(cls, *args: Any, **kwargs: Any) -> "PrioritizedReplay":
        # Buffers that hand out torch tensors are a subclass, so the NumPy path
        # pays nothing per call for the device path's existence.
        if cls is PrioritizedReplay and (kwargs.get("storage", HOST) != HOST or kwargs.get("device") is not None):
            from hetero_replay.torch_replay import TorchBatchReplay

            cls = TorchBatchReplay
        return super().__new__(cls)

    def __init__(
        self,
        capacity: int,
        schema: Schema | Mapping[str, Any],
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = DEFAULT_EPS,
        tree: str = "auto",
        fanout: int = 16,
        priority_dtype: Any = "float32",
        stratified: bool = True,
        seed: int | None = None,
        *,
        tree_device: Any = None,
        storage: str = HOST,
        device: Any = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an integer, got {type(capacity).__name__} {capacity!r}")
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in [1, 2**40], got {capacity}")
        if not isinstance(stratified, (bool, np.bool_)):
            raise TypeError(f"stratified must be True or False, got {type(stratified).__name__} {stratified!r}")
        self._lock = threading.RLock()
        self._beta = _check_beta(beta)
        self._alpha = _check_alpha(alpha)
        self._eps = _check_eps(eps)
        self.stratified = bool(stratified)
        self.capacity = int(capacity)
        self.tree: SumTree = make_tree(tree, self.capacity, fanout, priority_dtype, device=tree_device)
        _check_floor(self._alpha, self._eps, self.tree.dtype)
        self.storage = make_storage(storage, self.capacity, schema)
        self._tree_backend = tree
        # How to rebuild this buffer elsewhere (load_state_dict, pickling).
        self._placement = {
            "tree_device": None if tree_device is None else str(tree_device),
            "storage": str(storage),
            "device": None if device is None else str(device),
        }
        self.rng = np.random.default_rng(_check_seed(seed))
        self._pos = 0
        self._size = 0
        self._max_priority = 1.0  # raw (|td| + eps); new items get its alpha power
        _LIVE.add(self)

    # -- hyper-parameters ----------------------------------------------------------

    @property
    def alpha(self) -> float:
        """Priority exponent. Changing it shapes only priorities written from now on."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        alpha = _check_alpha(value)
        with self._lock:
            _check_floor(alpha, self._eps, self.tree.dtype)
            self._alpha = alpha

    @property
    def eps(self) -> float:
        """Added to every ``|TD error|``; ``eps ** alpha`` is the smallest priority."""
        return self._eps

    @eps.setter
    def eps(self, value: float) -> None:
        eps = _check_eps(value)
        with self._lock:
            _check_floor(self._alpha, eps, self.tree.dtype)
            self._eps = eps

    @property
    def beta(self) -> float:
        """IS-weight exponent in ``[0, 1]`` used when :meth:`sample` is given none."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = _check_beta(value)

    @property
    def schema(self) -> Schema:
        return self.storage.schema

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` seen so far (starts at 1)."""
        return self._max_priority

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (
            f"PrioritizedReplay(size={self._size}/{self.capacity}, alpha={self._alpha}, "
            f"beta={self._beta}, tree={type(self.tree).__name__}, schema={self.schema!r})"
        )

    # -- the three operations ------------------------------------------------------

    def add(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Append a batch of transitions (``{field: array of shape (n, ...)}``).

        New transitions get the largest priority seen so far, so each is sampled
        at least once soon. Returns their indices. Nothing is written unless the
        whole batch is valid (fields, shapes, dtypes, values that survive the
        cast, and a new priority the tree can hold).
        """
        with self._lock:
            rows, arrays = self.storage.validate(batch)
            indices = (self._pos + np.arange(rows, dtype=np.int64)) % self.capacity
            if rows == 0:
                return indices
            priority = self._new_priority()
            self.storage.write(self._pos, arrays)
            self.tree.update(indices, np.full(rows, priority, self.tree.dtype))
            self._pos = (self._pos + rows) % self.capacity
            self._size = min(self._size + rows, self.capacity)
            return indices

    def _new_priority(self) -> Any:
        """``max_priority ** alpha`` in the tree's dtype, or ``ValueError`` if the tree cannot hold it."""
        with np.errstate(over="ignore"):
            priority = self.tree.dtype.type(self._max_priority**self._alpha)
        if not priority <= self.tree.max_leaf:
            raise ValueError(
                f"the priority of new transitions, max_priority ** alpha = {self._max_priority!r} ** "
                f"{self._alpha!r} = {priority!r}, exceeds the largest priority this tree can sum, "
                f"{describe_max_leaf(self.tree.dtype, self.capacity)}; lower alpha"
            )
        return priority

    def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions with probability ``p_i^alpha / sum p^alpha``.

        Args:
            batch_size: number of draws (with replacement), in ``[1, 2**30]``.
            beta: IS exponent for this call; defaults to :attr:`beta`.

        A refused call (bad arguments, empty buffer) leaves the random
        generator untouched.
        """
        if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an integer, got {type(batch_size).__name__} {batch_size!r}")
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be in [1, 2**30], got {batch_size}")
        beta = self._beta if beta is None else _check_beta(beta)
        with self._lock:
            if self._size == 0:
                raise ValueError("cannot sample from an empty buffer; add transitions first")
            return self._draw(int(batch_size), beta)

    def _draw(self, batch_size: int, beta: float) -> Sample:
        """The sample itself, arguments checked, lock held."""
        indices, weights = self.tree.sample(batch_size, self.rng, beta, self.stratified)
        return Sample(self.storage.gather(indices), indices, weights)

    def update_priorities(self, indices: Any, td_errors: Any) -> None:
        """Set the priorities of sampled transitions from their ``|TD error|``.

        The stored priority is ``(|td| + eps) ** alpha``. ``td_errors`` must be
        magnitudes: a NaN, infinite or negative entry, or one whose priority
        the tree cannot sum (see :attr:`SumTree.max_leaf`), raises
        ``ValueError`` naming its position; an index outside the filled part of
        the buffer raises ``IndexError``; either way no priority changes.
        """
        with self._lock:
            limit = None if self._size == self.capacity else self._size
            max_raw = self._update(indices, td_errors, limit)
            if max_raw > self._max_priority:
                self._max_priority = max_raw

    def _update(self, indices: Any, td_errors: Any, limit: int | None) -> float:
        """The tree update itself, lock held; returns ``max(|td| + eps)``."""
        return self.tree.update_td(indices, td_errors, self._alpha, self._eps, limit)

    # -- state -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this buffer is (copies)."""
        with self._lock:
            return self._state(copy=True)

    def _state(self, copy: bool) -> dict[str, Any]:
        if isinstance(self.storage, HostStorage):
            rows = {n: a[: self._size] for n, a in self.storage.arrays.items()}
        else:  # device storage: these are already fresh host copies
            rows, copy = self.storage.host_rows(self._size), False
        return {
            "config": {
                "capacity": self.capacity,
                "alpha": self._alpha,
                "beta": self._beta,
                "eps": self._eps,
                "fanout": self.tree.fanout,
                "priority_dtype": self.tree.dtype.name,
                "stratified": self.stratified,
                "schema": self.schema.to_json(),
            },
            "position": self._pos,
            "size": self._size,
            "max_priority": self._max_priority,
            "rng_state": self.rng.bit_generator.state,
            "storage": {n: a.copy() for n, a in rows.items()} if copy else rows,
            "priorities": self.tree.leaves()[: self._size],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a buffer with the same capacity and schema.

        Everything is checked before anything changes; on error this buffer is
        left as it was.
        """
        cfg = state["config"]
        if int(cfg["capacity"]) != self.capacity or Schema.from_json(cfg["schema"]) != self.schema:
            raise ValueError(
                "state is for a buffer of capacity "
                f"{cfg['capacity']} and schema {Schema.from_json(cfg['schema'])!r}; this one has "
                f"capacity {self.capacity} and schema {self.schema!r}. Use PrioritizedReplay.from_state_dict."
            )
        fresh = PrioritizedReplay.from_state_dict(state, tree=self._tree_backend, **self._placement)
        with self._lock:
            self._become(fresh)

    def _become(self, fresh: "PrioritizedReplay") -> None:
        """Take over ``fresh``'s state, keeping this buffer's lock (other threads may wait on it)."""
        _LIVE.discard(fresh)
        state = dict(fresh.__dict__)
        state.pop("_lock")
        self.__dict__.update(state)

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, Any], tree: str = "auto", **placement: Any
    ) -> "PrioritizedReplay":
        """A new buffer restored from :meth:`state_dict` output.

        ``placement``: ``tree_device``, ``storage`` and ``device`` as in the
        constructor (the state itself holds no placement: it loads anywhere).
        """
        cfg = state["config"]
        buf = cls(
            int(cfg["capacity"]),
            Schema.from_json(cfg["schema"]),
            alpha=cfg["alpha"],
            beta=cfg["beta"],
            eps=cfg["eps"],
            tree=tree,
            fanout=int(cfg["fanout"]),
            priority_dtype=cfg["priority_dtype"],
            stratified=bool(cfg["stratified"]),
            **placement,
        )
        size, pos = int(state["size"]), int(state["position"])
        if not (0 <= size <= buf.capacity and 0 <= pos < buf.capacity and (size == buf.capacity or pos == size)):
            raise ValueError(f"inconsistent position {pos} / size {size} for capacity {buf.capacity}")
        storage, priorities = state["storage"], np.asarray(state["priorities"])
        if set(storage) != set(buf.schema):
            raise ValueError(f"state holds fields {sorted(storage)}, schema has {sorted(buf.schema)}")
        for name, field in buf.schema.items():
            arr = np.asarray(storage[name])
            if arr.shape != (size, *field.shape) or arr.dtype != field.dtype:
                raise ValueError(
                    f"field {name!r}: state holds {arr.dtype}{arr.shape}, "
                    f"expected {field.dtype}{(size, *field.shape)}"
                )
            buf.storage.write(0, {name: arr})
        if priorities.shape != (size,):
            raise ValueError(f"priorities: expected shape ({size},), got {priorities.shape}")
        leaves = np.zeros(buf.capacity, buf.tree.dtype)
        leaves[:size] = priorities
        buf.tree.load_leaves(leaves)
        buf.rng.bit_generator.state = state["rng_state"]
        buf._pos, buf._size = pos, size
        max_priority = state["max_priority"]
        if isinstance(max_priority, bool) or not isinstance(max_priority, (int, float, np.integer, np.floating)):
            raise TypeError(f"max_priority must be a number, got {type(max_priority).__name__}")
        if not (np.isfinite(max_priority) and max_priority > 0):
            raise ValueError(f"max_priority must be finite and > 0, got {max_priority!r}")
        buf._max_priority = float(max_priority)
        buf._new_priority()  # refuses a max priority whose alpha power the tree cannot hold
        return buf

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the buffer to ``path`` atomically (see :mod:`hetero_replay.checkpoint`).

        Holds the buffer's lock while writing: views, not copies, are saved, so
        a large buffer needs no second copy in memory.
        """
        with self._lock:
            state = self._state(copy=False)
            arrays = {f"storage/{n}": a for n, a in state.pop("storage").items()}
            arrays["priorities"] = state.pop("priorities")
            checkpoint.write(path, state, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str], tree: str = "auto", **placement: Any) -> "PrioritizedReplay":
        """Read a buffer written by :meth:`save`; a corrupt file raises ``ReplayFileError``.

        ``placement``: ``tree_device``, ``storage`` and ``device`` as in the constructor.
        """
        header, arrays = checkpoint.read(path)
        try:
            state = dict(header)
            state["storage"] = {n[len("storage/") :]: a for n, a in arrays.items() if n.startswith("storage/")}
            state["priorities"] = arrays["priorities"]
            return cls.from_state_dict(state, tree=tree, **placement)
        except (KeyError, TypeError, ValueError) as e:
            raise checkpoint.ReplayFileError(f"{path}: inconsistent replay file ({e})") from e
        except MemoryError as e:
            # read() checked the header against the format's bounds, but it may still
            # describe a buffer larger than this machine can allocate: refuse the file.
            raise checkpoint.ReplayFileError(
                f"{path}: describes a buffer of capacity {header['config']['capacity']}, "
                f"more than this machine can allocate ({e})"
            ) from e

    def __getstate__(self) -> dict[str, Any]:
        return {"state": self.state_dict(), "tree": self._tree_backend, "placement": self._placement}

    def __setstate__(self, d: dict[str, Any]) -> None:
        fresh = PrioritizedReplay.from_state_dict(d["state"], tree=d["tree"], **d.get("placement", {}))
        self._lock = threading.RLock()
        self._become(fresh)
        _LIVE.add(self)


# -- fork ------------------------------------------------------------------------------
# Every live buffer's lock is held across fork(): operations in flight on other
# threads finish first, and none starts, so the child copies consistent
# buffers. The child gets fresh locks (the parent's threads do not exist there).
_LIVE: "weakref.WeakSet[PrioritizedReplay]" = weakref.WeakSet()
_FORK_HELD: list[PrioritizedReplay] = []


def _before_fork() -> None:
    buffers = list(_LIVE)
    for buf in buffers:
        buf._lock.acquire()
    _FORK_HELD[:] = buffers


def _after_fork_in_parent() -> None:
    for buf in _FORK_HELD:
        buf._lock.release()
    _FORK_HELD.clear()


def _after_fork_in_child() -> None:
    for buf in _FORK_HELD:
        buf._lock = threading.RLock()
    _FORK_HELD.clear()


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


# -- argument checks ---------------------------------------------------------------------


def _real(name: str, value: Any) -> float:
    """``value`` as a finite float, or ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _check_seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"seed must be a non-negative integer or None, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {value}")
    return int(value)


def _check_beta(value: Any) -> float:
    beta = _real("beta", value)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {value!r}")
    return beta


def _check_alpha(value: Any) -> float:
    alpha = _real("alpha", value)
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {value!r}")
    return alpha


def _check_eps(value: Any) -> float:
    eps = _real("eps", value)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {value!r}")
    return eps


def _check_floor(alpha: float, eps: float, dtype: np.dtype) -> None:
    """Refuses ``(alpha, eps)`` whose smallest priority ``eps ** alpha`` rounds to 0 in ``dtype``:
    a transition with TD error 0 would then never be sampled again."""
    (floor,), _ = _native.td_priorities(np.zeros(1), alpha, eps, dtype)  # the trees' own arithmetic
    if eps > 0 and floor == 0:
        raise ValueError(
            f"eps ** alpha = {eps!r} ** {alpha!r} underflows to 0 in {dtype}: a transition whose TD error "
            f"is 0 could never be sampled again; raise eps or lower alpha"
        )
