"""Tianshou prioritized replay buffers whose priorities live in a hetero-replay sum tree.

:class:`HeteroPrioritizedReplayBuffer` and :class:`HeteroPrioritizedVectorReplayBuffer`
subclass Tianshou's ``PrioritizedReplayBuffer`` and ``PrioritizedVectorReplayBuffer``,
so ``Collector``, the trainers, every stock algorithm and ``isinstance`` checks treat
them as Tianshou's own. Transitions stay in Tianshou's ``Batch`` storage; only the
priorities move into a tree from :func:`hetero_replay.trees.make_tree` (the C++
K-ary tree by default). What changes compared with Tianshou's buffers:

* **Sampling** is stratified by default (one draw per equal slice of the priority
  mass) and uses the buffer's own seeded ``numpy.random.Generator``
  (``random_seed``), not the global ``np.random``.
* **IS weights** are ``(N P(i))^-beta`` normalised by their maximum over the whole
  buffer (from the tree's exact minimum), not by the batch maximum; Tianshou's
  ``weight_norm`` option does not exist here.
* **``set_beta``** reaches sampling, also on the vector buffer.
* **``add``** of the vector buffer is vectorised across environments: the
  sub-buffers' insertion and episode state lives in arrays (one entry per
  environment) that one set of NumPy operations updates, where Tianshou steps
  through the environments in Python; the new transitions' priorities are one
  tree call. No throw-away numba ``SegmentTree`` is built.
* **``update_weight``** (Tianshou's priority feedback) rejects NaN/inf TD errors and
  indices of empty slots with a clear error, changing nothing.
* **``reset``** clears the priorities, so cleared slots are never sampled.
* Tianshou calls some buffer methods on every step; here they give the same
  results without its Python loops: ``hasnull`` (after each collect) checks the
  stored rows in place instead of copying the whole buffer with IS weights,
  ``unfinished_index`` (each n-step return) skips the loop over sub-buffers, and
  rows are gathered straight from storage, one array at a time, when no frame
  stacking is involved.

Both survive ``pickle`` and ``save_hdf5``/``load_hdf5`` (the tree pickles, with
its device).

Placement: ``mapping=`` (a :class:`hetero_replay.mapping.Mapping`) puts the tree
where the mapping's ``sample``/``update`` primitives run, with its backend
(``Mapping(tree="torch")``: the torch tree on the CPU; ``sample`` and
``update`` on ``"cuda"``: the tree on the GPU). Only the priorities move: Tianshou keeps
transitions in its own NumPy ``Batch``, so the mapping's ``storage`` must be
``"host"``, and sampled indices and IS weights come back to the host, where
Tianshou indexes its storage. TD errors reach a device tree as the tensor the
algorithm left (no host round trip); checking that their indices hold stored
transitions reads those indices' priorities back (Tianshou's stored slots are
not a prefix of the tree). Put the learner on the mapping's device with
:class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper`'s ``mapping=``.

Example:
    >>> buf = HeteroPrioritizedVectorReplayBuffer(20_000, buffer_num=4, alpha=0.6, beta=0.4,
    ...                                           random_seed=0)
    >>> collector = Collector(algorithm, train_envs, buf)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pandas as pd
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

from hetero_replay.adapters.tianshou.episode_book import EpisodeBook, SubBuffer, add_rows, storable
from hetero_replay.mapping import HOST, Mapping
from hetero_replay.replay import DEFAULT_EPS
from hetero_replay.trees import SumTree, make_tree


#: The keys ``ReplayBuffer.__getitem__`` always returns (filled with empty Batches if not stored).
_ROW_KEYS = frozenset(ReplayBuffer._reserved_keys)

#: ReplayBuffer options these buffers pass on to Tianshou's storage.
_STORAGE_OPTIONS = ("stack_num", "ignore_obs_next", "save_only_last_obs")


def _check_storage_options(kwargs: dict[str, Any]) -> None:
    """Reject options Tianshou would silently swallow (its ``**kwargs`` ignores typos)."""
    if "weight_norm" in kwargs:
        raise TypeError(
            "weight_norm is not supported: IS weights are always normalised by their maximum "
            "over the whole buffer (Tianshou's weight_norm=True divides by the batch maximum)"
        )
    if kwargs.get("sample_avail", False):
        raise ValueError(
            "sample_avail=True is not supported: prioritized sampling draws from every stored "
            "transition (Tianshou's PrioritizedReplayBuffer ignores it as well)"
        )
    unknown = sorted(set(kwargs) - set(_STORAGE_OPTIONS) - {"sample_avail"})
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}; storage options are {_STORAGE_OPTIONS}")


class _TreePriorities:
    """The priority half of both buffers: a sum tree, alpha/beta/eps and the max priority.

    Placed first in the bases so it replaces Tianshou's ``SegmentTree`` methods
    (``init_weight``, ``sample_indices``, ``get_weight``, ``update_weight``,
    ``__getitem__``, ``set_beta``) for both the single and the vector buffer.
    ``PrioritizedReplayBuffer.add``/``update`` call :meth:`init_weight` once with
    all new indices, so priorities of a multi-env ``add`` are one tree call.
    """

    priority_tree: SumTree
    mapping: Mapping | None
    _alpha: float
    _beta: float
    _eps: float
    _stratified: bool
    _rng: np.random.Generator
    _max_prio: float

    def _init_priorities(
        self,
        capacity: int,
        alpha: float,
        beta: float,
        eps: float,
        backend: str,
        fanout: int,
        stratified: bool,
        random_seed: int | None,
        mapping: Mapping | None,
    ) -> None:
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be finite and > 0 (so no stored transition has priority 0), got {eps}")
        tree_device = None
        if mapping is not None:
            mapping = _checked_mapping(mapping, backend)
            placement = mapping.replay_kwargs()
            backend, tree_device = placement["tree"], placement["tree_device"]
        self.mapping = mapping
        self.priority_tree = make_tree(backend, capacity, fanout, device=tree_device)
        if not np.power(self.priority_tree.dtype.type(eps), self.priority_tree.dtype.type(alpha)) > 0:
            raise ValueError(f"eps ** alpha = {eps} ** {alpha} underflows to 0; stored transitions need a positive priority")
        self._alpha, self._eps = float(alpha), float(eps)
        self._beta = _check_beta(beta)
        self._stratified = bool(stratified)
        self._rng = np.random.default_rng(random_seed)
        self._max_prio = 1.0  # largest |TD error| + eps so far; new transitions get its alpha power

    # -- hyper-parameters ----------------------------------------------------------

    @property
    def alpha(self) -> float:
        """Priority exponent: transition i is sampled with probability p_i^alpha / sum p^alpha."""
        return self._alpha

    @property
    def beta(self) -> float:
        """Current IS-weight exponent (change it with :meth:`set_beta`)."""
        return self._beta

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` fed back so far (1 at the start)."""
        return self._max_prio

    def set_beta(self, beta: float) -> None:
        """Set the IS-weight exponent used by every following ``sample``; ``ValueError`` outside [0, 1]."""
        self._beta = _check_beta(beta)

    # -- Tianshou's PrioritizedReplayBuffer interface --------------------------------

    def init_weight(self, index: int | np.ndarray) -> None:
        """Give new transitions the largest priority seen so far (one tree call for all)."""
        idx = np.atleast_1d(np.asarray(index, dtype=np.int64))
        value = self._max_prio**self._alpha
        self.priority_tree.update(idx, np.full(len(idx), value, self.priority_tree.dtype))

    def sample_indices(self, batch_size: int | None) -> np.ndarray:
        """Indices drawn by priority; ``0``/``None`` keep Tianshou's "all indices" meaning."""
        if batch_size is not None and batch_size > 0 and len(self) > 0:  # type: ignore[arg-type]
            return self._draw(batch_size)[0]
        return super().sample_indices(batch_size)  # type: ignore[misc]

    def sample(self, batch_size: int | None) -> tuple[PrioBatchProtocol, np.ndarray]:
        """Draw ``batch_size`` transitions by priority; ``batch.weight`` holds their IS weights."""
        if batch_size is None or batch_size <= 0 or len(self) == 0:  # type: ignore[arg-type]
            return super().sample(batch_size)  # type: ignore[misc]
        indices, weights = self._draw(batch_size)
        batch = self._rows(indices)
        batch.__dict__["weight"] = weights  # a float32 array: nothing for Batch to parse
        return cast(PrioBatchProtocol, batch), indices

    def get_weight(self, index: int | np.ndarray) -> np.ndarray:
        """IS weights ``(p_min / p_i) ** beta`` of stored transitions (p = priority^alpha)."""
        leaves = self.priority_tree.get(np.atleast_1d(np.asarray(index, dtype=np.int64)))
        # Same float64 ratio -> float32 power as the tree's own ``sample`` (an empty slot: inf).
        ratio = (self.priority_tree.min() / leaves.astype(np.float64)).astype(np.float32)
        return np.power(ratio, np.float32(self._beta))

    def update_weight(self, index: np.ndarray, new_weight: np.ndarray | torch.Tensor) -> None:
        """Set priorities from TD errors: ``p = (|td| + eps) ** alpha``.

        ``new_weight`` is what Tianshou's algorithms leave in ``batch.weight``: the
        (signed) TD errors of the sampled batch; a device tree (torch, CUDA)
        takes a tensor of them where it is. A NaN or infinite TD error raises
        ``ValueError``, an index of an empty slot ``IndexError``; nothing changes then.
        """
        td: np.ndarray | torch.Tensor
        if isinstance(new_weight, torch.Tensor) and hasattr(self.priority_tree, "sample_tensors"):
            td = new_weight.detach().reshape(-1).abs()  # a device tree takes the tensor where it is
        else:
            if isinstance(new_weight, torch.Tensor):
                new_weight = new_weight.detach().cpu().numpy()
            td = np.abs(np.asarray(new_weight, dtype=np.float64)).ravel()
        idx = np.asarray(index)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"index must be a 1-D integer array, got {idx.dtype}{idx.shape}")
        idx = idx.astype(np.int64, copy=False)
        self._check_stored(idx)
        max_raw = self.priority_tree.update_td(idx, td, self._alpha, self._eps)
        self._max_prio = max(self._max_prio, max_raw)

    def __getitem__(self, index: IndexType) -> PrioBatchProtocol:
        """``self[index]`` with ``weight`` = IS weights under the current beta."""
        if isinstance(index, slice):  # as Tianshou: buffer[:] is every stored transition
            stored = len(self)  # type: ignore[arg-type]
            indices = self.sample_indices(0) if index == slice(None) else self._indices[:stored][index]  # type: ignore[attr-defined]
        else:
            indices = index
        batch = self._rows(indices)
        weights = self.get_weight(indices)
        batch.__dict__["weight"] = np.asarray(weights[0]) if np.ndim(indices) == 0 else weights  # buf[i]: 0-d, as Tianshou
        return cast(PrioBatchProtocol, batch)

    # -- the rest of the buffer --------------------------------------------------------

    def reset(self, keep_statistics: bool = False) -> None:
        """Clear all data, as Tianshou's ``reset``, and all priorities with it."""
        super().reset(keep_statistics=keep_statistics)  # type: ignore[misc]
        self.priority_tree.load_leaves(np.zeros(self.priority_tree.capacity, self.priority_tree.dtype))
        self._max_prio = 1.0

    def hasnull(self) -> bool:
        """Whether a stored transition holds a NaN or None (Tianshou's check after each collect).

        Same answer as Tianshou's ``self[:].hasnull()``, computed with NumPy on views
        of the stored rows of each array, where Tianshou copies the whole buffer
        into a new ``Batch`` (with IS weights) on every call.
        """
        starts, stops = self._stored_bounds()
        ranges = [(int(a), int(b)) for a, b in zip(starts, stops) if b > a]
        return any(_has_null(arr, ranges) for arr in _leaf_arrays(self._meta))  # type: ignore[attr-defined]

    # -- internals -----------------------------------------------------------------------

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

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        return self.priority_tree.sample(int(batch_size), self._rng, self._beta, self._stratified)

    def _stored_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, stops)``: global index range ``[start, stop)`` of each sub-buffer's stored rows."""
        raise NotImplementedError

    def _check_stored(self, idx: np.ndarray) -> None:
        """``IndexError`` naming the first index that is not a stored transition.

        Stored transitions are exactly the leaves with a positive priority: slots
        never written (or cleared by ``reset``) hold 0, and a stored one holds at
        least ``eps ** alpha``, which the constructor checks is positive.
        """
        bad = np.flatnonzero(self.priority_tree.get(idx) <= 0)  # the tree raises for idx outside [0, size)
        if bad.size:
            i = int(bad[0])
            raise IndexError(f"index at position {i} is {int(idx[i])}, which holds no stored transition")


