"""The replay contract: :class:`Replay`, what every prioritized replay offers, and :class:`Sample`.

:class:`~hetero_replay.PrioritizedReplay` (one buffer in this process),
:class:`~hetero_replay.RelaxedReplay` (a replay driven by the staleness
schedule) and :class:`~hetero_replay.ShardedReplay` (shards on Ray actors)
implement it. The adapters are written against it and never ask which one they
hold; a new kind of replay (a remote service, a GPU-resident one) that
implements it works under both adapters unchanged.

A replay that cannot offer an operation still has it and raises ``TypeError``
saying why (a sharded replay has no array view of rows that live on other
processes), so that a host library's call fails with a reason, not an
``AttributeError``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from hetero_replay.options import PEROptions
from hetero_replay.storage import Schema


class Sample(NamedTuple):
    """A sampled batch: ``data[field]`` rows, their replay ``indices``, IS ``weights``.

    NumPy arrays from a host replay; torch tensors when the replay serves a
    torch learner (``data`` and ``weights`` on the replay's ``device``,
    ``indices`` where the tree is, ready for ``update_priorities``).
    """

    data: dict[str, Any]
    indices: Any
    weights: Any


@runtime_checkable
class Replay(Protocol):
    """A prioritized replay: transitions with priorities, sampled ``p_i^alpha / sum p^alpha``.

    The PER options (``alpha``, ``beta``, ``eps``, the tree...) are
    :class:`~hetero_replay.options.PEROptions`; IS weights are normalised by the
    global maximum weight. Every method may be called from several threads.
    """

    # -- size and settings -------------------------------------------------------------------

    @property
    def options(self) -> PEROptions:
        """The PER options the replay was built with (``alpha``, ``beta``, ``eps`` below are the current values)."""
        ...

    @property
    def schema(self) -> Schema:
        """The fields of a transition."""
        ...

    @property
    def rng(self) -> np.random.Generator:
        """The generator the draws come from: the same seed and calls give the same samples."""
        ...

    @property
    def capacity(self) -> int:
        """Transitions kept at most; the oldest is overwritten first."""
        ...

    @property
    def filled(self) -> int:
        """Slots written so far, at most ``capacity``."""
        ...

    @property
    def position(self) -> int:
        """Where the next added transition goes (in a ring of ``capacity`` slots)."""
        ...

    def __len__(self) -> int:
        """Transitions that can be sampled."""
        ...

    @property
    def alpha(self) -> float:
        """Priority exponent."""
        ...

    @property
    def eps(self) -> float:
        """Added to every ``|TD error|``."""
        ...

    @property
    def beta(self) -> float:
        """IS-weight exponent used when :meth:`sample` is given none; settable (annealing)."""
        ...

    @beta.setter
    def beta(self, value: float) -> None: ...

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` seen so far: new transitions get it."""
        ...

    @property
    def device(self) -> Any:
        """The torch device batches are delivered to, or ``None`` for NumPy batches."""
        ...

    @property
    def dropped_updates(self) -> int:
        """Update entries skipped because their slot was rewritten after the batch was drawn (0 when strict)."""
        ...

    # -- the operations ----------------------------------------------------------------------

    def add(self, batch: Mapping[str, Any]) -> Any:
        """Append a batch of transitions ``{field: (n, ...)}`` with the max priority; nothing on error."""
        ...

    def writer(self) -> Any:
        """A picklable handle other processes add with (``TypeError`` where the rows live in this process)."""
        ...

    def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions with their indices and IS weights."""
        ...

    def update_priorities(self, indices: Any, td_errors: Any) -> None:
        """New priorities ``(|td| + eps) ** alpha`` for sampled ``indices``; nothing on error."""
        ...

    def clear_priorities(self, indices: Any) -> None:
        """Priority 0 at ``indices``: not drawn until written or updated again."""
        ...

    def leaves(self) -> np.ndarray:
        """The sampling priorities ``p^alpha`` of every slot, in slot order (updates held back applied first)."""
        ...

    # -- rows, for host libraries that expose their arrays -------------------------------------

    def read_rows(self, name: str, indices: Any) -> Any:
        """Rows ``indices`` of field ``name``."""
        ...

    def write_rows(self, start: int, fields: Mapping[str, Any]) -> None:
        """Overwrite some fields of the rows at ring positions ``start, start + 1, ...``."""
        ...

    def view(self, name: str) -> Any:
        """A live view of field ``name`` over all slots (``NotImplementedError``/``TypeError`` where none exists)."""
        ...

    # -- persistence (see the glossary in docs/architecture.md) -------------------------------

    def flush(self) -> None:
        """Apply every priority update held back, and make a durable point where the replay makes them."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where the replay is (copies)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; on error the replay is left as it was."""
        ...

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the whole replay to one file, atomically."""
        ...

    def close(self) -> None:
        """Release what the replay holds (threads, files, shared memory, actors); again, nothing."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        ...


__all__ = ["Replay", "Sample"]
