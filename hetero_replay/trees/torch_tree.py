"""The K-ary sum tree on any torch device (CPU, CUDA, ...), in torch tensor ops.

Same layout and numerical contract as the NumPy reference
(:mod:`hetero_replay.trees.numpy_tree`): one tensor per level, padded to whole
sibling groups; float64 prefix sums taken left to right; a parent is the last
prefix sum rounded once to the tree's dtype. On the CPU it agrees with the
reference to the bit; on a GPU it does the same float64 additions in the same
order, so it agrees there too.

How the work is laid out on a device:

* **search** is level-synchronous: each level is one gather of the
  ``(batch, fanout)`` prefix sums of the current nodes and one compare, with no
  data-dependent branch (no device-to-host sync inside a descent);
* **update** writes the leaves (last write wins, decided by a stable sort, not
  by the unspecified order of a scatter) and then recomputes only the touched
  parents, level by level, from their children: ``O(B * fanout * levels)``, no
  ``O(N)`` rebuild and no atomic float accumulation. Two updated leaves that
  share a parent recompute it twice from the same children and write the same
  bits, so duplicates need no deduplication;
* the tree keeps ``total`` and ``min`` on the device and mirrors them on the
  host; every update ends with **one** small device-to-host read (the mirrors,
  plus validation flags and ``max(td + eps)`` for tensor input). Sampling then
  needs no read at all.

Inputs may be NumPy arrays (validated on the host, exactly like the reference,
then copied to the device) or torch tensors on any device (validated on the
tree's device; the write is masked on the device, so bad input still changes
nothing). The two powers of PER (priorities from tensor TD errors, IS
weights) are torch's ``pow`` on the tree's device, which may differ from the
CPU backends' shared routine by one ulp; NumPy input takes the CPU backends'
routine. The :class:`~hetero_replay.trees.base.SumTree` protocol methods
return NumPy arrays; :meth:`TorchSumTree.sample_tensors` returns tensors on the
tree's device for a learner that lives there.

Uniforms for ``sample``: a ``numpy.random.Generator`` draws them on the host
(``rng.random(batch_size)``, the same stream every backend uses, so a seed
gives the same samples on every backend), followed by one copy of
``8 * batch_size`` bytes to the device. A ``torch.Generator`` on the tree's
device draws them there instead (no copy; reproducible for a seeded generator,
but a different stream from the NumPy one).

The tree is not thread-safe: serialise writers against readers yourself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hetero_replay.trees.base import TreeBase, describe_max_leaf
from hetero_replay.trees.numpy_tree import (
    as_indices,
    as_priorities,
    priorities_from_td,
)

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def sequential_prefix(x: torch.Tensor) -> torch.Tensor:
    """Row-wise inclusive prefix sums of a float64 ``(n, k)`` tensor, left to right.

    ``torch.cumsum`` on the CPU adds strictly left to right (checked against
    ``np.cumsum`` in the tests); on CUDA it runs a parallel scan whose rounding
    differs, so other devices use :func:`column_prefix`.
    """
    return torch.cumsum(x, dim=1) if x.device.type == "cpu" else column_prefix(x)


def column_prefix(x: torch.Tensor) -> torch.Tensor:
    """Row-wise prefix sums one column at a time (``k - 1`` adds): left to right on any device."""
    out = x.clone()
    for k in range(1, x.shape[1]):
        out[:, k] += out[:, k - 1]
    return out


def choose_children(prefix: torch.Tensor, mass: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the child whose prefix interval holds ``mass`` and the remaining mass.

    The vectorised, branch-free form of ``choose_in_prefix`` in
    ``csrc/hetero_replay/descent.hpp``: the first child whose prefix sum exceeds
    the mass; where rounding leaves the mass at or past the group's end, the
    last child with mass (its prefix sum grows).
    """
    k = prefix.shape[1]
    j = (prefix <= mass[:, None]).sum(dim=1)
    before = torch.where(j > 0, prefix.gather(1, (j - 1).clamp_min(0)[:, None])[:, 0], 0.0)
    remaining = (mass - before).clamp_min(0.0)
    # Past the end: the last k in 1..K-1 whose prefix grows, else 0.
    grows = prefix[:, 1:] > prefix[:, :-1]
    ks = torch.arange(1, k, device=prefix.device)
    last = (grows * ks).amax(dim=1) if k > 1 else torch.zeros_like(j)
    last_hi = prefix.gather(1, last[:, None])[:, 0]
    last_lo = torch.where(last > 0, prefix.gather(1, (last - 1).clamp_min(0)[:, None])[:, 0], 0.0)
    past = j == k
    return torch.where(past, last, j), torch.where(past, last_hi - last_lo, remaining)


