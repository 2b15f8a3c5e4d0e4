"""The PER rules, once: :class:`Priorities` over a sum tree.

Prioritized experience replay (Schaul et al., 2016) draws transition ``i``
with probability ``P(i) = p_i^alpha / sum_k p_k^alpha``, where
``p_i = |TD error_i| + eps``, and corrects the bias with importance-sampling
weights ``w_i = (N P(i))^-beta / max_j w_j``. Here the maximum is taken over
the whole buffer (from the tree's exact minimum), not over the batch, so a
weight means the same thing from batch to batch; ``normalise="batch"`` gives
the batch-maximum variant some libraries use (Tianshou's ``weight_norm``).

:class:`Priorities` knows nothing of where transitions live: the engine's
:class:`~hetero_replay.replay.PrioritizedReplay` pairs it with a storage, and
the Tianshou adapter pairs it with Tianshou's own storage. It holds no lock:
its owner serialises calls.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import numpy as np

from hetero_replay import _native
from hetero_replay.checks import check_real
from hetero_replay.options import PEROptions, check_alpha, check_beta, check_eps, check_floor
from hetero_replay.trees import SumTree, make_tree
from hetero_replay.trees.base import describe_max_leaf, is_device_tree
from hetero_replay.trees.numpy_tree import as_indices

Normalise = Literal["global", "batch"]
#: The IS-weight normalisations, as ``normalise=`` (and the SB3 buffers' ``weight_norm=``) name them.
NORMALISE: tuple[Normalise, ...] = ("global", "batch")


def check_normalise(value: Any, name: str = "normalise") -> Normalise:
    """``value`` if it names an IS-weight normalisation (:data:`NORMALISE`), else ``ValueError`` naming ``name``."""
    if not isinstance(value, str) or value not in NORMALISE:
        raise ValueError(f"{name} must be 'global' or 'batch', got {value!r}")
    return value


def normalise_by_batch(weights: Any) -> Any:
    """IS weights divided by their largest (``normalise="batch"``): the batch's largest weight is 1.

    Their ratios, which correct PER's bias, are unchanged; so is the result whatever
    scale ``weights`` came in (global normalisation is a common factor), which lets a
    caller apply it to weights the engine normalised globally. A NumPy array or a
    torch tensor, not empty.
    """
    return weights / weights.max()


class PrioritySnapshot(NamedTuple):
    """What :meth:`Priorities.restore` needs to undo an update of ``indices``."""

    indices: Any
    leaves: Any
    max_priority: float


class Priorities:
    """Priorities of ``capacity`` slots, with alpha, beta, eps and the running max priority.

    Args:
        capacity: number of slots (transitions) that can hold a priority.
        options: the PER options (:class:`~hetero_replay.options.PEROptions`).
        tree_device: where a device tree lives (``options.tree`` ``"torch"``:
            any torch device; ``"cupy"``: a CUDA device); ``None`` for CPU trees.

    A slot's priority is ``(|td| + eps) ** alpha``; new transitions get
    ``max_priority ** alpha``, the largest ``|td| + eps`` seen so far (1 at
    first), so each is drawn soon. Every call validates all its input before
    anything changes.
    """

    #: ``(max_priority, alpha, new_priority())`` as last computed (a class default: older pickles lack it).
    _new: tuple[float, float, Any] | None = None
    #: ``(priority, leaves)``: ``priority`` repeated, as :meth:`assign_new` last wrote it (most adds reuse it).
    _new_leaves: tuple[Any, np.ndarray] | None = None

    def __init__(self, capacity: int, options: PEROptions | None = None, tree_device: Any = None) -> None:
        self.options = options if options is not None else PEROptions()
        o = self.options
        self.tree: SumTree = make_tree(o.tree, capacity, o.fanout, o.priority_dtype, device=tree_device)
        self._alpha, self._beta, self._eps = o.alpha, o.beta, o.eps
        self.stratified = o.stratified
        self._max_priority = 1.0
        # Write epochs (see track_writes): None until someone needs to know which slots were rewritten.
        self._written_at: np.ndarray | None = None
        self._epoch = 0

    # -- hyper-parameters --------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.tree.capacity

    @property
    def alpha(self) -> float:
        """Priority exponent. Changing it shapes only priorities written from now on."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        alpha = check_alpha(value)
        check_floor(alpha, self._eps, self.tree.dtype)
        self._alpha = alpha

    @property
    def eps(self) -> float:
        """Added to every ``|TD error|``; ``eps ** alpha`` is the smallest priority."""
        return self._eps

    @eps.setter
    def eps(self, value: float) -> None:
        eps = check_eps(value)
        check_floor(self._alpha, eps, self.tree.dtype)
        self._eps = eps

    @property
    def beta(self) -> float:
        """IS-weight exponent in ``[0, 1]``: what owners pass to :meth:`draw` unless a call names another."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = check_beta(value)

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` seen so far (starts at 1)."""
        return self._max_priority

    # -- the PER operations ----------------------------------------------------------

    def new_priority(self) -> Any:
        """``max_priority ** alpha`` in the tree's dtype; ``ValueError`` if the tree cannot hold it."""
        new = self._new
        if new is not None and new[0] == self._max_priority and new[1] == self._alpha:
            return new[2]  # every add asks; the two change far less often (and a cold call costs ~10 us)
        # Python floats: np.errstate would cost more than the add's tree update.
        try:
            raw = self._max_priority**self._alpha
        except OverflowError:
            raw = float("inf")
        priority = self.tree.dtype.type(raw) if raw <= self.tree.max_leaf else raw
        if not float(priority) <= self.tree.max_leaf:  # also after rounding to the tree's dtype
            raise ValueError(
                f"the priority of new transitions, max_priority ** alpha = {self._max_priority!r} ** "
                f"{self._alpha!r} = {priority}, exceeds the largest priority this tree can sum, "
                f"{describe_max_leaf(self.tree.dtype, self.capacity)}; lower alpha"
            )
        self._new = (self._max_priority, self._alpha, priority)
        return priority

    def assign_new(self, indices: Any, priority: Any = None) -> None:
        """Give new transitions at ``indices`` the priority :meth:`new_priority` (checked first)."""
        value = self.new_priority() if priority is None else priority
        cached = self._new_leaves
        if cached is None or cached[0] is not value or len(cached[1]) != len(indices):
            # A cold np.full costs an add ~20 us; trees copy the leaves they are given, so one array serves.
            cached = self._new_leaves = (value, np.full(len(indices), value, self.tree.dtype))
        self.tree.update(indices, cached[1])
        self._wrote(indices)

    def clear(self, indices: Any) -> None:
        """Priority 0 at ``indices``: those slots are never drawn until written again."""
        self.tree.update(indices, np.zeros(len(indices), self.tree.dtype))
        self._wrote(indices)

    # -- write epochs: which slots changed transition since a batch was drawn ----------------

    def track_writes(self) -> None:
        """Start recording, per slot, the epoch of its last write (:meth:`assign_new`, :meth:`clear`).

        A late priority update (one computed from a batch drawn at epoch ``e``)
        must not land on a slot that holds another transition by now; see
        :meth:`update_since`. Costs 8 bytes per slot, so it is off until a
        relaxed pipeline asks for it. Slots written before count as written at
        epoch 0.
        """
        if self._written_at is None:
            self._written_at = np.zeros(self.capacity, np.int64)

    @property
    def write_epoch(self) -> int:
        """Number of writes so far (while :meth:`track_writes` is on): the epoch a batch drawn now carries."""
        return self._epoch

    @property
    def written_at(self) -> np.ndarray | None:
        """Per slot, the epoch of its last write (``None`` until :meth:`track_writes`); read it, never write it.

        The same array for the life of this object (written in place), so a
        native executor may read it directly.
        """
        return self._written_at

    def _wrote(self, indices: Any) -> None:
        if self._written_at is not None:
            self._epoch += 1
            self._written_at[_host(indices)] = self._epoch

    def _overwritten_since(self, indices: Any, epoch: int | np.ndarray) -> np.ndarray | None:
        """Mask of ``indices`` whose slot was written after ``epoch``; ``None`` when none was.

        ``epoch`` is one epoch for all entries or one per entry (a sharded
        replay's indices each carry their own). Needs :meth:`track_writes`.
        Indices out of range are left for the update to refuse.
        """
        assert self._written_at is not None  # update_since checked
        per_entry = np.ndim(epoch) > 0
        if not per_entry and epoch >= self._epoch:
            return None
        idx = np.asarray(_host(indices))
        inside = (idx >= 0) & (idx < self.capacity)
        stale = np.zeros(idx.shape, bool)
        since = np.asarray(epoch)[inside] if per_entry else epoch
        stale[inside] = self._written_at[idx[inside]] > since
        return stale if stale.any() else None

    def lift_max(self, value: float) -> None:
        """Raise the max priority to at least ``value`` (a finite positive number the tree can hold as ``value ** alpha``).

        A sharded replay keeps one max over its shards: each shard is told the
        global one, so its new transitions get the priority a single buffer
        would give them. Refused values change nothing.
        """
        value = check_real(value, "max_priority")
        if value <= self._max_priority:
            return
        old, self._max_priority = self._max_priority, value
        try:
            self.new_priority()
        except ValueError:
            self._max_priority = old
            raise

    def snapshot(self, indices: Any) -> PrioritySnapshot:
        """The priorities of ``indices`` and the max priority, for :meth:`restore`."""
        return PrioritySnapshot(indices, self.tree.get(indices), self._max_priority)

    def restore(self, snapshot: PrioritySnapshot) -> None:
        """Undo everything done to the snapshot's slots since it was taken.

        Exact: every tree recomputes a node from its children, so the tree
        depends on its leaves only, not on the order of updates.
        """
        self.tree.update(snapshot.indices, snapshot.leaves)
        self._max_priority = snapshot.max_priority

    def update(self, indices: Any, td_errors: Any, limit: int | None = None, filled_only: bool = False) -> None:
        """Set priorities from ``|TD errors|``: ``(|td| + eps) ** alpha``.

        Indices must lie in ``[0, limit)`` (default: all slots) and, with
        ``filled_only``, hold a positive priority (see :meth:`check_filled`). A
        NaN, infinite or negative TD error, or one whose priority the tree
        cannot sum, raises ``ValueError`` naming its position; a bad index
        ``IndexError``; nothing changes on error.
        """
        if filled_only and isinstance(self.tree, _native.SumTree):  # checks and update in one native call
            self.note_update(
                self.tree.update_td_since(indices, td_errors, self._alpha, self._eps, limit, None, 0, True)[1]
            )
            return
        if filled_only:
            self.check_filled(indices)
        self.note_update(self.tree.update_td(indices, td_errors, self._alpha, self._eps, limit))

    def note_update(self, max_raw: float) -> None:
        """Fold the ``max(|td| + eps)`` of an update the tree accepted into :attr:`max_priority`.

        :meth:`update` calls it; so does an executor that updated the tree itself.
        """
        if max_raw > self._max_priority:
            self._max_priority = max_raw

    def update_since(
        self,
        indices: Any,
        td_errors: Any,
        epoch: int | np.ndarray,
        limit: int | None = None,
        keep_undo: bool = False,
        filled_only: bool = False,
    ) -> tuple[int, PrioritySnapshot | None]:
        """:meth:`update` for a batch drawn at write ``epoch``: the one rule for late updates.

        Entries whose slot was written after ``epoch`` hold another transition
        by now, so their TD errors are dropped (``epoch`` may be one per
        entry; needs :meth:`track_writes`). With ``keep_undo``, the priorities
        of the slots about to change are kept in a snapshot that
        :meth:`restore` undoes the update with exactly. ``limit`` and
        ``filled_only`` as in :meth:`update`.

        Returns:
            ``(entries dropped, snapshot or None)``.

        Raises:
            ValueError, IndexError, TypeError: as :meth:`update` (positions then
                count the entries not dropped), or a number of TD errors other
                than the number of indices; nothing changes on error.
        """
        if self._written_at is None:
            raise RuntimeError("update_since needs track_writes() first")
        if isinstance(self.tree, _native.SumTree) and not keep_undo and np.ndim(epoch) == 0:
            # The native executor's code for the rule, in one call: a NumPy mask costs ~10 cold calls.
            dropped, max_raw = self.tree.update_td_since(
                indices, td_errors, self._alpha, self._eps, limit, self._written_at, int(epoch), filled_only
            )
            self.note_update(max_raw)
            return dropped, None
        stale = self._overwritten_since(indices, epoch)
        dropped = 0
        if stale is not None:
            count = _size(td_errors)
            if count != stale.size:
                raise ValueError(f"{stale.size} indices but {count} TD errors")
            keep = ~stale
            indices, td_errors = _select(indices, keep), _select(td_errors, keep)
            dropped = int(stale.sum())
        snapshot = None
        if keep_undo:
            # A device tree reads its own index tensors; a host tree's get wants checked int64 indices.
            slots = indices if is_device_tree(self.tree) else as_indices(indices, self.capacity)
            snapshot = self.snapshot(slots)
        self.update(indices, td_errors, limit, filled_only)
        return dropped, snapshot

    def check_filled(self, indices: Any) -> None:
        """``IndexError`` naming the first of ``indices`` whose slot holds priority 0 (never written, or cleared).

        For owners whose filled slots are not a prefix of ``[0, capacity)``
        and whose ``eps`` is positive, so that a filled slot never holds 0.
        """
        leaves = np.asarray(_host(self.tree.get(indices)))  # the tree raises for indices outside [0, capacity)
        bad = np.flatnonzero(leaves <= 0)
        if bad.size:
            i = int(bad[0])
            index = int(np.asarray(_host(indices)).reshape(-1)[i])
            raise IndexError(f"index at position {i} is {index}, which holds no stored transition")

    def draw(self, batch_size: int, rng: Any, beta: float, normalise: Normalise = "global") -> tuple[Any, Any]:
        """Draw ``batch_size`` slots with probability ``P(i)``; returns ``(indices, IS weights)``.

        Weights are normalised by the largest weight in the buffer (``"global"``)
        or in the batch (``"batch"``). The arguments are the caller's to check
        (:func:`~hetero_replay.checks.check_batch_size`, ``check_beta``) before the
        generator ``rng`` is touched; an empty tree raises ``ValueError`` before
        any draw.
        """
        indices, weights = self.tree.sample(batch_size, rng, beta, self.stratified)
        return indices, normalise_by_batch(weights) if normalise == "batch" else weights

    def weights(self, indices: Any, beta: float | None = None, normalise: Normalise = "global") -> np.ndarray:
        """IS weights ``(p_min / p_i) ** beta`` of slots ``indices`` (float32), as :meth:`draw` gives them.

        ``beta`` and ``normalise`` as in :meth:`draw` (``"batch"``: divided by
        the largest of these weights). Slots with priority 0 get weight ``inf``;
        callers index stored slots only.
        """
        b = self._beta if beta is None else check_beta(beta)
        check_normalise(normalise)
        weights = _native.is_weights(self.tree.get(indices), self.tree.min(), b)
        return normalise_by_batch(weights) if normalise == "batch" and weights.size else weights

    # -- state -------------------------------------------------------------------------

    def leaves(self) -> np.ndarray:
        """A copy of every slot's priority ``p ** alpha``."""
        return self.tree.leaves()

    def load(self, leaves: Any, max_priority: Any) -> None:
        """Replace every priority and the max priority, all checked before anything changes."""
        checked = check_real(max_priority, "max_priority", positive=True)
        old = self._max_priority
        self._max_priority = checked
        try:
            self.new_priority()  # refuses a max priority whose alpha power the tree cannot hold
        except ValueError:
            self._max_priority = old
            raise
        try:
            self.tree.load_leaves(leaves)
        except (TypeError, ValueError):
            self._max_priority = old
            raise
        if self._written_at is not None:  # every slot holds a transition it did not hold before
            self._epoch += 1
            self._written_at[:] = self._epoch

    def __repr__(self) -> str:
        return (
            f"Priorities(capacity={self.capacity}, alpha={self._alpha}, beta={self._beta}, eps={self._eps}, "
            f"tree={type(self.tree).__name__})"
        )


