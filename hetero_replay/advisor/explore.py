"""Design-space exploration: every valid placement from the registry, ranked by the model.

:func:`replay_configs` enumerates what this machine can run: every usable tree
backend on every present device it runs on, every usable storage, every
learner device, and for threaded backends and storages each thread count up
to the cores. :func:`candidates` adds the staleness values; :func:`rank`
predicts each and sorts them, fastest first, tagging the best, the default
(what a user gets without a placement) and the baseline (the slowest sensible
placement: the NumPy tree, one thread, host storage, a CPU learner, strict PER).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Iterable, Sequence

from hetero_replay import _native, registry
from hetero_replay.advisor.model import Prediction, predict
from hetero_replay.advisor.profile import MODELLED, Profile
from hetero_replay.advisor.workload import Candidate, ReplayConfig
from hetero_replay.placement import HOST, PINNED, DeviceUnavailableError, Placement

#: The baseline's tree backend: the NumPy reference, the slowest sensible choice.
BASELINE_TREE = "numpy"
#: Predictions this close to the fastest count as a tie (the model is not more precise than that).
TIE = 0.005


@dataclasses.dataclass
class Row:
    """One ranked candidate: the prediction and, after validation, the measurement.

    Attributes:
        candidate: the placement and staleness.
        predicted: predicted env steps per second.
        learner_steps: predicted gradient steps per second.
        breakdown: predicted seconds per env step by part (:data:`~hetero_replay.advisor.model.PARTS`).
        worker: where a relaxed pipeline's work runs (``"none"``, ``"inline"``, ``"thread"``).
        predicted_only: its replay times come from an analytical model, not a measurement.
        measured: env steps per second measured end to end (``--validate``), else ``None``.
        measured_spread: lowest and highest of the measured repetitions.
        tags: ``"best"``, ``"default"``, ``"baseline"``.
    """

    candidate: Candidate
    predicted: float
    learner_steps: float
    breakdown: dict[str, float]
    worker: str
    predicted_only: bool = False
    measured: float | None = None
    measured_spread: tuple[float, float] | None = None
    tags: set[str] = dataclasses.field(default_factory=set)

    @property
    def error(self) -> float | None:
        """``(predicted - measured) / measured``, or ``None`` before validation."""
        return None if self.measured is None else (self.predicted - self.measured) / self.measured


def learner_devices() -> list[str]:
    """The devices a learner can train on here: the CPU, then each CUDA device torch sees."""
    devices = ["cpu"]
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return devices


def thread_counts(cores: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the cores this process may use, and the core count itself."""
    cores = cores or _cores()
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return [*counts, cores]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_config(learner: str | None = None) -> ReplayConfig:
    """What a user gets without a placement: the "auto" tree on the CPU, host storage, the default threads."""
    learner = learner or learner_devices()[-1]  # SB3's device="auto": a GPU when there is one
    tree = Placement(check=False).tree_backend
    return ReplayConfig(tree, _native.num_threads() if _threaded(tree, HOST) else 1, HOST, "cpu", learner)


def baseline_config() -> ReplayConfig:
    """The slowest sensible configuration: the NumPy tree, one thread, host storage, a CPU learner."""
    return ReplayConfig(BASELINE_TREE, 1, HOST, "cpu", "cpu")


def replay_configs(learners: Sequence[str] | None = None, threads: Sequence[int] | None = None) -> list[ReplayConfig]:
    """Every replay configuration this machine can run, each learner's default configuration first.

    Args:
        learners: learner devices (default: :func:`learner_devices`).
        threads: thread counts for threaded backends and storages (default: :func:`thread_counts`).
    """
    learners = list(learners or learner_devices())
    threads = sorted(set(threads or thread_counts()))
    present = [*learners, *_other_devices()]
    configs: list[ReplayConfig] = []
    for learner in learners:
        default = default_config(learner)
        found = [default]
        for tree in registry.backends():
            spec = registry.backend_spec(tree)
            for tree_device in (d for d in present if spec.runs_on(d)):
                if tree_device not in ("cpu", learner) and registry.is_torch_device(tree_device):
                    continue  # a tree on one GPU feeding a learner elsewhere: never the faster choice
                for storage in _storages(learner, tree_device):
                    counts = threads if _threaded(tree, storage) else [1]
                    for n in counts:
                        config = ReplayConfig(tree, n, storage, tree_device, learner)
                        if config not in found and _valid(config):
                            found.append(config)
        configs += found
    return configs