class TorchSumTree(TreeBase):
    """K-ary sum tree with an exact positive minimum, held in torch tensors on ``device``.

    Args:
        capacity: number of leaves.
        fanout: children per node, one of ``FANOUTS``.
        dtype: ``"float32"`` or ``"float64"`` leaf values.
        device: any torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...);
            default the CPU.
    """

    def __init__(
        self, capacity: int, fanout: int = 16, dtype: Any = "float32", device: str | torch.device | None = None
    ) -> None:
        super().__init__(capacity, fanout, dtype)
        self._tdtype = _TORCH_DTYPES[self._dtype]
        self._device = torch.device("cpu" if device is None else device)
        k, alloc = self._k, self._alloc
        dev, f64 = self._device, torch.float64
        # The leaf level has one extra slot past every group: the writes that a
        # later write to the same leaf overrides are sent there (see _apply).
        self._scratch = alloc[0]
        self._values = [torch.zeros(alloc[0] + 1, dtype=self._tdtype, device=dev)]
        self._values += [torch.zeros(n, dtype=self._tdtype, device=dev) for n in alloc[1:]]
        inf = float("inf")
        # Index 0 is an empty placeholder in both: leaves need no minimum and keep no prefix sums.
        unused = torch.empty(0, device=dev)
        self._mins = [unused] + [torch.full((n,), inf, dtype=self._tdtype, device=dev) for n in alloc[1:]]
        self._prefix = [unused] + [torch.zeros(n, dtype=f64, device=dev) for n in alloc[1:]]
        self._offsets = torch.arange(k, device=dev)
        self._total_t = torch.zeros((), dtype=f64, device=dev)
        self._min_t = torch.full((), inf, dtype=self._tdtype, device=dev)
        # TreeBase's _total / _min are the host mirrors of _total_t / _min_t.

    # -- protocol ------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where the tree's tensors live."""
        return self._device

    def update(self, indices: Any, priorities: Any) -> None:
        if isinstance(indices, torch.Tensor) or isinstance(priorities, torch.Tensor):
            idx = self._index_tensor(indices)
            val = self._real_tensor(priorities, "priorities").to(self._tdtype)
            _check_sizes(idx, val, "priorities")
            if idx.numel() == 0:
                return
            self._apply_checked(idx, val, self._capacity, val, None, "priority")
            return
        idx_np = as_indices(indices, self._capacity)
        val_np = as_priorities(priorities, self._dtype, self._capacity, len(idx_np))
        if idx_np.size:
            self._apply(self._to_device(idx_np), self._to_device(val_np))

    def update_td(self, indices: Any, td_errors: Any, alpha: float, eps: float, limit: int | None = None) -> float:
        bound = self._capacity if limit is None else min(limit, self._capacity)
        if isinstance(indices, torch.Tensor) or isinstance(td_errors, torch.Tensor):
            idx = self._index_tensor(indices)
            td = self._real_tensor(td_errors, "td_errors").to(torch.float64)
            _check_sizes(idx, td, "TD errors")
            if idx.numel() == 0:
                return 0.0
            raw = td + eps
            if self._dtype == np.float32:  # as the reference: the power in float32
                priorities = torch.pow(raw.float(), float(np.float32(alpha)))
            else:
                priorities = torch.pow(raw, alpha)
            return self._apply_checked(idx, priorities, bound, td, raw.amax(), "TD error")
        idx_np = as_indices(indices, bound)
        pri_np, max_raw = priorities_from_td(td_errors, len(idx_np), alpha, eps, self._dtype, self._capacity)
        if idx_np.size:
            self._apply(self._to_device(idx_np), self._to_device(pri_np))
        return max_raw

    def load_leaves(self, leaves: Any) -> None:
        if isinstance(leaves, torch.Tensor):
            leaves = leaves.detach().cpu().numpy()
        val = as_priorities(leaves, self._dtype, self._capacity)
        if val.size != self._capacity:
            raise ValueError(f"expected {self._capacity} leaves, got {val.size}")
        self._values[0][: self._capacity] = self._to_device(val)
        for level in range(1, self.num_levels):
            self._recompute(level, torch.arange(self._alloc[level - 1] // self._k, device=self._device))
        self._refresh_root()
        self._read_scalars()

    def get(self, indices: Any) -> np.ndarray:
        idx = as_indices(_host(indices), self._capacity)
        return self._values[0][self._to_device(idx)].cpu().numpy()

    def leaves(self) -> np.ndarray:
        return self._values[0][: self._capacity].to("cpu", copy=True).numpy()

    def find(self, mass: Any) -> np.ndarray:
        m = self._checked_masses(_host(mass))
        return self._descend(self._to_device(m)).cpu().numpy()

    def sample(
        self, batch_size: int, rng: np.random.Generator, beta: float, stratified: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        idx, weights = self.sample_tensors(batch_size, rng, beta, stratified)
        return idx.cpu().numpy(), weights.cpu().numpy()

    def sample_tensors(
        self,
        batch_size: int,
        rng: np.random.Generator | torch.Generator,
        beta: float,
        stratified: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sample`, returning ``(indices int64, weights float32)`` on :attr:`device`.

        ``rng`` is a ``numpy.random.Generator`` (uniforms drawn on the host and
        copied over: the same samples as every other backend) or a
        ``torch.Generator`` on this tree's device (drawn there, no copy).
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self._require_mass()
        if isinstance(rng, torch.Generator):
            u = torch.rand(batch_size, generator=rng, dtype=torch.float64, device=self._device)
        elif isinstance(rng, np.random.Generator):
            u = self._to_device(rng.random(batch_size))
        else:
            raise TypeError(f"rng must be a numpy.random.Generator or a torch.Generator, got {type(rng).__name__}")
        if stratified:
            steps = torch.arange(batch_size, dtype=torch.float64, device=self._device)
            mass = (steps + u) * (self._total / batch_size)
        else:
            mass = u * self._total
        idx = self._descend(mass)
        ratio = (self._min / self._values[0][idx].double()).float()
        if beta == 0.0:
            weights = torch.ones(batch_size, dtype=torch.float32, device=self._device)
        elif beta == 1.0:
            weights = ratio
        else:
            weights = torch.pow(ratio, float(np.float32(beta)))
        return idx, weights

    def __getstate__(self) -> dict[str, Any]:
        return {
            "capacity": self._capacity,
            "fanout": self._k,
            "dtype": self._dtype.name,
            "device": str(self._device),
            "leaves": self.leaves(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        TorchSumTree.__init__(self, state["capacity"], state["fanout"], state["dtype"], state["device"])
        self.load_leaves(state["leaves"])

    def __repr__(self) -> str:
        return (
            f"TorchSumTree(capacity={self._capacity}, fanout={self._k}, "
            f"dtype={self._dtype.name}, device={self._device})"
        )

    # -- internals -----------------------------------------------------------------

    def _to_device(self, arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(arr)).to(self._device)

    def _index_tensor(self, indices: Any) -> torch.Tensor:
        t = _as_tensor(indices)
        if t.ndim != 1:
            raise ValueError(f"indices must be 1-D, got {t.ndim}-D")
        if t.numel() and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise TypeError(f"indices must be integers, got dtype {t.dtype}")
        return t.to(self._device, torch.int64)

    def _real_tensor(self, values: Any, what: str) -> torch.Tensor:
        t = _as_tensor(values)
        if t.ndim != 1:
            raise ValueError(f"{what} must be 1-D, got {t.ndim}-D")
        if t.numel() and (t.is_complex() or t.dtype == torch.bool):
            raise TypeError(f"{what} must be real numbers, got dtype {t.dtype}")
        return t.to(self._device)

    def _apply_checked(
        self,
        idx: torch.Tensor,
        priorities: torch.Tensor,
        bound: int,
        checked: torch.Tensor,
        max_raw: torch.Tensor | None,
        what: str,
    ) -> float:
        """Validates and applies tensor input with one device-to-host read.

        ``checked`` holds the values that must be finite and >= 0 (the
        priorities, or the TD errors they came from); ``priorities`` must also
        be at most :attr:`max_leaf`. The leaf write is masked
        on the device when anything is bad, so the read that reveals an error
        follows a no-op update: nothing has changed. Returns ``max_raw``.
        """
        bad_idx = (idx < 0) | (idx >= bound)
        bad_val = ~(torch.isfinite(checked) & (checked >= 0) & (priorities <= self._max_leaf))
        any_bad_idx, any_bad_val = bad_idx.any(), bad_val.any()
        extra = [any_bad_idx.double(), any_bad_val.double()]
        if max_raw is not None:
            extra.append(max_raw.double())
        read = self._apply(idx.clamp(0, self._capacity - 1), priorities, ~(any_bad_idx | any_bad_val), extra)
        if read[0]:
            i = int(torch.nonzero(bad_idx)[0])
            raise IndexError(f"index at position {i} is {int(idx[i])}, outside [0, {bound})")
        if read[1]:
            i = int(torch.nonzero(bad_val)[0])
            bound_text = describe_max_leaf(self._dtype, self._capacity)
            if what == "priority":
                shown = self._dtype.type(checked[i].item())
                raise ValueError(f"priority at position {i} is {shown}; priorities must be >= 0 and <= {bound_text}")
            shown = float(checked[i].item())
            if np.isfinite(shown) and shown >= 0:
                raise ValueError(
                    f"TD error at position {i} is {shown!r}: its priority (td + eps) ** alpha = "
                    f"{self._dtype.type(priorities[i].item())} exceeds the largest priority this tree can sum, "
                    f"{bound_text}"
                )
            raise ValueError(f"TD error at position {i} is {shown!r}; pass finite magnitudes |TD error| >= 0")
        return read[2] if max_raw is not None else 0.0

    def _apply(
        self,
        idx: torch.Tensor,
        values: torch.Tensor,
        ok: torch.Tensor | None = None,
        extra: list[torch.Tensor] | None = None,
    ) -> list[float]:
        """Writes ``leaf[idx] = values`` (last write wins) and refreshes the tree.

        ``ok`` (a 0-d bool tensor) masks the leaf write on the device. Ends with
        one device-to-host read of the host mirrors and ``extra``; returns
        ``extra`` as floats.
        """
        order = torch.argsort(idx, stable=True)
        leaf = idx[order]
        last = torch.ones_like(leaf, dtype=torch.bool)
        last[:-1] = leaf[1:] != leaf[:-1]  # the last of each run of equal indices
        if ok is not None:
            last &= ok
        target = torch.where(last, leaf, self._scratch)
        self._values[0][target] = values[order].to(self._tdtype)
        nodes = leaf
        for level in range(1, self.num_levels):
            nodes = nodes // self._k
            self._recompute(level, nodes)
        self._refresh_root()
        return self._read_scalars(extra or [])

    def _recompute(self, level: int, nodes: torch.Tensor) -> None:
        """Nodes of ``level`` (>= 1) from their children: value, minimum, prefix sums."""
        groups = nodes[:, None] * self._k + self._offsets
        children = self._values[level - 1][groups]
        prefix = sequential_prefix(children.double())
        self._values[level][nodes] = prefix[:, -1].to(self._tdtype)
        if level >= 2:
            self._prefix[level - 1][groups] = prefix
            mins = self._mins[level - 1][groups]
        else:
            mins = torch.where(children > 0, children, float("inf"))
        self._mins[level][nodes] = mins.amin(dim=1)

    def _refresh_root(self) -> None:
        top = self.num_levels - 1
        group = self._values[top][: self._k]
        prefix = sequential_prefix(group.double()[None])[0]
        self._total_t = prefix[-1]
        if top == 0:
            self._min_t = torch.where(group > 0, group, float("inf")).amin()
        else:
            self._prefix[top].copy_(prefix)
            self._min_t = self._mins[top].amin()

    def _read_scalars(self, extra: list[torch.Tensor] | None = None) -> list[float]:
        """One device-to-host read: the total, the minimum and ``extra``."""
        values = torch.stack([self._total_t, self._min_t.double(), *(extra or [])]).cpu().tolist()
        self._total, self._min = values[0], values[1]
        return values[2:]

    def _descend(self, mass: torch.Tensor) -> torch.Tensor:
        node = torch.zeros(mass.shape[0], dtype=torch.int64, device=self._device)
        m = mass
        for level in range(self.num_levels - 1, 0, -1):
            prefix = self._prefix[level][node[:, None] * self._k + self._offsets]
            j, m = choose_children(prefix, m)
            node = node * self._k + j
        children = self._values[0][node[:, None] * self._k + self._offsets]
        j, _ = choose_children(sequential_prefix(children.double()), m)
        return node * self._k + j


def _as_tensor(x: Any) -> torch.Tensor:
    return x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def _host(x: Any) -> Any:
    """A tensor as a host NumPy array; anything else unchanged."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


def _check_sizes(idx: torch.Tensor, values: torch.Tensor, what: str) -> None:
    if values.numel() != idx.numel():
        raise ValueError(f"got {idx.numel()} indices but {values.numel()} {what}")


__all__ = ["TorchSumTree", "choose_children", "column_prefix", "sequential_prefix"]
