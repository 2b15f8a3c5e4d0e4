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
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple

import numpy as np

from hetero_replay import checkpoint
from hetero_replay.storage import HOST, HostStorage, Schema, make_storage
from hetero_replay.trees import SumTree, make_tree

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
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.alpha = alpha
        self.beta = beta
        if not (np.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be finite and >= 0, got {eps}")
        self.eps = float(eps)
        self.stratified = bool(stratified)
        self.capacity = int(capacity)
        self.storage = make_storage(storage, self.capacity, schema)
        self.tree: SumTree = make_tree(tree, self.capacity, fanout, priority_dtype, device=tree_device)
        self._tree_backend = tree
        # How to rebuild this buffer elsewhere (load_state_dict, pickling).
        self._placement = {
            "tree_device": None if tree_device is None else str(tree_device),
            "storage": str(storage),
            "device": None if device is None else str(device),
        }
        self.rng = np.random.default_rng(seed)
        self._pos = 0
        self._size = 0
        self._max_priority = 1.0  # raw (|td| + eps); new items get its alpha power

    # -- hyper-parameters ----------------------------------------------------------

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        # alpha only shapes priorities written from now on; it is fixed per
        # buffer in practice, so it is validated but not retroactively applied.
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"alpha must be finite and >= 0, got {value}")
        self._alpha = float(value)

    @property
    def beta(self) -> float:
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
        whole batch is valid.
        """
        rows, arrays = self.storage.validate(batch)
        indices = (self._pos + np.arange(rows, dtype=np.int64)) % self.capacity
        if rows == 0:
            return indices
        self.storage.write(self._pos, arrays)
        self.tree.update(indices, np.full(rows, self._max_priority**self._alpha, self.tree.dtype))
        self._pos = (self._pos + rows) % self.capacity
        self._size = min(self._size + rows, self.capacity)
        return indices

    def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions with probability ``p_i^alpha / sum p^alpha``.

        Args:
            batch_size: number of draws (with replacement).
            beta: IS exponent for this call; defaults to :attr:`beta`.
        """
        if self._size == 0:
            raise ValueError("cannot sample from an empty buffer; add transitions first")
        if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        beta = self._beta if beta is None else _check_beta(beta)
        indices, weights = self.tree.sample(int(batch_size), self.rng, beta, self.stratified)
        return Sample(self.storage.gather(indices), indices, weights)

    def update_priorities(self, indices: Any, td_errors: Any) -> None:
        """Set the priorities of sampled transitions from their ``|TD error|``.

        The stored priority is ``(|td| + eps) ** alpha``. ``td_errors`` must be
        magnitudes: a NaN, infinite or negative entry raises ``ValueError``
        naming its position, an index outside the filled part of the buffer
        raises ``IndexError``; either way no priority changes.
        """
        limit = None if self._size == self.capacity else self._size
        max_raw = self.tree.update_td(indices, td_errors, self._alpha, self.eps, limit)
        if max_raw > self._max_priority:
            self._max_priority = max_raw

    # -- state -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this buffer is (copies)."""
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
                "eps": self.eps,
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
        self.__dict__.update(fresh.__dict__)

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
        buf._max_priority = float(state["max_priority"])
        return buf

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the buffer to ``path`` atomically (see :mod:`hetero_replay.checkpoint`)."""
        state = self._state(copy=False)  # views: saving a large buffer needs no second copy
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

    def __getstate__(self) -> dict[str, Any]:
        return {"state": self.state_dict(), "tree": self._tree_backend, "placement": self._placement}

    def __setstate__(self, d: dict[str, Any]) -> None:
        fresh = PrioritizedReplay.from_state_dict(d["state"], tree=d["tree"], **d.get("placement", {}))
        self.__dict__.update(fresh.__dict__)


def _check_beta(value: float) -> float:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"beta must be in [0, 1], got {value}")
    return float(value)
