"""What the advisor asks of a host library: the workload protocol, replay configurations, candidates.

A *workload* is one training setup of one host library (algorithm, environment,
network, batch size ``B``, buffer size ``N``, number of envs). The advisor
itself never imports Stable-Baselines3 or Tianshou: each adapter provides a
workload (``hetero_replay.adapters.sb3.workload``,
``hetero_replay.adapters.tianshou.workload``) that times the host library's
own steps and trains end to end for validation. :func:`make_workload` finds
them by library name, the way Gymnasium finds an environment's entry point.

A :class:`ReplayConfig` is what the replay primitives (insert, sample, update)
depend on: tree backend, its threads, storage, and the learner device batches
go to. A :class:`Candidate` adds the staleness of the relaxed pipeline; it is
one point of the design space the advisor ranks.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Protocol, runtime_checkable

from hetero_replay.placement import Placement
from hetero_replay.registry import install_hint

#: Host library -> ``"module:function"`` building its workload (imported only when asked for).
LIBRARIES: dict[str, str] = {
    "sb3": "hetero_replay.adapters.sb3.workload:make_workload",
    "tianshou": "hetero_replay.adapters.tianshou.workload:make_workload",
}
#: The algorithms every host library's workload offers.
ALGOS = ("dqn", "ddpg", "td3", "sac")


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What identifies a workload: the profile cache's key and the report's title.

    Attributes:
        lib: host library, ``"sb3"`` or ``"tianshou"``.
        algo: ``"dqn"``, ``"ddpg"``, ``"td3"`` or ``"sac"``.
        env: gymnasium environment id.
        batch_size: ``B``, transitions per gradient step.
        buffer_size: ``N``, transitions the replay holds.
        n_envs: environments stepped together (one collect step = ``n_envs`` env steps).
        collect_steps: collect steps between two training phases (SB3's ``train_freq``).
        gradient_steps: gradient steps per training phase.
        network: the policy's network, as the host library describes it (for the report and the cache key).
    """

    lib: str
    algo: str
    env: str
    batch_size: int
    buffer_size: int
    n_envs: int = 1
    collect_steps: int = 1
    gradient_steps: int = 1
    network: str = ""

    @property
    def gradient_steps_per_env_step(self) -> float:
        """Gradient steps per environment step: ``gradient_steps / (collect_steps * n_envs)``."""
        return self.gradient_steps / (self.collect_steps * self.n_envs)

    def title(self) -> str:
        return (
            f"{self.lib} {self.algo.upper()} {self.env}, B={self.batch_size}, N={self.buffer_size:,}, "
            f"{self.n_envs} env{'s' if self.n_envs > 1 else ''}"
        )

    def same_setup(self, other: WorkloadSpec) -> bool:
        """Whether ``other`` is the same training setup (the network's description aside)."""
        return dataclasses.replace(self, network="") == dataclasses.replace(other, network="")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadSpec:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclasses.dataclass(frozen=True, order=True)
class ReplayConfig:
    """What the replay primitives' speed depends on.

    Attributes:
        tree: a registered tree backend (``"native"``, ``"numpy"``, ``"torch"``, ``"cupy"``, ...).
        threads: threads of a threaded backend (:func:`hetero_replay.set_num_threads`); 1 otherwise.
        storage: ``"host"``, ``"pinned"``, another registered storage, or a device (``"cpu"``, ``"cuda:0"``).
        tree_device: where the tree runs (``sample`` and ``update``).
        learner: where the network trains and acts (``train`` and ``inference``).
        label: which modelled device this is, for a configuration an analytical model
            predicts (:mod:`~hetero_replay.advisor.devices`: the FPGA part and its clock);
            empty for what is measured here.
    """

    tree: str
    threads: int
    storage: str
    tree_device: str = "cpu"
    learner: str = "cpu"
    label: str = ""

    @property
    def key(self) -> str:
        """A short unique name: ``"native x2 | host | tree cpu | learner cpu"`` (``"fpga [label] | ..."`` when modelled)."""
        threads = f" x{self.threads}" if self.threads > 1 else ""
        label = f" [{self.label}]" if self.label else ""
        return f"{self.tree}{threads}{label} | {self.storage} | tree {self.tree_device} | learner {self.learner}"

    def placement(self, check: bool = False) -> Placement:
        """The :class:`~hetero_replay.placement.Placement` placing the primitives this way."""
        return Placement(
            inference=self.learner, sample=self.tree_device, update=self.tree_device,
            train=self.learner, storage=self.storage, tree=self.tree, check=check,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.label:
            del data["label"]  # measured configurations keep the file layout they always had
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplayConfig:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name != "label" or f.name in data})