def _leaf_arrays(batch: Batch) -> Iterator[Any]:
    """Every array in a (nested) ``Batch``."""
    for value in batch.values():
        if isinstance(value, Batch):
            yield from _leaf_arrays(value)
        else:
            yield value


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


def _has_null(arr: Any, ranges: list[tuple[int, int]]) -> bool:
    """Whether ``arr[start:stop]`` holds a NaN/None for some range (``pandas.isnull`` semantics)."""
    if isinstance(arr, torch.Tensor):
        return arr.is_floating_point() and any(bool(torch.isnan(arr[a:b]).any()) for a, b in ranges)
    arr = np.asarray(arr)
    if arr.dtype.kind in "biu":  # integers and booleans cannot hold NaN
        return False
    if arr.dtype.kind in "fc":
        return any(bool(np.isnan(arr[a:b]).any()) for a, b in ranges)
    return any(bool(pd.isnull(arr[a:b]).any()) for a, b in ranges)  # objects: None, NaN, NaT


class HeteroPrioritizedReplayBuffer(_TreePriorities, PrioritizedReplayBuffer):
    """Tianshou's ``PrioritizedReplayBuffer`` with priorities in a hetero-replay sum tree.

    For a single environment; use :class:`HeteroPrioritizedVectorReplayBuffer` with a
    vectorised env (``Collector`` requires it for more than one env).

    Args:
        size: transitions kept; the oldest is overwritten first.
        alpha: priority exponent (0 samples uniformly).
        beta: initial IS-weight exponent in [0, 1]; anneal it with :meth:`set_beta`
            or :class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper`.
        eps: added to every ``|TD error|``; it floors the smallest priority, which sets
            the global IS-weight normalisation. The default is this package's 1e-6,
            not Tianshou's float32 epsilon (1.2e-7): with that, one near-zero TD error
            in a full buffer shrank the mean IS weight to ~1e-3 and slowed DQN's
            learning on CartPole (docs/design-notes.md, "eps").
        backend: sum-tree backend, ``"auto"`` or a name from
            :func:`hetero_replay.trees.backends` (``"native"``, ``"numpy"``, ...).
        fanout: children per tree node (a power of two, 2..64; 16 = one cache line).
        stratified: one draw per equal slice of the priority mass; ``False`` for i.i.d.
        random_seed: seeds the ``numpy.random.Generator`` that draws samples (and
            Tianshou's own ``RandomState``); the same seed and calls give the same samples.
        mapping: a :class:`hetero_replay.mapping.Mapping` placing the tree (its
            backend and device; see the module docstring); ``backend`` must then
            stay ``"auto"`` and the mapping's ``storage`` be ``"host"``.
        **kwargs: Tianshou storage options ``stack_num``, ``ignore_obs_next``,
            ``save_only_last_obs``.

    Raises:
        ValueError: a bad ``size``, ``alpha``, ``beta`` or ``eps``, or a mapping
            that contradicts ``backend`` or stores transitions off the host.
        TypeError: ``mapping`` is not a :class:`~hetero_replay.mapping.Mapping`.
        hetero_replay.mapping.DeviceUnavailableError: the mapping names a
            device this machine lacks.
    """

    def __init__(
        self,
        size: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        *,
        eps: float = DEFAULT_EPS,
        backend: str = "auto",
        fanout: int = 16,
        stratified: bool = True,
        random_seed: int | None = 42,
        mapping: Mapping | None = None,
        **kwargs: Any,
    ) -> None:
        _check_storage_options(kwargs)
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        # Not PrioritizedReplayBuffer.__init__: it builds (and JIT-compiles) a numba
        # SegmentTree that the tree below replaces.
        ReplayBuffer.__init__(self, int(size), random_seed=_legacy_seed(random_seed), **kwargs)
        self._init_priorities(int(size), alpha, beta, eps, backend, fanout, stratified, random_seed, mapping)

    def _stored_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(1, np.int64), np.array([len(self)], np.int64)


