"""Tianshou prioritized replay buffers whose priorities live in a hetero-replay sum tree.

:class:`HeteroPrioritizedReplayBuffer` and :class:`HeteroPrioritizedVectorReplayBuffer`
subclass Tianshou's ``PrioritizedReplayBuffer`` and ``PrioritizedVectorReplayBuffer``,
so ``Collector``, the trainers, every stock algorithm and ``isinstance`` checks treat
them as Tianshou's own. Transitions stay in Tianshou's ``Batch`` storage; only the
priorities move, into the core's :class:`hetero_replay.Priorities` (the PER rules,
over a sum tree: the C++ K-ary tree by default), so nothing about PER is
re-implemented here. What changes compared with Tianshou's buffers:

* **Sampling** is stratified by default (one draw per equal slice of the priority
  mass) and uses the buffer's own seeded ``numpy.random.Generator``
  (``random_seed``), not the global ``np.random``.
* **IS weights** are ``(N P(i))^-beta`` normalised by their maximum over the whole
  buffer (from the tree's exact minimum) by default, so they mean the same from
  batch to batch; ``weight_norm=True`` divides them by the batch maximum instead,
  as Tianshou's default does (its Rainbow example relies on it).
* **``weight``** is a view of the priorities ``p_i ** alpha`` indexed like
  Tianshou's ``SegmentTree`` (``buf.weight[i]``), not a second tree.
* **``set_beta``** reaches sampling, also on the vector buffer.
* **``add``** of the vector buffer is vectorised across environments: the
  sub-buffers' insertion and episode state lives in arrays (one entry per
  environment) that one set of NumPy operations updates, where Tianshou steps
  through the environments in Python; the new transitions' priorities are one
  tree call. No throw-away numba ``SegmentTree`` is built.
* **A refused call changes nothing.** ``add`` checks every value against the
  storage (:mod:`~hetero_replay.adapters.tianshou.staging`) before it writes a
  row or moves a counter, where Tianshou's leaves a slot holding fields of two
  transitions; bad TD errors, batch sizes, indices and hyper-parameters raise
  ``TypeError``/``ValueError``/``IndexError`` naming the argument, what was
  expected and what was received.
* **``reset``** clears the priorities, so cleared slots are never sampled.
* **Thread safety**: every public operation holds the buffer's re-entrant lock
  (:attr:`~_TreePriorities.lock`); see the class docstrings.
* Tianshou calls some buffer methods on every step; here they give the same
  results without its Python loops: ``hasnull`` (after each collect) checks the
  rows stored since the previous call instead of copying the whole buffer with IS
  weights (:mod:`~hetero_replay.adapters.tianshou.null_rows`),
  ``unfinished_index`` (each n-step return) skips the loop over sub-buffers, and
  rows are gathered straight from storage, one array at a time, when no frame
  stacking is involved.

Both survive ``pickle``, ``copy.deepcopy`` and ``save_hdf5``/``load_hdf5`` (the
tree pickles, with its device; the lock does not: a copy gets a fresh one).

Crash recovery: with ``durable_path=`` a buffer writes a *durable point*, its
complete state (rows, episode counters, priorities, max priority, beta,
generator states), atomically to that file every ``flush_every`` added
transitions or ``flush_seconds`` seconds, whichever comes first, and
``reopen(path)`` rebuilds the buffer of the last durable point after the
learner died, even by ``kill -9`` (the storage layer's one scheme,
:mod:`hetero_replay.storage.durable`; the buffer's own layout in
:mod:`~hetero_replay.adapters.tianshou.layout`; docs/storage-tianshou.md). Each point writes the whole buffer: meant for
buffers that fit in RAM.

Placement: ``placement=`` (a :class:`hetero_replay.placement.Placement`) puts the tree
where the placement's ``sample``/``update`` primitives run, with its backend
(``Placement(tree="torch")``: the torch tree on the CPU; ``sample`` and
``update`` on ``"cuda"``: the tree on the GPU). Only the priorities move: Tianshou keeps
transitions in its own NumPy ``Batch``, so the placement's ``storage`` must be
``"host"``, and sampled indices and IS weights come back to the host, where
Tianshou indexes its storage. TD errors reach a device tree as the tensor the
algorithm left (no host round trip); checking that their indices hold stored
transitions reads those indices' priorities back (Tianshou's stored slots are
not a prefix of the tree). Put the learner on the placement's device with
:class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper`'s ``placement=``.

Example:
    >>> buf = HeteroPrioritizedVectorReplayBuffer(20_000, buffer_num=4, alpha=0.6, beta=0.4,
    ...                                           random_seed=0)
    >>> collector = Collector(algorithm, train_envs, buf)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self, cast

import h5py
import numpy as np
import torch
from tianshou.data import (
    Batch,
    PrioritizedReplayBuffer,
    PrioritizedVectorReplayBuffer,
    ReplayBuffer,
    ReplayBufferManager,
)
from tianshou.data.batch import IndexType
from tianshou.data.types import PrioBatchProtocol, RolloutBatchProtocol
from tianshou.data.utils.converter import to_hdf5

from hetero_replay import UNSET, PEROptions, Placement, Priorities, RateLimiter, ReplayFileError, SumTree
from hetero_replay.adapters.tianshou import layout
from hetero_replay.adapters.tianshou.episode_book import EpisodeBook, SubBuffer, add_rows, storable
from hetero_replay.adapters.tianshou.null_rows import NullRows
from hetero_replay.adapters.tianshou.staging import Staged, commit, stage
from hetero_replay.extend import (
    HOST,
    MAX_BATCH,
    OUTER,
    DurableFile,
    FlushSchedule,
    ForkSafeLock,
    Normalise,
    check_bool,
    check_int,
    check_path,
    check_seed,
    close_when_gone,
    holding,
    is_device_tree,
    td_magnitudes,
)

#: The keys ``ReplayBuffer.__getitem__`` always returns (filled with empty Batches if not stored).
_ROW_KEYS = frozenset(ReplayBuffer._reserved_keys)

#: ReplayBuffer options these buffers pass on to Tianshou's storage.
_STORAGE_OPTIONS = ("stack_num", "ignore_obs_next", "save_only_last_obs")

# -- locks ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _holding(*buffers: Any) -> Iterator[None]:
    """Hold the locks of those ``buffers`` that have one, in the order a fork takes them (no deadlock)."""
    with holding(*(b._lock for b in buffers if isinstance(b, _TreePriorities))):
        yield


# -- argument checks ------------------------------------------------------------------------


def _check_arguments(
    options: PEROptions | None, per: dict[str, Any], weight_norm: Any, random_seed: Any, kwargs: dict[str, Any]
) -> PEROptions:
    """Check the constructor arguments both buffers share, before anything is built; returns the PER options.

    ``per`` are the PER keyword arguments by :class:`~hetero_replay.PEROptions`
    field (``UNSET`` where not given), merged into ``options`` and checked
    there; ``kwargs`` the Tianshou storage options, which Tianshou's
    ``**kwargs`` would swallow unchecked (typos included).
    """
    merged = PEROptions.of(options, **per)
    if merged.eps <= 0:  # the one rule of our own: stored transitions are the slots with a positive priority
        raise ValueError(f"eps must be > 0 (so no stored transition has priority 0), got {merged.eps!r}")
    check_bool(weight_norm, "weight_norm")
    check_seed(random_seed, "random_seed")
    unknown = sorted(set(kwargs) - set(_STORAGE_OPTIONS) - {"sample_avail"})
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}; storage options are {_STORAGE_OPTIONS}")
    check_int(kwargs.get("stack_num", 1), "stack_num", low=1)
    for name in ("ignore_obs_next", "save_only_last_obs", "sample_avail"):
        check_bool(kwargs.get(name, False), name)
    if kwargs.get("sample_avail", False):
        raise ValueError(
            "sample_avail=True is not supported: prioritized sampling draws from every stored "
            "transition (Tianshou's PrioritizedReplayBuffer ignores it as well)"
        )
    return merged


def _checked_limiter(rate_limiter: Any) -> RateLimiter | None:
    """``rate_limiter=``: a :class:`~hetero_replay.RateLimiter` or ``None`` (``TypeError`` otherwise)."""
    if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
        raise TypeError(f"rate_limiter must be a hetero_replay.RateLimiter, got {type(rate_limiter).__name__}")
    return rate_limiter


def _drawn_count(batch_size: Any) -> int:
    """How many transitions a ``sample`` call draws by priority: ``batch_size``, checked once here,
    or 0 where Tianshou's own meaning applies (``None``, 0, a negative size)."""
    if batch_size is None:
        return 0
    return max(check_int(batch_size, "batch_size", high=MAX_BATCH), 0)