def td_magnitudes(errors: np.ndarray) -> np.ndarray:
    """``|errors|`` of a NumPy array of numbers, flattened, in a float dtype the trees take exactly.

    Floats keep their dtype (a float's magnitude is exact, and trees widen it exactly); integers and
    booleans become float64 first, so the magnitude of the most negative integer cannot wrap. The
    caller checks, with its own words, that ``errors`` holds numbers.
    """
    if errors.dtype.kind != "f":
        errors = errors.astype(np.float64)
    return np.abs(errors).reshape(-1)


def _size(values: Any) -> int:
    """Number of entries of a NumPy array, array-like or tensor."""
    return int(values.numel()) if hasattr(values, "numel") else int(np.size(values))


def _select(values: Any, keep: np.ndarray) -> Any:
    """``values[keep]`` (flattened) for a NumPy array, array-like or torch tensor, where it lives."""
    if hasattr(values, "detach"):  # a torch tensor, wherever it is
        import torch

        return values.reshape(-1)[torch.from_numpy(keep).to(values.device)]
    return np.asarray(values).reshape(-1)[keep]


def _host(x: Any) -> Any:
    """Indices as the host sees them: a torch tensor or CuPy array is copied back."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return x.get() if hasattr(x, "__cuda_array_interface__") else x


__all__ = ["Normalise", "Priorities", "PrioritySnapshot", "td_magnitudes"]
