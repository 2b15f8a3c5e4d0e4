"""The replay implementations under test ("contenders") and the workload they share.

Every contender wraps one library's replay buffer behind the same small set of
methods (:class:`Contender`), each calling that library's public API the way
its users would: its own batched add path, its own ``sample`` (data gather and
IS weights included), its own priority update. The harness in
``bench_replay.py`` only ever talks to this interface.

Adding a library or a backend is one factory function — ``(capacity,
workload) -> list of contenders`` — listed in :func:`factories` (a CUDA
variant would be a factory that returns nothing, or raises, when
``torch.cuda.is_available()`` is false). A factory
that raises (library missing, extension that does not build) is reported as
"unavailable (reason)" and the run goes on without it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

#: ``ours``: a hetero-replay backend; ``anchor``: a PER library we compare with;
#: ``uniform``: SB3's buffer without priorities (the "PER for free" reference).
Role = Literal["ours", "anchor", "uniform"]

#: A LunarLander-like transition: field -> (shape, dtype).
SCHEMA: dict[str, tuple[tuple[int, ...], type]] = {
    "obs": ((8,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((8,), np.float32),
    "done": ((), np.float32),
}
OBS_DIM = 8
N_ACTIONS = 4


@dataclass(frozen=True)
class Workload:
    """PER hyper-parameters every prioritized contender is built with."""

    alpha: float = 0.6
    beta: float = 0.4
    eps: float = 1e-6


def make_transitions(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` random transitions in :data:`SCHEMA` layout (numpy, C-contiguous)."""
    return {
        "obs": rng.standard_normal((n, OBS_DIM), dtype=np.float32),
        "action": rng.integers(0, N_ACTIONS, n, dtype=np.int64),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, OBS_DIM), dtype=np.float32),
        "done": (rng.random(n) < 0.01).astype(np.float32),
    }


class Contender(ABC):
    """One replay buffer of fixed capacity, driven through its library's public API.

    Attributes:
        label: column name in the tables, unique within a run.
        library: the package measured (its version goes into the output).
        role: see :data:`Role`.
        setup: one line on how the buffer is built and filled, for the report.
        prioritized: ``False`` for a uniform buffer: no priority update, and
            its learner step is its sample alone.
        threads: the thread count this contender is pinned to, where the
            library has such a setting (ours); ``None`` otherwise.
        profile_parts: names of the calls :meth:`profile_ops` returns.
        owns_buffer: ``False`` for a second view of a buffer another contender
            fills (ours on all cores); the harness then skips its :meth:`fill`.
    """

    label: str
    library: str
    role: Role
    setup: str
    prioritized: bool = True
    threads: int | None = None
    profile_parts: tuple[str, ...] = ()
    owns_buffer: bool = True

    def activate(self) -> None:  # noqa: B027 - an optional hook: most contenders need none
        """Called before every timed repeat; e.g. sets this contender's thread count."""

    @abstractmethod
    def fill(self, data: Mapping[str, np.ndarray]) -> None:
        """Add ``data`` (capacity rows) through the library's fastest batched add path."""

    @abstractmethod
    def prepare_insert(self, chunk: Mapping[str, np.ndarray]) -> Any:
        """Convert a chunk of transitions to the library's input form, outside the timing."""

    @abstractmethod
    def insert(self, prepared: Any) -> None:
        """Add one prepared chunk (the timed insert)."""

    @abstractmethod
    def sample(self, batch_size: int) -> Any:
        """Draw a batch, with the data gathered and the IS weights computed."""

    def indices(self, sample: Any) -> Any:
        """The buffer indices inside a :meth:`sample` result, as :meth:`update` takes them."""
        raise NotImplementedError(f"{self.label} has no priorities")

    def prepare_td(self, td: np.ndarray) -> Any:
        """``|TD error|`` in the form the learner would hand over (numpy unless overridden)."""
        return td

    def update(self, indices: Any, td: Any) -> None:
        """Set the priorities of ``indices`` from ``|TD error|`` ``td``."""
        raise NotImplementedError(f"{self.label} has no priorities")

    def profile_ops(self, batch_size: int, td: np.ndarray) -> dict[str, Callable[[], Any]]:
        """The parts of a learner step (:attr:`profile_parts`) as separately timeable calls."""
        return {}

    def close(self) -> None:  # noqa: B027 - an optional hook: most contenders need none
        """Drop the buffer so its memory can be reused by the next capacity."""


#: ``(capacity, workload) -> contenders``; the name is used when it is unavailable.
Factory = Callable[[int, Workload], list[Contender]]


def factories() -> list[tuple[str, Factory]]:
    """Every contender factory, ours first, then the anchors, then the uniform reference.

    Imports are deferred to the factory modules so that a missing library
    only removes its own column.
    """
    from contenders import cpprb_per, hetero, sb3_uniform, tianshou_per, torchrl_per

    return [
        *hetero.factories(),
        ("cpprb", cpprb_per.make),
        ("torchrl", torchrl_per.make),
        ("tianshou", tianshou_per.make),
        ("stable-baselines3", sb3_uniform.make),
    ]