def _td_magnitudes(td_errors: Any) -> np.ndarray:
    """``|td_errors|`` as a flat float array (:func:`~hetero_replay.extend.td_magnitudes`); ``TypeError``
    unless they are real numbers."""
    errors = np.asarray(td_errors)
    if errors.dtype.kind not in "iuf":  # bools, text, objects, complex numbers
        raise TypeError(f"new_weight (TD errors) must be real numbers, got {errors.dtype} values")
    return td_magnitudes(errors)


def _as_indices(index: Any, name: str = "index") -> np.ndarray:
    """``index`` as int64 buffer indices; ``TypeError`` for anything but integers (a boolean mask included)."""
    idx = np.asarray(index)
    if idx.dtype.kind == "b":
        raise TypeError(f"{name} must be integer indices, got a boolean mask (pass np.flatnonzero(mask))")
    if idx.size and idx.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer indices, got {idx.dtype} values")
    return idx.astype(np.int64, copy=False)


class PriorityWeights:
    """``buffer.weight``: the priorities ``p_i ** alpha``, indexed like Tianshou's ``SegmentTree``.

    Tianshou's ``PrioritizedReplayBuffer.weight`` is its segment tree of
    priorities, and Tianshou's tests and user code read ``buf.weight[i]``. This
    view reads and writes the same values in the buffer's sum tree, under the
    buffer's lock: ``weight[i]`` gives a float, ``weight[indices]`` a float64
    array; ``weight[indices] = values`` sets priorities (already raised to
    alpha) of stored transitions directly, where ``update_weight`` sets them
    from TD errors; ``reduce(start, end)`` sums them; ``len`` is the capacity.
    """

    def __init__(self, buffer: _TreePriorities) -> None:
        self._buffer = buffer

    def __len__(self) -> int:
        return self._buffer.priority_tree.capacity

    def __getitem__(self, index: Any) -> float | np.ndarray:
        """Priorities at ``index`` (``IndexError`` outside ``[0, capacity)``; empty slots hold 0)."""
        idx = _as_indices(index)
        with self._buffer.lock:
            values = self._buffer.priority_tree.get(idx.reshape(-1)).astype(np.float64)
        return float(values[0]) if idx.ndim == 0 else values.reshape(idx.shape)

    def __setitem__(self, index: Any, value: Any) -> None:
        """Set priorities of stored transitions; nothing changes if any index or value is refused.

        Raises:
            TypeError: non-integer indices, or values that are not real numbers.
            IndexError: an index that holds no stored transition.
            ValueError: a value that is not positive and finite in the tree's
                dtype (a stored transition needs a positive priority), or more
                values than indices.
        """
        idx = _as_indices(index).reshape(-1)
        values = np.asarray(value)
        if values.dtype.kind not in "iuf":
            raise TypeError(f"weight values must be real numbers, got {values.dtype} values")
        tree = self._buffer.priority_tree
        with np.errstate(over="ignore"):  # a value too large for the tree's dtype becomes inf, refused below
            values = values.astype(tree.dtype)
        if values.size not in (1, idx.size):
            raise ValueError(f"{values.size} weight values for {idx.size} indices")
        if not np.all(np.isfinite(values) & (values > 0)):
            raise ValueError(f"weight values must be positive and finite as {tree.dtype}, got {value!r}")
        with self._buffer.lock:
            self._buffer.priorities.check_filled(idx)
            tree.update(idx, np.broadcast_to(values.reshape(-1), idx.shape).copy())

    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """Sum of the priorities in ``[start, end)`` (Python slice bounds; all by default)."""
        with self._buffer.lock:
            if start == 0 and end is None:
                return self._buffer.priority_tree.total()
            leaves = self._buffer.priority_tree.leaves()
        return float(leaves[start:end].astype(np.float64).sum())