class HeteroPrioritizedVectorReplayBuffer(_TreePriorities, PrioritizedVectorReplayBuffer):
    """Tianshou's ``PrioritizedVectorReplayBuffer`` with priorities in a hetero-replay sum tree.

    ``buffer_num`` sub-buffers of ``ceil(total_size / buffer_num)`` transitions each,
    one per environment, laid out contiguously (global index = offset + local index),
    with one tree over all of them.

    Args:
        total_size: transitions kept over all sub-buffers.
        buffer_num: number of sub-buffers; at least the number of environments.
        alpha, beta, eps, backend, fanout, stratified, random_seed, mapping, **kwargs: as in
            :class:`HeteroPrioritizedReplayBuffer`.
    """

    def __init__(
        self,
        total_size: int,
        buffer_num: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        *,
        eps: float = DEFAULT_EPS,
        backend: str = "auto",
        fanout: int = 16,
        stratified: bool = True,
        random_seed: int | None = 42,
        mapping: Mapping | None = None,
        **kwargs: Any,
    ) -> None:
        _check_storage_options(kwargs)
        if not isinstance(buffer_num, (int, np.integer)) or buffer_num < 1:
            raise ValueError(f"buffer_num must be a positive integer, got {buffer_num!r}")
        if not isinstance(total_size, (int, np.integer)) or total_size < buffer_num:
            raise ValueError(f"total_size must be an integer >= buffer_num={buffer_num}, got {total_size!r}")
        size = math.ceil(total_size / buffer_num)
        # Non-prioritized children: the manager keeps one tree for all of them, so
        # Tianshou's per-child SegmentTrees (built, then deleted) are never made.
        # Their insertion and episode state lives in one book, for a vectorised add.
        book = EpisodeBook(buffer_num, size)
        children = [SubBuffer(size, book, env, random_seed=_legacy_seed(random_seed), **kwargs) for env in range(buffer_num)]
        ReplayBufferManager.__init__(self, children)  # type: ignore[arg-type]
        self._book = book
        self._random_state = np.random.RandomState(_legacy_seed(random_seed))
        self._init_priorities(self.maxsize, alpha, beta, eps, backend, fanout, stratified, random_seed, mapping)

    def _stored_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._offset, self._offset + self._lengths

    def add(
        self, batch: RolloutBatchProtocol, buffer_ids: np.ndarray | list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Store one transition per environment in sub-buffers ``buffer_ids`` (default: all, in order).

        Tianshou's ``add``, vectorised across environments
        (:mod:`~hetero_replay.adapters.tianshou.episode_book`); the new transitions
        get the largest priority so far.

        Returns:
            ``(indices, episode_returns, episode_lengths, episode_start_indices)``,
            as Tianshou's: the global indices written and, for each environment
            whose episode this step finished, its return and length (0 otherwise).

        Raises:
            ValueError: ``buffer_ids`` and the batch differ in length, or the
                batch lacks a key Tianshou requires.
            IndexError: a buffer id outside ``[0, buffer_num)``.
        """
        ids = np.arange(self.buffer_num) if buffer_ids is None else np.asarray(buffer_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TypeError(f"buffer_ids must be a 1-D sequence of integers, got {ids.dtype}{ids.shape}")
        rows = storable(self, batch)
        if len(ids) != len(rows.done):
            raise ValueError(f"{len(ids)} buffer ids for a batch of {len(rows.done)} transitions")
        listed = ids.tolist()  # a few environments: Python's min/max/set beat NumPy's call overhead
        if listed and (min(listed) < 0 or max(listed) >= self.buffer_num):
            raise IndexError(f"buffer ids must lie in [0, {self.buffer_num}), got {listed}")
        if len(set(listed)) != len(listed):  # one env twice in a step: Tianshou's sequential add
            return super().add(batch, ids)
        ptr, ep_return, ep_len, ep_start = add_rows(self, rows, ids)
        self.init_weight(ptr)
        return ptr, ep_return, ep_len, ep_start

    def unfinished_index(self) -> np.ndarray:
        """Last stored index of each sub-buffer whose episode is still running.

        Tianshou's answer without its loop over sub-buffers: n-step returns ask for
        it on every update. ``last_index`` holds each sub-buffer's last insertion.
        """
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


def _checked_mapping(mapping: Any, backend: str) -> Mapping:
    """``mapping``, checked against this machine and against what a Tianshou buffer can honour."""
    if not isinstance(mapping, Mapping):
        raise TypeError(f"mapping must be a hetero_replay.mapping.Mapping, got {type(mapping).__name__}")
    if backend != "auto":
        raise ValueError(
            f"backend={backend!r} and the mapping both choose the tree backend; "
            f"set it in the mapping instead (Mapping(tree={backend!r}, ...))"
        )
    if mapping.storage != HOST:
        raise ValueError(
            f"Tianshou keeps transitions in its own NumPy Batch on the host, so the mapping's storage must be "
            f"'host', got {mapping.storage!r}; only the priorities (the tree) can move"
        )
    return mapping.checked()


def _check_beta(value: float) -> float:
    if not (isinstance(value, (int, float, np.floating, np.integer)) and 0.0 <= value <= 1.0):
        raise ValueError(f"beta must be a number in [0, 1], got {value!r}")
    return float(value)


def _legacy_seed(seed: int | None) -> int:
    """A 32-bit seed for Tianshou's ``RandomState``, derived from ``seed`` (fresh entropy for ``None``)."""
    return int(np.random.SeedSequence(seed).generate_state(1)[0])