def _other_devices() -> list[str]:
    """Present devices of a type a plugin registered (e.g. ``"fpga:0"``), besides CPU and CUDA."""
    devices = []
    for kind in registry.device_types():
        if kind not in ("cpu", "cuda") and registry.device_available(kind)[0]:
            devices.append(f"{kind}:0")
    return devices


def _storages(learner: str, tree_device: str) -> list[str]:
    """Storages worth trying: host memory, torch tensors on the CPU, and near an accelerator learner or tree."""
    names = [HOST, "cpu"]
    if learner != "cpu":
        names += [PINNED, learner]
    if tree_device not in names and registry.is_torch_device(tree_device):
        names.append(tree_device)
    usable = set(registry.storages())
    return [n for n in names if _storage_usable(n, usable)]


def _storage_usable(placement: str, usable: set[str]) -> bool:
    try:
        return registry.storage_for(placement).name in usable
    except ValueError:
        return False


def _threaded(tree: str, storage: str) -> bool:
    try:
        return registry.backend_spec(tree).threaded or registry.storage_for(storage).threaded
    except ValueError:
        return False


def _valid(config: ReplayConfig) -> bool:
    try:
        config.placement(check=True)
    except (ValueError, DeviceUnavailableError, ImportError):
        return False
    return True


def candidates(profile: Profile, staleness: Iterable[int] = (0, 1)) -> list[Candidate]:
    """Every profiled replay configuration with every staleness."""
    return [Candidate(entry.config, k) for entry in profile.replay for k in sorted(set(staleness))]


def rank(profile: Profile, staleness: Iterable[int] = (0, 1)) -> list[Row]:
    """Predict every candidate and sort them by predicted env steps/s, fastest first; tag best, default, baseline.

    Near-ties (within :data:`TIE` of the fastest) go to the smaller
    staleness, then fewer threads: the same speed with fresher priorities and
    fewer cores busy. The best is a placement this machine runs: a device that
    is only modelled (:attr:`Row.predicted_only`) is ranked by its prediction
    but never tagged best, so ``advice.best`` can always be applied.
    """
    staleness = sorted(set(staleness))
    rows = []
    for candidate in candidates(profile, staleness):
        prediction: Prediction = predict(profile, candidate)
        rows.append(
            Row(
                candidate=candidate,
                predicted=prediction.env_steps_per_s,
                learner_steps=prediction.learner_steps_per_s,
                breakdown=prediction.breakdown,
                worker=prediction.worker,
                predicted_only=profile.entry(candidate.replay).source == MODELLED,
            )
        )
    if not rows:
        raise ValueError("the profile holds no replay configuration to rank")
    rows.sort(key=lambda r: -r.predicted)
    runnable = [r for r in rows if not r.predicted_only] or rows
    near_top = [r for r in runnable if r.predicted >= (1 - TIE) * runnable[0].predicted]
    best = min(near_top, key=lambda r: (r.candidate.staleness, r.candidate.threads, -r.predicted))
    rows.remove(best)
    rows.insert(0, best)
    best.tags.add("best")
    for tag, config in (("default", _profiled_default(profile)), ("baseline", _profiled_baseline(profile))):
        for row in rows:
            if config is not None and row.candidate == Candidate(config, 0):
                row.tags.add(tag)
    return rows


def _profiled_default(profile: Profile) -> ReplayConfig | None:
    """The profile's default configuration: the reference of its last learner device (a GPU if profiled)."""
    learners = list(profile.host)
    return profile.reference(learners[-1]) if learners else None


def _profiled_baseline(profile: Profile) -> ReplayConfig | None:
    """The NumPy-tree, one-thread, host, CPU-learner entry; else the slowest strict CPU-learner entry measured."""
    wanted = baseline_config()
    entries = [e.config for e in profile.replay if e.source != MODELLED]
    if wanted in entries:
        return wanted
    cpu = [c for c in entries if c.learner == "cpu"]
    if not cpu:
        return None
    return min(cpu, key=lambda c: predict(profile, Candidate(c, 0)).env_steps_per_s)


__all__ = [
    "BASELINE_TREE",
    "TIE",
    "Row",
    "baseline_config",
    "candidates",
    "default_config",
    "learner_devices",
    "rank",
    "replay_configs",
    "thread_counts",
]