class _TreePriorities:
    """The priority half of both buffers: the core's :class:`~hetero_replay.Priorities`, a generator, the lock.

    Placed first in the bases so it replaces Tianshou's ``SegmentTree`` methods
    (``init_weight``, ``sample_indices``, ``get_weight``, ``update_weight``,
    ``__getitem__``, ``set_beta``) for both the single and the vector buffer,
    and wraps the inherited public methods in the buffer's lock. The PER rules
    (priorities from TD errors, the max priority, IS weights, beta's range) are
    the core's; what stays here is Tianshou's side: its batch sizes, which
    slots hold stored transitions, the ``weight`` view, the lock.
    """

    priorities: Priorities
    placement: Placement | None
    _weight_norm: bool
    #: Tianshou's record of the constructor's options (``ReplayBuffer.__init__`` sets it).
    options: dict[str, Any]
    _rng: np.random.Generator
    _lock: ForkSafeLock
    #: Where and when durable points are written; ``None``: never (also for pickled and deep copies).
    _durable: DurableFile | None = None
    #: What ``add`` and ``sample`` ask first (``rate_limiter=``); ``None``: nothing.
    _limiter: RateLimiter | None = None
    #: The kind of buffer a durable file records ("single" or "vector"), so each class reopens only its own.
    _DURABLE_KIND: str

    def _init_priorities(
        self,
        capacity: int,
        options: PEROptions,
        weight_norm: bool,
        random_seed: int | None,
        placement: Placement | None,
        rate_limiter: RateLimiter | None,
    ) -> None:
        """Build the priorities from arguments :func:`_check_arguments` accepted, where ``placement`` puts the tree."""
        self._limiter = rate_limiter
        tree_device = None
        if placement is not None:
            placement = _checked_placement(placement, options.tree)
            replay_kwargs = placement.replay_kwargs()
            options, tree_device = options.replace(tree=replay_kwargs["tree"]), replay_kwargs["tree_device"]
        self.placement = placement
        self.priorities = Priorities(capacity, options, tree_device)
        self._weight_norm = bool(weight_norm)
        self._rng = np.random.default_rng(random_seed)
        self._lock = ForkSafeLock(OUTER)
        self._nulls = NullRows(capacity)
        self.options.update(alpha=options.alpha, beta=options.beta)  # as Tianshou's buffers record them

    # -- hyper-parameters and views ---------------------------------------------------------

    @property
    def alpha(self) -> float:
        """Priority exponent: transition i is sampled with probability p_i^alpha / sum p^alpha."""
        return self.priorities.alpha

    @property
    def beta(self) -> float:
        """Current IS-weight exponent (change it with :meth:`set_beta`)."""
        return self.priorities.beta

    @property
    def eps(self) -> float:
        """Added to every ``|TD error|``; ``eps ** alpha`` is the smallest priority of a stored transition."""
        return self.priorities.eps

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` fed back so far (1 at the start)."""
        return self.priorities.max_priority

    @property
    def priority_tree(self) -> SumTree:
        """The sum tree of priorities ``p_i ** alpha`` (read it; change priorities through the buffer)."""
        return self.priorities.tree

    # Tianshou's PrioritizedReplayBuffer.__init__ sets these attributes, and its tests and user code
    # read them: here they are read-only views of the same values in the priorities.

    @property
    def _alpha(self) -> float:
        """Tianshou's name for :attr:`alpha`."""
        return self.priorities.alpha

    @property
    def _beta(self) -> float:
        """Tianshou's name for :attr:`beta`."""
        return self.priorities.beta

    @property
    def _PrioritizedReplayBuffer__eps(self) -> float:
        """Tianshou's ``__eps`` (private, hence name-mangled): :attr:`eps`."""
        return self.priorities.eps

    @property
    def _max_prio(self) -> float:
        """Tianshou's name for :attr:`max_priority`."""
        return self.priorities.max_priority

    @property
    def _min_prio(self) -> float:
        """The smallest priority ``p ** alpha`` of a stored transition (1 while none is stored).

        What IS weights are normalised by, so Tianshou's formula
        ``(weight[i] / _min_prio) ** -beta`` gives :meth:`get_weight`.
        """
        with self._lock:
            smallest = self.priorities.tree.min()
        return smallest if math.isfinite(smallest) else 1.0

    @property
    def weight(self) -> PriorityWeights:
        """The priorities ``p_i ** alpha``, indexed like Tianshou's ``SegmentTree`` (``buf.weight[i]``)."""
        return PriorityWeights(self)

    @property
    def lock(self) -> ForkSafeLock:
        """The buffer's re-entrant lock, held by every public method; hold it to make several calls atomic.

        Holding it while calling into another of these buffers can deadlock a
        concurrent ``fork``, which takes all their locks in their creation order.
        """
        return self._lock

    def set_beta(self, beta: float) -> None:
        """Set the IS-weight exponent used by every following ``sample``.

        Raises ``TypeError`` unless ``beta`` is a real number, ``ValueError`` outside [0, 1].
        """
        with self._lock:
            self.priorities.beta = beta

    # -- durable points ---------------------------------------------------------------------

    @property
    def durable_path(self) -> Path | None:
        """The file durable points go to (``durable_path=``, or the file ``reopen`` read); ``None`` without."""
        return None if self._durable is None else self._durable.path

    def flush(self) -> None:
        """Write a durable point now: the whole buffer, atomically, to :attr:`durable_path`.

        The schedule starts again from here (``flush_every`` adds or
        ``flush_seconds`` seconds until the next one). Holds the lock while
        writing, so other threads' calls wait for the disk.

        Raises:
            RuntimeError: the buffer has no ``durable_path`` (pickled and deep
                copies have none: they would overwrite the original's file).
            TypeError: the storage holds values a durable point cannot (see ``durable_path=``).
            OSError: the file cannot be written; the previous durable point stays intact.
        """
        with self._lock:
            if self._durable is None:
                raise RuntimeError(
                    f"this {type(self).__name__} has no durable_path; build it with durable_path=... "
                    "(a pickled or deep copy of a durable buffer has none)"
                )
            self._write_durable_point()

    def close(self) -> None:
        """Write a last durable point (with ``durable_path``) and stop writing them; closing twice does nothing.

        A durable buffer not closed is closed the same way when it is garbage
        collected or the interpreter exits normally (in the process that built
        it, not in forked children): only a crash loses the transitions added
        since the last durable point. The buffer stays usable in memory.
        """
        with self._lock:
            if self._durable is None:
                return
            try:
                self._write_durable_point()
            finally:
                self._durable = None

    @classmethod
    def reopen(cls, path: str | os.PathLike[str], **overrides: Any) -> Self:
        """The buffer of the last durable point in ``path``, which goes on writing durable points there.

        Equal to the buffer that wrote that point: the same stored rows at the
        same indices, priorities, max priority, beta, ``len``, insertion and
        episode state, and generator states, so it samples what that buffer
        would have sampled next. Its options (size, PER options, ``weight_norm``,
        storage options, ``flush_every``/``flush_seconds``) are the file's.
        Temporaries left by a write that was killed are removed first.

        Args:
            path: a file written through ``durable_path=`` by this class.
            **overrides: ``backend`` or ``placement`` (where the tree lives now; a
                placement is not recorded, so a buffer placed by one is reopened on
                the default tree unless it is given again), ``flush_every``,
                ``flush_seconds``, ``rate_limiter`` (it continues the file's
                counters): as in the constructor.

        Raises:
            hetero_replay.ReplayFileError: ``path`` is damaged,
                truncated, inconsistent, of another format, or holds the other
                buffer class (the message names the path).
            OSError: ``path`` cannot be opened (``FileNotFoundError`` if missing).
            TypeError: ``path`` is not a ``str``/``os.PathLike``, an unknown
                override, or an override of the wrong type.
            ValueError: an override out of range.
        """
        unknown = sorted(set(overrides) - set(layout.OVERRIDES))
        if unknown:
            raise TypeError(f"reopen() takes the overrides {list(layout.OVERRIDES)}, got {unknown}")
        limiter = _checked_limiter(overrides.get("rate_limiter"))
        path = check_path(path, "path")
        image = layout.decode(path, cls._DURABLE_KIND)
        schedule = FlushSchedule.reopened(image.header, overrides.get("flush_every"), overrides.get("flush_seconds"))
        options = image.options
        if "backend" in overrides:
            options = options.replace(tree=overrides["backend"])
        elif overrides.get("placement") is not None:
            options = options.replace(tree="auto")  # the placement chooses the backend
        try:
            buffer = cls._rebuild(image, options, overrides.get("placement"))
            buffer._limiter = limiter  # restore continues the file's counters
        except MemoryError as e:
            raise ReplayFileError(f"{path}: a buffer of {image.maxsize} transitions does not fit here ({e})") from e
        try:
            layout.restore(buffer, image)
        except (TypeError, ValueError, IndexError) as e:
            raise ReplayFileError(f"{path}: inconsistent durable Tianshou buffer ({e})") from e
        buffer._durable = DurableFile(path, schedule)
        close_when_gone(buffer, _durable_open)
        return buffer

    @classmethod
    def _rebuild(cls, image: layout.DurableImage, options: PEROptions, placement: Placement | None) -> Self:
        """A new, empty buffer with ``image``'s size and options, ``restore`` fills it."""
        raise NotImplementedError

    def _start_durable(self, durable: DurableFile | None) -> None:
        """Take the checked ``durable`` file; the first durable point (the empty buffer) claims its path at once.

        Writing it now also makes an unwritable path fail here, not at an ``add`` hours later.
        """
        self._durable = durable
        if durable is not None:
            with self._lock:
                self._write_durable_point()
            close_when_gone(self, _durable_open)

    def _check_durable_rows(self, staged: Staged) -> None:
        """Before an add writes: refuse new storage keys a durable point could not hold (changing nothing)."""
        if self._durable is not None and staged.grows:
            layout.check_storable(staged.rows)

    def _added(self, rows: np.ndarray) -> None:
        """Note the transitions just stored at ``rows``; write a durable point if one is due. Hold the lock.

        A failing write raises from the ``add`` whose transitions are already
        stored; the count is kept, so the next ``add`` tries again.
        """
        self._nulls.wrote(rows)
        if self._durable is not None and self._durable.schedule.count(len(rows)):
            self._write_durable_point()

    def _write_durable_point(self) -> None:
        """Write the whole buffer to the durable file; the schedule starts again. Hold the lock."""
        durable = cast(DurableFile, self._durable)
        durable.write(*layout.encode(self, self._DURABLE_KIND))

    # -- Tianshou's PrioritizedReplayBuffer interface ---------------------------------------

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The :class:`hetero_replay.RateLimiter` that ``add`` and ``sample`` ask first, or ``None``."""
        return self._limiter

    def _rate_limited(self, side: str, n: int) -> contextlib.AbstractContextManager[None]:
        """Wait for the rate limiter before taking the lock (:meth:`RateLimiter.admitted`); nothing without one."""
        return contextlib.nullcontext() if self._limiter is None or n <= 0 else self._limiter.admitted(side, n)

    def init_weight(self, index: int | np.ndarray) -> None:
        """Give transitions at ``index`` the largest priority seen so far (one tree call for all)."""
        idx = np.atleast_1d(_as_indices(index))
        with self._lock:
            self.priorities.assign_new(idx)

    def sample_indices(self, batch_size: int | None) -> np.ndarray:
        """``batch_size`` indices drawn by priority.

        Tianshou's meanings of the other sizes stay: ``0`` gives every stored
        index, a negative size none, and ``None`` what Tianshou's own buffer
        gives (every stored index for the vector buffer, ``len(self)`` uniform
        draws for the single one).

        Raises:
            TypeError: ``batch_size`` is neither an integer nor ``None`` (a bool is not an integer).
            ValueError: a positive ``batch_size`` and an empty buffer.
        """
        n = _drawn_count(batch_size)
        with self._rate_limited("sample", n), self._lock:
            if n:
                return self._draw(n)[0]
            return super().sample_indices(batch_size)  # type: ignore[misc]

    def sample(self, batch_size: int | None) -> tuple[PrioBatchProtocol, np.ndarray]:
        """Draw ``batch_size`` transitions by priority; ``batch.weight`` holds their IS weights.

        Other sizes as :meth:`sample_indices`; errors as there.
        """
        n = _drawn_count(batch_size)
        with self._rate_limited("sample", n), self._lock:
            if not n:
                return super().sample(batch_size)  # type: ignore[misc]
            indices, weights = self._draw(n, self._normalise)
            batch = self._rows(indices)
        batch.__dict__["weight"] = weights  # a float32 array: nothing for Batch to parse
        return batch, indices

    def get_weight(self, index: int | np.ndarray) -> np.ndarray:
        """IS weights ``(p_min / p_i) ** beta`` of stored transitions (p = priority^alpha), as a 1-D array.

        Raises:
            TypeError: non-integer indices.
            IndexError: an index that holds no stored transition.
        """
        with self._lock:
            return self._weights(index, "global")

    def update_weight(self, index: np.ndarray, new_weight: np.ndarray | torch.Tensor) -> None:
        """Set priorities from TD errors: ``p = (|td| + eps) ** alpha``.

        ``new_weight`` is what Tianshou's algorithms leave in ``batch.weight``: the
        (signed) TD errors of the sampled batch; a device tree (torch, CUDA)
        takes a tensor of them where it is. Nothing changes when a call is refused.

        Raises:
            TypeError: ``index`` is not a 1-D integer array, or the TD errors are
                not real numbers (booleans, text, objects, complex numbers).
            ValueError: a NaN or infinite TD error (naming its position), or a
                number of TD errors other than the number of indices.
            IndexError: an index that holds no stored transition.
        """
        with self._lock:  # torch's conversions too: the exit handler waits for this lock (torch aborts at exit)
            idx, td = self._update_inputs(index, new_weight)
            self.priorities.update(idx, td, filled_only=True)

    # -- late updates (PEROffPolicyWrapper with staleness >= 1) ---------------------------

    def track_writes(self) -> int:
        """Record from now on which slots each add rewrites; returns the current :attr:`write_epoch`."""
        with self._lock:
            self.priorities.track_writes()
            return self.priorities.write_epoch

    @property
    def write_epoch(self) -> int:
        """Writes so far since :meth:`track_writes`: a batch sampled now carries this epoch."""
        return self.priorities.write_epoch

    def update_weight_since(self, index: np.ndarray, new_weight: np.ndarray | torch.Tensor, epoch: int) -> int:
        """:meth:`update_weight` for a batch sampled at write ``epoch``; entries whose slot was
        rewritten since are skipped. Returns how many were skipped. Errors as :meth:`update_weight`,
        except that a position in an error message counts the entries not skipped."""
        with self._lock:
            idx, td = self._update_inputs(index, new_weight)
            return self.priorities.update_since(idx, td, epoch, filled_only=True)[0]

    def __getitem__(self, index: IndexType) -> PrioBatchProtocol:
        """``self[index]`` with ``weight`` = IS weights under the current beta (see ``weight_norm``).

        Raises:
            TypeError: non-integer indices (a boolean mask included).
            IndexError: an index that holds no stored transition.
        """
        with self._lock:
            if isinstance(index, slice):  # as Tianshou: buffer[:] is every stored transition
                stored = len(self)  # type: ignore[arg-type]
                indices = self.sample_indices(0) if index == slice(None) else self._indices[:stored][index]  # type: ignore[attr-defined]
            else:
                indices = index
            weights = self._weights(indices, self._normalise)  # checks the indices before any row is read
            batch = self._rows(indices)
        batch.__dict__["weight"] = (
            np.asarray(weights[0]) if np.ndim(indices) == 0 else weights
        )  # buf[i]: 0-d, as Tianshou
        return batch

    # -- the rest of the buffer, under the lock ---------------------------------------------

    def reset(self, keep_statistics: bool = False) -> None:
        """Clear all data, as Tianshou's ``reset``, and all priorities with it."""
        with self._lock:
            super().reset(keep_statistics=keep_statistics)  # type: ignore[misc]
            self._nulls.forget()
            tree = self.priorities.tree
            self.priorities.load(np.zeros(tree.capacity, tree.dtype), max_priority=1.0)

    def hasnull(self) -> bool:
        """Whether a stored transition holds a NaN or None (Tianshou's check after each collect).

        Tianshou's ``self[:].hasnull()`` copies the whole buffer into a new
        ``Batch`` on every call. This checks only the rows stored since the last
        call (:class:`~hetero_replay.adapters.tianshou.null_rows.NullRows`), and
        every stored row after ``reset``, ``set_batch`` or unpickling. Values
        written into the storage other than through the buffer's methods (into
        ``_meta``, or through one sub-buffer of a vector buffer) are not seen.
        """
        with self._lock:
            starts, stops = self._stored_bounds()
            stored = [(int(a), int(b)) for a, b in zip(starts, stops) if b > a]
            return self._nulls.any(self._meta, stored)  # type: ignore[attr-defined]

    def prev(self, index: int | np.ndarray) -> np.ndarray:
        """Tianshou's ``prev`` (the previous transition of each index's episode), under the lock."""
        with self._lock:
            return super().prev(index)  # type: ignore[misc]

    def next(self, index: int | np.ndarray) -> np.ndarray:
        """Tianshou's ``next`` (the next transition of each index's episode), under the lock."""
        with self._lock:
            return super().next(index)  # type: ignore[misc]

    def unfinished_index(self) -> np.ndarray:
        """Tianshou's ``unfinished_index`` (last index of each running episode), under the lock."""
        with self._lock:
            return super().unfinished_index()  # type: ignore[misc]

    def get(
        self, index: int | list[int] | np.ndarray, key: str, default_value: Any = None, stack_num: int | None = None
    ) -> Any:
        """Tianshou's ``get`` (one key, frame-stacked), under the lock."""
        with self._lock:
            return super().get(index, key, default_value, stack_num)  # type: ignore[misc]

    def set_batch(self, batch: RolloutBatchProtocol) -> None:
        """Tianshou's ``set_batch`` (replace the storage), under the lock; priorities stay as they are."""
        with self._lock:
            super().set_batch(batch)  # type: ignore[misc]
            self._nulls.forget()

    def save_hdf5(self, path: str, compression: str | None = None) -> None:
        """Tianshou's ``save_hdf5``: a consistent file (written under the lock), without the lock."""
        with self._lock, h5py.File(path, "w") as f:
            to_hdf5(self._state(), f, compression=compression)

    def __getstate__(self) -> dict[str, Any]:
        """A copy of the state taken under the lock, so pickling (which runs after) sees one consistent buffer."""
        with self._lock:
            return copy.deepcopy(self._state())

    def __deepcopy__(self, memo: dict[int, Any]) -> _TreePriorities:
        with self._lock:
            clone = type(self).__new__(type(self))
            memo[id(self)] = clone
            clone.__setstate__(copy.deepcopy(self._state(), memo))
        return clone

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "priorities" not in state:
            raise ValueError(
                f"cannot restore this {type(self).__name__}: it was saved by an older hetero-replay "
                "(its priorities in 'priority_tree'); rebuild the buffer"
            )
        super().__setstate__(state)  # type: ignore[misc]
        self._lock = ForkSafeLock(OUTER)
        self._nulls = NullRows(self.maxsize)  # type: ignore[attr-defined]
        self._durable = None  # a copy writing to the original's durable file would overwrite its points

    # -- internals ---------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        """The attributes that make up the buffer: all but the lock (neither picklable nor shareable),
        the durable schedule (a copy must not write to the original's file) and what ``hasnull`` has seen
        (a copy checks its rows afresh)."""
        return {key: value for key, value in self.__dict__.items() if key not in ("_lock", "_durable", "_nulls")}

    @property
    def _normalise(self) -> Normalise:
        """How IS weights are normalised: by the batch maximum with ``weight_norm`` (Tianshou's), else globally."""
        return "batch" if self._weight_norm else "global"

    def _weights(self, index: Any, normalise: Normalise) -> np.ndarray:
        """IS weights of the stored transitions at ``index`` (a 1-D array), indices checked first. Hold the lock."""
        idx = np.atleast_1d(_as_indices(index))
        self.priorities.check_filled(idx)
        return self.priorities.weights(idx, normalise=normalise)

    def _rows(self, indices: Any) -> PrioBatchProtocol:
        """``ReplayBuffer.__getitem__(indices)``: the stored rows, as Tianshou returns them.

        In the usual layout (no frame stacking, ``obs_next`` stored, every key
        Tianshou returns present in storage) that is exactly ``_meta[indices]``,
        taken by :func:`_take_rows`, which skips Tianshou's per-key gets and
        ``Batch`` re-parsing; DQN, DDPG, TD3 and SAC index the buffer twice per update.
        """
        meta = self._meta  # type: ignore[attr-defined]
        if self.stack_num == 1 and self._save_obs_next and _ROW_KEYS.issubset(meta.get_keys()):  # type: ignore[attr-defined]
            return cast(PrioBatchProtocol, _take_rows(meta, indices))
        return super(PrioritizedReplayBuffer, self).__getitem__(indices)  # type: ignore[misc]

    def _draw(self, batch_size: int, normalise: Normalise = "global") -> tuple[np.ndarray, np.ndarray]:
        """``(indices, IS weights)`` of ``batch_size`` (checked: ``_drawn_count``) transitions drawn by priority.

        Hold the lock.

        Through :meth:`~hetero_replay.Priorities.draw`: a buffer holding a
        transition holds a positive priority (``eps > 0``), so the core's check
        for a positive total, a sync on a device tree, is not needed.
        """
        if len(self) == 0:  # type: ignore[arg-type]
            raise ValueError(f"cannot sample {batch_size} transitions from an empty buffer; add transitions first")
        return self.priorities.draw(batch_size, self._rng, self.priorities.beta, normalise)

    def _stored_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, stops)``: global index range ``[start, stop)`` of each sub-buffer's stored rows."""
        raise NotImplementedError

    def _update_inputs(self, index: Any, new_weight: Any) -> tuple[np.ndarray, np.ndarray | torch.Tensor]:
        """``(indices, |TD errors|)`` as the priorities take them, from what Tianshou's algorithms pass.

        ``index`` must be 1-D integers; the (signed) TD errors real numbers,
        as a float array, or as the tensor where it lives for a device tree.
        Stored transitions are the slots with a positive priority (``eps > 0``
        is checked at construction), hence ``filled_only`` where these go.
        """
        td: np.ndarray | torch.Tensor
        if isinstance(new_weight, torch.Tensor):
            if new_weight.dtype == torch.bool or new_weight.is_complex():
                raise TypeError(f"new_weight (TD errors) must be real numbers, got a {new_weight.dtype} tensor")
            if is_device_tree(self.priority_tree):
                td = new_weight.detach().reshape(-1).abs()  # a device tree takes the tensor where it is
            else:
                td = _td_magnitudes(new_weight.numpy(force=True))  # detached, on the host: one torch call
        else:
            td = _td_magnitudes(new_weight)
        idx = _as_indices(index)
        if idx.ndim != 1:
            raise TypeError(f"index must be a 1-D integer array, got shape {idx.shape}")
        return idx, td


def _take_rows(batch: Batch, index: Any) -> Batch:
    """``batch[index]`` for a ``Batch`` of arrays (and nested such ``Batch``es), without its overhead.

    ``Batch.__getitem__`` runs ``isinstance`` checks against ``Batch``, whose
    metaclass is ``typing.Protocol``'s (several µs per key); exact type tests
    make the same gather a plain loop of array indexing, with Tianshou's rules
    for ``None`` and empty ``Batch``es. Any other value (a distribution, a
    subclass) sends the whole gather through Tianshou's own indexing.
    """
    out = Batch()
    rows = out.__dict__
    for key, value in batch.__dict__.items():
        kind = type(value)
        if kind is np.ndarray or kind is torch.Tensor:
            rows[key] = value[index]
        elif kind is Batch:
            rows[key] = _take_rows(value, index) if value.__dict__ else Batch()
        elif value is None:
            rows[key] = None
        else:
            return batch[index]
    return out


def _durable_open(state: dict[str, Any]) -> bool:
    return state.get("_durable") is not None


# The ignore: _TreePriorities.weight deliberately replaces Tianshou's SegmentTree with a PriorityWeights view,
# and _alpha, _beta, _max_prio, _min_prio its attributes with read-only views of the priorities.
class HeteroPrioritizedReplayBuffer(_TreePriorities, PrioritizedReplayBuffer):  # type: ignore[misc,override]
    """Tianshou's ``PrioritizedReplayBuffer`` with priorities in a hetero-replay sum tree.

    For a single environment; use :class:`HeteroPrioritizedVectorReplayBuffer` with a
    vectorised env (``Collector`` requires it for more than one env).

    Args:
        size: transitions kept; the oldest is overwritten first.
        alpha, beta, eps, backend, fanout, stratified: the PER options, documented
            (with their defaults) once in :class:`hetero_replay.PEROptions`, where
            ``backend`` is called ``tree``. Here ``eps`` must be > 0 (stored
            transitions are the slots with a positive priority); its default is
            not Tianshou's float32 epsilon (1.2e-7), with which one near-zero TD
            error in a full buffer shrank the mean IS weight to ~1e-3 and slowed
            DQN's learning on CartPole (docs/design-notes.md, "eps"). ``beta`` is
            the starting value: anneal it with :meth:`set_beta` or
            :class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper`.
        options: a ready :class:`hetero_replay.PEROptions` (the way to set
            ``priority_dtype``); the keyword arguments above, where given, override its fields.
        weight_norm: how IS weights ``(N P(i))^-beta`` are normalised. ``False``
            (the default): by their maximum over the whole buffer, ``(p_min / p_i) ** beta``,
            so a weight means the same in every batch (Schaul et al.'s definition).
            ``True``: by the maximum within each batch (each ``sample`` and
            ``self[indices]``), as Tianshou's ``weight_norm=True`` (its default,
            used by its Rainbow example): the batch's largest weight is always 1.
        random_seed: seeds the ``numpy.random.Generator`` that draws samples (and
            Tianshou's own ``RandomState``); the same seed and calls give the same samples.
        placement: a :class:`hetero_replay.placement.Placement` placing the tree (its
            backend and device; see the module docstring); ``backend`` must then
            stay ``"auto"`` and the placement's ``storage`` be ``"host"``.
        durable_path: a file for durable points (see *Crash recovery* below);
            ``None`` (the default): none are written. It must not exist yet: a
            buffer never replaces a run's file (continue that run with
            :meth:`reopen`). The first point, of the empty buffer, is written at once.
        flush_every: with ``durable_path``, a durable point is written once this
            many transitions were added since the last one.
        flush_seconds: ... or, at the first ``add`` after this many seconds since
            the last one, whichever comes first.
        rate_limiter: a :class:`hetero_replay.RateLimiter`: ``add`` (one
            transition per environment) waits while the collectors are ahead of
            its samples-per-insert ratio, ``sample`` / ``sample_indices`` of a
            positive size while the learner is (or fewer than ``min_size`` were
            added); either raises :class:`hetero_replay.RateLimited` after its
            ``timeout``. For collectors and a learner in separate threads: in
            one thread a wait can only end in ``RateLimited``. Its counters go
            into durable points and copies (``reopen(rate_limiter=...)`` continues them).
        **kwargs: Tianshou storage options ``stack_num``, ``ignore_obs_next``,
            ``save_only_last_obs``.

    Raises:
        TypeError: an argument of the wrong type (the PER options as
            :class:`~hetero_replay.PEROptions` says; ``weight_norm`` a bool,
            ``size``, ``random_seed`` and ``flush_every`` integers,
            ``flush_seconds`` a real number, ``durable_path`` a ``str`` or
            ``os.PathLike``), an unknown keyword argument, or a ``placement``
            that is not a :class:`~hetero_replay.placement.Placement`.
        ValueError: a value out of range (``size`` < 1, the PER options as
            :class:`~hetero_replay.PEROptions` says, ``eps`` = 0,
            ``flush_every`` < 1, ``flush_seconds`` not finite and > 0, ...), a
            ``durable_path`` that exists or lies in no existing folder, or a
            placement that contradicts ``backend`` or stores transitions off the host.
        OSError: the first durable point cannot be written to ``durable_path``.
        hetero_replay.placement.DeviceUnavailableError: the placement names a
            device this machine lacks.

    Crash recovery: with ``durable_path``, every ``add`` (and ``update``) checks
    whether ``flush_every`` transitions or ``flush_seconds`` seconds have
    passed since the last durable point; if so it writes the whole buffer (its
    rows, episode counters, priorities, max priority, beta and generator states)
    to that file before returning, atomically: a temporary in the same folder,
    fsync, rename, fsync of the folder, so the file always holds one complete
    durable point, whenever the process dies (``kill -9`` and power loss
    included). :meth:`flush` writes one now. After a crash, :meth:`reopen`
    gives the buffer of the last durable point, which writes on to the same file.
    Loss window: what happened after the last durable point, so at most the
    last ``flush_every`` added transitions or ``flush_seconds`` seconds of adds,
    whichever is fewer (plus the priority updates since that point); an idle
    buffer writes nothing, and loses nothing, until its next ``add``. The cost:
    each point writes every stored transition (with the buffer's lock held), so
    durable points are meant for buffers that fit in RAM, with ``flush_every``
    large against the buffer's size; the core engine's disk tier stores bigger
    buffers incrementally. Durable storage holds NumPy arrays of numbers and
    booleans (and Batches of them) only: an ``add`` whose new keys hold
    objects, text or tensors raises ``TypeError`` and changes nothing. One
    buffer per file: pickled and deep copies write no durable points.

    Thread safety: every public operation (``add``, ``update``, ``sample``,
    ``sample_indices``, ``update_weight``, ``init_weight``, ``get_weight``,
    ``self[index]``, ``weight[...]``, ``reset``, ``set_beta``, ``prev``/``next``,
    ``unfinished_index``, ``hasnull``, ``get``, ``set_batch``, ``save_hdf5``,
    ``flush``, pickling and ``copy.deepcopy``) holds the buffer's re-entrant :attr:`lock`,
    so calls from several threads take effect one at a time: no row is lost or
    torn (a sampled row never mixes fields of two transitions), and a slot
    counts as stored only once it is written. ``len`` reads a counter without
    the lock. Hold ``with buf.lock:`` to make several calls one atomic step, or
    to read the storage arrays directly (``buf.rew``, ``buf.obs`` are live
    views). A ``fork`` (``os.fork``, ``multiprocessing``, ``SubprocVectorEnv``)
    waits until no other thread is inside a call on any of these buffers, so the
    child copies consistent buffers, each with a fresh lock. Pickling and
    ``deepcopy`` copy the buffer under the lock first (one extra copy in memory
    while pickling); ``save_hdf5`` writes under the lock.
    """

    _DURABLE_KIND = "single"

    def __init__(
        self,
        size: int,
        alpha: float = UNSET,
        beta: float = UNSET,
        *,
        eps: float = UNSET,
        backend: str = UNSET,
        fanout: int = UNSET,
        stratified: bool = UNSET,
        options: PEROptions | None = None,
        weight_norm: bool = False,
        random_seed: int | None = 42,
        placement: Placement | None = None,
        durable_path: str | os.PathLike[str] | None = None,
        flush_every: int = 10_000,
        flush_seconds: float = 60.0,
        rate_limiter: RateLimiter | None = None,
        **kwargs: Any,
    ) -> None:
        size = check_int(size, "size", low=1)
        per = dict(alpha=alpha, beta=beta, eps=eps, tree=backend, fanout=fanout, stratified=stratified)
        options = _check_arguments(options, per, weight_norm, random_seed, kwargs)
        _checked_limiter(rate_limiter)
        durable = DurableFile.new(durable_path, flush_every, flush_seconds)
        # Not PrioritizedReplayBuffer.__init__: it builds (and JIT-compiles) a numba
        # SegmentTree that the priorities below replace.
        ReplayBuffer.__init__(self, size, random_seed=_legacy_seed(random_seed), **kwargs)
        self._init_priorities(size, options, weight_norm, random_seed, placement, rate_limiter)
        self._start_durable(durable)

    @classmethod
    def _rebuild(cls, image: layout.DurableImage, options: PEROptions, placement: Placement | None) -> Self:
        # random_seed=None: the file's generator states replace the fresh ones
        return cls(
            image.maxsize,
            options=options,
            weight_norm=image.weight_norm,
            random_seed=None,
            placement=placement,
            **image.storage_options,
        )

    def _stored_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(1, np.int64), np.array([len(self)], np.int64)

    def add(
        self, batch: RolloutBatchProtocol, buffer_ids: np.ndarray | list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Store one transition, as Tianshou's ``add``; it gets the largest priority so far.

        ``batch`` is one transition, or a batch of one with ``buffer_ids=[0]``
        (how ``Collector`` adds). Every value is checked against the storage
        before anything is written, so a refused add changes nothing.

        Returns:
            ``([index], [episode_return], [episode_length], [episode_start_index])``,
            as Tianshou's (return and length 0 while the episode runs).

        Raises:
            ValueError: ``buffer_ids`` is not ``[0]``, the batch lacks a key
                Tianshou requires, or a value has a shape other than the stored one.
            TypeError: a value the storage cannot hold unchanged (text for
                numbers, fractional actions into integer storage, ...).
        """
        stacked = buffer_ids is not None
        if buffer_ids is not None and (
            np.shape(buffer_ids) != (1,) or np.asarray(buffer_ids).dtype.kind not in "iu" or buffer_ids[0] != 0
        ):
            raise ValueError(f"a single buffer takes buffer_ids=[0] (or None), got {buffer_ids!r}")
        rows = storable(self, batch, stacked)
        with self._rate_limited("insert", 1), self._lock:
            staged = stage(self._meta, rows, 1, stacked)
            self._check_durable_rows(staged)
            priority = self.priorities.new_priority()  # checked before anything is written
            rew, done = staged.rows.rew[0], staged.rows.done[0]  # as stored: float rewards, bool flags
            ptr, ep_return, ep_len, ep_start = (np.array([x]) for x in self._update_state_pre_add(rew, done))
            commit(self, ptr, staged)
            self.priorities.assign_new(ptr, priority)
            self._added(ptr)
        return ptr, ep_return, ep_len, ep_start

    def update(self, buffer: ReplayBuffer) -> np.ndarray:
        """Copy ``buffer``'s stored transitions in (Tianshou's ``update``); they get the largest priority so far.

        All or nothing: rows the storage cannot hold raise before anything is
        written. Holds both buffers' locks where ``buffer`` is one of ours.

        Returns:
            The indices written (empty if ``buffer`` is empty).

        Raises:
            TypeError: ``buffer`` is not a Tianshou ``ReplayBuffer``, or holds values this storage cannot hold.
            ValueError: ``buffer``'s rows have other shapes than this storage's.
        """
        if not isinstance(buffer, ReplayBuffer):
            raise TypeError(f"buffer must be a Tianshou ReplayBuffer, got {type(buffer).__name__}")
        with _holding(self, buffer):
            stack_num, buffer.stack_num = buffer.stack_num, 1  # as Tianshou: every stored index, frames unstacked
            try:
                source = buffer.sample_indices(0) if len(buffer) else np.array([], int)
            finally:
                buffer.stack_num = stack_num
            if len(source) == 0:
                return np.array([], int)
            staged = stage(self._meta, buffer._meta[source], len(source))
            self._check_durable_rows(staged)
            priority = self.priorities.new_priority()
            ptr = (self._insertion_idx + np.arange(len(source))) % self.maxsize
            commit(self, ptr, staged)
            self.last_index[0] = ptr[-1]
            self._insertion_idx = int(ptr[-1] + 1) % self.maxsize
            self._size = min(self._size + len(source), self.maxsize)
            self.priorities.assign_new(ptr, priority)
            self._added(ptr)
        return ptr


# The ignore: _TreePriorities.weight deliberately replaces Tianshou's SegmentTree with a PriorityWeights view,
# and _alpha, _beta, _max_prio, _min_prio its attributes with read-only views of the priorities.
class HeteroPrioritizedVectorReplayBuffer(_TreePriorities, PrioritizedVectorReplayBuffer):  # type: ignore[misc,override]
    """Tianshou's ``PrioritizedVectorReplayBuffer`` with priorities in a hetero-replay sum tree.

    ``buffer_num`` sub-buffers of ``ceil(total_size / buffer_num)`` transitions each,
    one per environment, laid out contiguously (global index = offset + local index),
    with one tree over all of them.

    Args:
        total_size: transitions kept over all sub-buffers.
        buffer_num: number of sub-buffers; at least the number of environments.
        alpha, beta, eps, backend, fanout, stratified, options, weight_norm, random_seed, placement:
            as in :class:`HeteroPrioritizedReplayBuffer`.
        durable_path, flush_every, flush_seconds: durable points, as in
            :class:`HeteroPrioritizedReplayBuffer` (*Crash recovery*); a
            durable point holds every sub-buffer's rows and insertion and
            episode state. ``flush_every`` counts transitions: a step of
            ``buffer_num`` environments adds ``buffer_num``.
        rate_limiter: as in :class:`HeteroPrioritizedReplayBuffer` (a step of ``buffer_num``
            environments inserts ``buffer_num``).
        **kwargs: Tianshou storage options, as in :class:`HeteroPrioritizedReplayBuffer`.

    Raises:
        TypeError, ValueError, OSError: as :class:`HeteroPrioritizedReplayBuffer`; also for
            ``total_size`` and ``buffer_num`` (integers, ``total_size >= buffer_num >= 1``).

    Crash recovery and its loss window: as :class:`HeteroPrioritizedReplayBuffer`;
    :meth:`reopen` gives the vector buffer of the last durable point.

    Thread safety: as :class:`HeteroPrioritizedReplayBuffer`: every public
    operation holds the buffer's re-entrant :attr:`lock` (one lock for all
    sub-buffers), so concurrent calls lose and tear no rows; hold it to make
    several calls atomic; a fork waits for it and gives the child a fresh one.
    """

    _DURABLE_KIND = "vector"

    def __init__(
        self,
        total_size: int,
        buffer_num: int,
        alpha: float = UNSET,
        beta: float = UNSET,
        *,
        eps: float = UNSET,
        backend: str = UNSET,
        fanout: int = UNSET,
        stratified: bool = UNSET,
        options: PEROptions | None = None,
        weight_norm: bool = False,
        random_seed: int | None = 42,
        placement: Placement | None = None,
        durable_path: str | os.PathLike[str] | None = None,
        flush_every: int = 10_000,
        flush_seconds: float = 60.0,
        rate_limiter: RateLimiter | None = None,
        **kwargs: Any,
    ) -> None:
        buffer_num = check_int(buffer_num, "buffer_num", low=1)
        if check_int(total_size, "total_size", low=1) < buffer_num:
            raise ValueError(f"total_size must be >= buffer_num={buffer_num}, got {total_size!r}")
        per = dict(alpha=alpha, beta=beta, eps=eps, tree=backend, fanout=fanout, stratified=stratified)
        options = _check_arguments(options, per, weight_norm, random_seed, kwargs)
        _checked_limiter(rate_limiter)
        durable = DurableFile.new(durable_path, flush_every, flush_seconds)
        size = math.ceil(total_size / buffer_num)
        # Non-prioritized children: the manager keeps one tree for all of them, so
        # Tianshou's per-child SegmentTrees (built, then deleted) are never made.
        # Their insertion and episode state lives in one book, for a vectorised add.
        book = EpisodeBook(buffer_num, size)
        children = [
            SubBuffer(size, book, env, random_seed=_legacy_seed(random_seed), **kwargs) for env in range(buffer_num)
        ]
        ReplayBufferManager.__init__(self, children)  # type: ignore[arg-type]
        self._book = book
        self._random_state = np.random.RandomState(_legacy_seed(random_seed))
        self._init_priorities(self.maxsize, options, weight_norm, random_seed, placement, rate_limiter)
        self._start_durable(durable)

    @classmethod
    def _rebuild(cls, image: layout.DurableImage, options: PEROptions, placement: Placement | None) -> Self:
        # maxsize is a multiple of buffer_num, so the sub-buffers get the file's size;
        # random_seed=None: the file's generator states replace the fresh ones
        return cls(
            image.maxsize,
            image.buffer_num,
            options=options,
            weight_norm=image.weight_norm,
            random_seed=None,
            placement=placement,
            **image.storage_options,
        )

    def _stored_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._offset, self._offset + self._lengths

    def add(
        self, batch: RolloutBatchProtocol, buffer_ids: np.ndarray | list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Store one transition per environment in sub-buffers ``buffer_ids`` (default: all, in order).

        Tianshou's ``add``, vectorised across environments
        (:mod:`~hetero_replay.adapters.tianshou.episode_book`); the new transitions
        get the largest priority so far. Every value is checked against the
        storage before anything is written, so a refused add changes nothing.

        Returns:
            ``(indices, episode_returns, episode_lengths, episode_start_indices)``,
            as Tianshou's: the global indices written and, for each environment
            whose episode this step finished, its return and length (0 otherwise).

        Raises:
            ValueError: ``buffer_ids`` and the batch differ in length, the batch
                lacks a key Tianshou requires, or a value's shape is not
                ``(len(buffer_ids), *stored shape)``.
            TypeError: ``buffer_ids`` are not integers, or a value the storage
                cannot hold unchanged (text for numbers, fractional actions into
                integer storage, an array where a ``Batch`` is stored, ...).
            IndexError: a buffer id outside ``[0, buffer_num)``.
        """
        ids = np.arange(self.buffer_num) if buffer_ids is None else np.asarray(buffer_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TypeError(f"buffer_ids must be a 1-D sequence of integers, got {ids.dtype}{ids.shape}")
        rows = storable(self, batch)
        if np.shape(rows.done) != ids.shape:
            raise ValueError(
                f"{len(ids)} buffer ids for a batch of shape {np.shape(rows.done)} (terminated, truncated)"
            )
        listed = ids.tolist()  # a few environments: Python's min/max/set beat NumPy's call overhead
        if listed and (min(listed) < 0 or max(listed) >= self.buffer_num):
            raise IndexError(f"buffer ids must lie in [0, {self.buffer_num}), got {listed}")
        with self._rate_limited("insert", len(ids)), self._lock:
            staged = stage(self._meta, rows, len(ids))
            self._check_durable_rows(staged)
            if len(set(listed)) != len(listed):  # one env twice in a step: Tianshou's sequential add,
                result = super().add(batch, ids)  # which cannot fail half-way on rows that staged
            else:
                priority = self.priorities.new_priority()  # checked before anything is written
                ptr, ep_return, ep_len, ep_start = add_rows(self, staged, ids)
                self.priorities.assign_new(ptr, priority)
                result = ptr, ep_return, ep_len, ep_start
            self._added(result[0])
        return result

    def unfinished_index(self) -> np.ndarray:
        """Last stored index of each sub-buffer whose episode is still running.

        Tianshou's answer without its loop over sub-buffers: n-step returns ask for
        it on every update. ``last_index`` holds each sub-buffer's last insertion.
        """
        with self._lock:
            last = self.last_index[self._lengths > 0]
            return last[~self.done[last]]

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # The children's storage are views into the manager's; pickle and HDF5 store
        # them as separate copies, so re-link them (Tianshou's own manager does not),
        # and likewise their shared episode book.
        if self._meta.get_keys():
            self._set_batch_for_children()
        for child in self.buffers:
            child._book = self._book


def _checked_placement(placement: Any, backend: str) -> Placement:
    """``placement``, checked against this machine and against what a Tianshou buffer can honour."""
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be a hetero_replay.placement.Placement, got {type(placement).__name__}")
    if backend != "auto":
        raise ValueError(
            f"backend={backend!r} and the placement both choose the tree backend; "
            f"set it in the placement instead (Placement(tree={backend!r}, ...))"
        )
    if placement.storage != HOST:
        raise ValueError(
            f"Tianshou keeps transitions in its own NumPy Batch on the host, so the placement's storage must be "
            f"'host', got {placement.storage!r}; only the priorities (the tree) can move"
        )
    return placement.checked()


def _legacy_seed(seed: int | None) -> int:
    """A 32-bit seed for Tianshou's ``RandomState``, derived from ``seed`` (fresh entropy for ``None``)."""
    return int(np.random.SeedSequence(seed).generate_state(1)[0])
