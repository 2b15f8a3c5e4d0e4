"""The PER options, written and checked once: :class:`PEROptions`.

The engine, the SB3 buffers and the Tianshou buffers all take these keyword
arguments (``alpha=...``, ``beta=...``) or a ready :class:`PEROptions`; the
defaults and their meaning are documented here and nowhere else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero_replay import _native
from hetero_replay.checks import MAX_STALENESS, check_bool, check_int, check_real, check_staleness
from hetero_replay.trees.base import check_fanout, check_priority_dtype

#: Added to every ``|TD error|``. It also floors the smallest priority, and with
#: it the largest IS weight that normalises all the others: the smaller it is,
#: the smaller the typical weight (see docs/design-notes.md, "eps").
DEFAULT_EPS = 1e-6


class _Unset:
    """The default of a PER keyword argument that was not given (``None`` is a value, and refused)."""

    def __repr__(self) -> str:
        return "<default>"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class PEROptions:
    """How prioritized replay samples and weighs: validated on construction, immutable.

    Args:
        alpha: priority exponent, ``>= 0``; transition ``i`` is drawn with
            probability ``p_i^alpha / sum p^alpha``; 0 samples uniformly.
        beta: IS-weight exponent in ``[0, 1]``; 1 corrects the bias fully.
            Buffers let it be annealed; this is its starting value.
        eps: ``>= 0``, added to every ``|TD error|``; ``eps ** alpha`` is the
            smallest priority and must not round to 0 in ``priority_dtype``.
        tree: sum-tree backend, ``"auto"`` or a registered name
            (:func:`hetero_replay.registry.backends`).
        fanout: children per tree node, a power of two in ``FANOUTS``; 16 puts
            one float32 sibling group in one 64-byte cache line.
        priority_dtype: ``"float32"`` or ``"float64"`` tree values.
        stratified: one draw from each of ``batch_size`` equal slices of the
            priority mass (lower variance); ``False`` draws i.i.d.

    Wrong types raise ``TypeError``, values out of range ``ValueError``, each
    naming the argument and the value received.
    """

    alpha: float = 0.6
    beta: float = 0.4
    eps: float = DEFAULT_EPS
    tree: str = "auto"
    fanout: int = 16
    priority_dtype: str = "float32"
    stratified: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalised values are set once, here
        set_(self, "alpha", check_alpha(self.alpha))
        set_(self, "beta", check_beta(self.beta))
        set_(self, "eps", check_eps(self.eps))
        if not isinstance(self.tree, str):
            raise TypeError(f"tree must be a backend name, got {type(self.tree).__name__} {self.tree!r}")
        set_(self, "fanout", check_fanout(self.fanout))
        set_(self, "priority_dtype", check_priority_dtype(self.priority_dtype).name)
        set_(self, "stratified", check_bool(self.stratified, "stratified"))
        check_floor(self.alpha, self.eps, np.dtype(self.priority_dtype))

    def replace(self, **changes: Any) -> PEROptions:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, options: PEROptions | None = None, **changes: Any) -> PEROptions:
        """``options`` (default: the defaults) with the keyword arguments given (not :data:`UNSET`).

        How buffers take ``alpha=...`` etc. and an ``options=`` object at once.
        """
        if options is not None and not isinstance(options, PEROptions):
            raise TypeError(f"options must be a PEROptions, got {type(options).__name__}")
        base = options if options is not None else cls()
        given = {k: v for k, v in changes.items() if v is not UNSET}
        return base.replace(**given) if given else base

    @classmethod
    def from_config(cls, config: Any, tree: str = "auto") -> PEROptions:
        """The options a saved buffer's ``config`` records (see :mod:`hetero_replay.storage.checkpoint`), with backend ``tree``."""
        keys = ("alpha", "beta", "eps", "fanout", "priority_dtype", "stratified")
        return cls(tree=tree, **{k: config[k] for k in keys})


# -- checks, shared by the options and the setters that change them later ------------------


def check_alpha(value: Any) -> float:
    """``value`` as the priority exponent: a finite real number ``>= 0``."""
    return check_real(value, "alpha", low=0)


def check_beta(value: Any) -> float:
    """``value`` as the IS-weight exponent: a real number in ``[0, 1]``."""
    return check_real(value, "beta", 0, 1)


def check_eps(value: Any) -> float:
    """``value`` as the TD-error offset: a finite real number ``>= 0``."""
    return check_real(value, "eps", low=0)


def check_floor(alpha: float, eps: float, dtype: np.dtype) -> None:
    """Refuses ``(alpha, eps)`` whose smallest priority ``eps ** alpha`` rounds to 0 in ``dtype``:
    a transition with TD error 0 would then never be sampled again."""
    (floor,), _ = _native.td_priorities(np.zeros(1), alpha, eps, dtype)  # the trees' own arithmetic
    if eps > 0 and floor == 0:
        raise ValueError(
            f"eps ** alpha = {eps!r} ** {alpha!r} underflows to 0 in {dtype}: a transition whose TD error "
            f"is 0 could never be sampled again; raise eps or lower alpha"
        )


#: Where a relaxed schedule's work runs (see :class:`StalenessOptions`).
WORKER_MODES = ("auto", "native", "thread", "inline")


@dataclass(frozen=True)
class StalenessOptions:
    """How far priority updates may lag behind sampling: validated on construction, immutable.

    The rule these options parametrise lives in :mod:`hetero_replay.schedule`.

    Args:
        staleness: ``k``, learner steps a priority update may lag: the batch of
            step ``t`` sees the updates of steps ``<= t - k - 1``. ``0`` is
            strict PER. At most :data:`~hetero_replay.checks.MAX_STALENESS`; an
            executor that supports less (the sharded replay's: 2) says so.
        prefetch: batches prepared ahead of the learner, ``>= 1`` (at most
            ``staleness`` can be: the updates later ones need are not given yet).
        worker: where a local buffer's schedule runs: ``"native"``, a C++
            thread that holds no GIL (C++ tree, host storage); ``"thread"``, a
            Python worker thread; ``"inline"``, the learner's thread (same
            batches, no overlap); ``"auto"``, native where it applies, else
            inline until the replay work is a sizeable share of the learner's
            step, then the Python thread. The batches are the same in every
            mode: only the speed differs.

    Wrong types raise ``TypeError``, values out of range ``ValueError``, each
    naming the argument.
    """

    staleness: int = 0
    prefetch: int = 1
    worker: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "staleness", check_staleness(self.staleness))
        object.__setattr__(self, "prefetch", check_int(self.prefetch, "prefetch", 1, MAX_STALENESS))
        if not isinstance(self.worker, str) or self.worker not in WORKER_MODES:
            raise ValueError(f"worker must be one of {WORKER_MODES}, got {self.worker!r}")

    @property
    def depth(self) -> int:
        """Batches that can really be drawn ahead: ``min(prefetch, staleness)``."""
        return min(self.prefetch, self.staleness)


__all__ = ["DEFAULT_EPS", "UNSET", "PEROptions", "StalenessOptions", "WORKER_MODES"]
