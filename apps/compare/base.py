"""What a comparison run is, what it measures, and where each library's runner registers.

A *runner* trains one algorithm on one environment with one replay *variant*
(e.g. SB3's stock uniform buffer vs our prioritized one) for one seed, and
returns a :class:`RunResult`. Runners live next to this file, one per host
library (``sb3_runs.py``, ``tianshou_runs.py``); the comparison driver and the
report know only this interface.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunSpec:
    """One training run: library, algorithm, env, replay variant, seed and budget."""

    lib: str  # "sb3" | "tianshou"
    algo: str  # "dqn" | "ddpg" | "td3" | "sac" | a runner's extra algorithm
    env_id: str  # a gymnasium id, e.g. "CartPole-v1"
    variant: str  # a name from the runner's variants, e.g. "uniform" | "per"
    seed: int
    steps: int  # environment steps to train for
    eval_every: int  # environment steps between evaluations
    eval_episodes: int = 5
    n_envs: int = 1
    torch_threads: int = 1
    staleness: int | None = None  # a relaxed-pipeline staleness (a sweep); None: the variant's default (exact PER)
    n_steps: int = 1  # n-step returns, for every variant alike

    @property
    def label(self) -> str:
        """The variant, and its staleness when the comparison sweeps it (``"per k=2"``)."""
        return self.variant if self.staleness is None else f"{self.variant} k={self.staleness}"


@dataclass
class RunResult:
    """What one run measured. Throughput counts the training loop only (no evaluation)."""

    spec: RunSpec
    wall_s: float  # whole run, evaluations included
    train_s: float  # training loop only
    eval_steps: list[int] = field(default_factory=list)  # env steps at each evaluation
    eval_returns: list[float] = field(default_factory=list)  # mean episode return there
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. final beta, max priority

    @property
    def env_steps_per_s(self) -> float:
        return self.spec.steps / self.train_s if self.train_s > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "env_steps_per_s": self.env_steps_per_s}


#: ``runner(spec, progress)``; ``progress(n)`` reports n more env steps done.
Runner = Callable[[RunSpec, Callable[[int], None]], RunResult]


@dataclass(frozen=True)
class LibraryRunner:
    lib: str
    variants: tuple[str, ...]  # in report order; the first is the baseline
    algos: tuple[str, ...]
    run: Runner
    relaxable: tuple[str, ...] = ()  # the variants that take a staleness (their PER buffers)
    n_step: bool = False  # whether its runs take n-step returns (RunSpec.n_steps > 1)
    defaults: tuple[str, ...] = ()  # the variants run when none are named (empty: all)


_RUNNERS: dict[str, LibraryRunner] = {}


def register_runner(
    lib: str,
    variants: Sequence[str],
    algos: Sequence[str],
    run: Runner,
    relaxable: Sequence[str] = (),
    n_step: bool = False,
    defaults: Sequence[str] = (),
) -> None:
    """Make ``lib`` available to ``hetero-replay compare --lib <lib>``; ``relaxable`` variants take ``--staleness``,
    with ``n_step`` every variant takes ``--n-steps``, and ``defaults`` (default: all variants) run when
    ``--variants`` names none (the others, e.g. a study's, only when named)."""
    _RUNNERS[lib] = LibraryRunner(lib, tuple(variants), tuple(algos), run, tuple(relaxable), n_step, tuple(defaults))


def runner_for(lib: str) -> LibraryRunner:
    """The registered runner of ``lib`` (importing its module on first use)."""
    if lib not in _RUNNERS:
        import importlib

        try:
            importlib.import_module(f"hetero_replay.apps.compare.{lib}_runs")
        except ModuleNotFoundError as e:
            if e.name == f"hetero_replay.apps.compare.{lib}_runs":
                raise ValueError(f"unknown library {lib!r}; choose 'sb3' or 'tianshou'") from e
            raise
    return _RUNNERS[lib]