@dataclasses.dataclass(frozen=True, order=True)
class Candidate:
    """One point of the design space: a replay configuration and a staleness.

    Attributes:
        replay: the placement of the replay primitives and the learner.
        staleness: learner steps a priority update may lag behind sampling
            (:class:`hetero_replay.pipeline.RelaxedReplay`); 0 is strict PER.
    """

    replay: ReplayConfig
    staleness: int = 0

    @property
    def placement(self) -> Placement:
        return self.replay.placement(check=False)

    @property
    def threads(self) -> int:
        return self.replay.threads

    @property
    def label(self) -> str:
        return f"{self.replay.key} | {'strict' if self.staleness == 0 else f'relaxed k={self.staleness}'}"

    def to_dict(self) -> dict[str, Any]:
        return {"replay": self.replay.to_dict(), "staleness": self.staleness}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        return cls(ReplayConfig.from_dict(data["replay"]), int(data["staleness"]))


@runtime_checkable
class Workload(Protocol):
    """A host library's training setup, as the advisor times and validates it.

    Every method builds what it times from scratch (a fresh model and buffer)
    and leaves global state (random generators, thread settings) as it found
    it. ``timer`` is a :class:`~hetero_replay.advisor.profile.Timer`:
    ``timer(fn)`` warms ``fn`` up and returns the median of its repetitions,
    ``timer.in_loop(step, clock)`` also times each call the
    :class:`~hetero_replay.advisor.profile.Clock` watches inside ``step``.
    """

    spec: WorkloadSpec

    def time_host(self, learner: str, reference: ReplayConfig, timer: Any) -> dict[str, Any]:
        """Time the host library's own steps on ``learner`` with the ``reference`` replay.

        Returns:
            ``{"env_step", "inference", "collect", "learn", "phase", "phase_inline"}``
            as :class:`~hetero_replay.advisor.profile.Timing`: one vectorised env
            step and one policy forward for ``n_envs`` observations, each timed
            alone (for the breakdown); then, timed inside the host library's own
            training loop in steady state (:func:`~hetero_replay.advisor.profile.measure_in_loop`):
            one collect step, one gradient step, one whole training phase
            (``collect_steps`` collect steps, then ``gradient_steps`` gradient
            steps), and a phase with staleness 1 on the learner's thread
            (``worker="inline"``).
        """
        ...

    def time_replay(self, config: ReplayConfig, timer: Any) -> dict[str, Any]:
        """Time the replay primitives of ``config``, in a buffer of ``N`` rows filled to its capacity.

        Returns:
            ``{"insert", "sample", "update", "phase_relaxed"}`` as ``Timing``,
            each timed per call inside the host library's training loop:
            adding one collect step's rows; drawing ``B`` rows with IS weights,
            delivered on the learner device as the host library's batch;
            writing ``B`` priorities from TD errors on the learner device; and
            one training phase with staleness 1 and ``worker="auto"``, once it
            has decided (``None`` where the adapter has no worker thread), with
            ``"worker"``: ``"thread"`` or ``"inline"``, what it decided.
            Optionally ``"engine_work"``: the core engine's own sample and
            update of a gradient step.
        """
        ...

    def run(self, candidate: Candidate, env_steps: int) -> float:
        """Train with ``candidate`` in the real adapter; env steps per second over ``env_steps`` timed steps.

        The buffer starts filled as in :meth:`time_replay` and the run is in
        steady state (exploration at its final rate) before the clock starts.
        """
        ...


def make_workload(lib: str, **kwargs: Any) -> Workload:
    """The workload of host library ``lib`` (``"sb3"``, ``"tianshou"``) built from ``kwargs``.

    Raises:
        ValueError: an unknown ``lib``.
        ImportError: the host library is not installed (naming the extra).
    """
    if lib not in LIBRARIES:
        raise ValueError(f"lib must be one of {tuple(LIBRARIES)}, got {lib!r}")
    module_name, _, function = LIBRARIES[lib].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"advising for {lib} needs it installed: {install_hint(lib)} ({e})") from e
    workload: Workload = getattr(module, function)(**kwargs)
    return workload


__all__ = ["ALGOS", "LIBRARIES", "Candidate", "ReplayConfig", "Workload", "WorkloadSpec", "make_workload"]
