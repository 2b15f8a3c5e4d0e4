"""Profile: how long each primitive takes on this machine, per device and replay configuration.

:func:`measure` times one primitive: it warms it up, picks how many calls make
one repetition last at least :data:`MIN_REPETITION_S` (so microsecond
primitives are not lost in the clock's resolution), and keeps the median of
``repeats`` repetitions (at least 20) with its quartiles.

:func:`collect` builds a :class:`Profile` from a workload: the host library's
own steps once per learner device (env step, inference, collect step, gradient
step), the replay primitives once per :class:`~hetero_replay.advisor.workload.ReplayConfig`
(insert, sample, update, a training phase relaxed). A profile is a
JSON file: :func:`cached` keeps one per workload, machine and library version
under the user's cache directory (``$HETERO_REPLAY_CACHE``, else
``$XDG_CACHE_HOME/hetero-replay``, else ``~/.cache/hetero-replay``), so a
second ``advise`` of the same setup is instant, and :meth:`Profile.load`
reads one made on another machine (plan for a GPU box from a laptop).

Replay entries whose ``source`` is ``"model"`` come from an analytical model
of a device instead of a measurement (e.g. an FPGA's cycle model); the ranking
marks them "predicted only".
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hetero_replay.advisor.workload import ReplayConfig, Workload, WorkloadSpec
from hetero_replay.storage.files import private_directory, read_regular_file, replace_file

#: Bumped when the file layout changes; older files are re-measured, not misread.
FORMAT = 1
#: The largest profile file read (a profile is tens of KB): a bigger one is refused, not read into memory.
MAX_PROFILE_BYTES = 64 << 20
#: Repetitions per primitive (the median is kept).
REPEATS = 20
#: Untimed calls before the clock starts (caches, allocator, lazy initialisation).
WARMUP = 3
#: A repetition calls the primitive until it lasts at least this long.
MIN_REPETITION_S = 2e-4
#: ... and a host library's step this long: a repetition then spans episode ends, log dumps and
#: other periodic work in proportion, so its median is the mean cost a long run pays.
HOST_REPETITION_S = 0.02
#: Host-library steps a workload returns from ``time_host``, and replay primitives from ``time_replay``.
HOST_STEPS = ("env_step", "inference", "collect", "learn", "phase", "phase_inline")
REPLAY_STEPS = ("insert", "sample", "update", "phase_relaxed")
#: Replay steps a workload may add: the core engine's own sample + update of a gradient step
#: (what the pipeline's worker="auto" weighs; without it, sample + update stand in).
OPTIONAL_REPLAY_STEPS = ("engine_work",)
#: Where a replay entry's times come from.
MEASURED, MODELLED = "measured", "model"


class ProfileError(ValueError):
    """A profile file cannot be read as a profile (names the file and what is wrong)."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call of one primitive: median, quartiles and mean of ``n`` repetitions.

    The model predicts throughput, which the *mean* time sets: a host
    library's phases are skewed to the right (garbage collection, episode
    ends, log dumps, a busy neighbour), so their median under-states what a
    long run pays (by ~10% on the validation's workloads). :attr:`expected` is
    the mean where known.
    """

    median: float
    q1: float
    q3: float
    n: int
    calls: int = 1  # calls per repetition
    mean: float | None = None

    @property
    def expected(self) -> float:
        """The mean where known, else the median."""
        return self.median if self.mean is None else self.mean

    def per(self, calls: int) -> Timing:
        """This timing of ``calls`` calls of something (a step of ``calls`` primitive calls), as the time of one."""
        if calls == 1:
            return self
        d = calls
        return Timing(self.median / d, self.q1 / d, self.q3 / d, self.n, self.calls * d, self.expected / d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timing:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    @classmethod
    def of(cls, seconds: float) -> Timing:
        """A timing that is a single number (from a model, or a test)."""
        return cls(seconds, seconds, seconds, 1)


def measure(
    fn: Callable[[], Any],
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    min_repetition_s: float = MIN_REPETITION_S,
    sync: Callable[[], Any] | None = None,
) -> Timing:
    """Time ``fn()``: warm-up calls, then the median over ``repeats`` repetitions.

    Args:
        fn: the primitive, called with no arguments.
        repeats: repetitions timed (at least 1; the advisor uses 20).
        warmup: untimed calls first.
        min_repetition_s: a repetition makes as many calls as it takes to last
            this long (measured on the warm-up), and reports the time per call.
        sync: called before each clock reading (e.g. ``torch.cuda.synchronize``)
            so asynchronous device work is counted.

    Returns:
        The :class:`Timing` in seconds per call.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    sync = sync or _nothing
    start = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn()
    sync()
    per_call = (time.perf_counter() - start) / max(warmup, 1)
    calls = max(1, min(1000, int(min_repetition_s / max(per_call, 1e-9)) + 1))
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls)
    return _summary(times, calls)


class Clock:
    """Times calls of methods where the host library makes them, by shadowing each with a timed one.

    ``clock.watch(buffer, "sample")`` replaces ``buffer.sample`` by an
    instance attribute that records each call's seconds under ``"sample"``;
    :func:`measure_in_loop` turns them into per-call timings. Timing the
    primitives inside the host library's own loop, rather than alone, counts
    what the loop's other stages cost them (caches, allocator).
    """

    def __init__(self, sync: Callable[[], Any] | None = None) -> None:
        self.seconds: dict[str, list[float]] = {}
        self._sync = sync or _nothing

    def watch(self, owner: Any, method: str, part: str | None = None) -> None:
        """Time every call of ``owner.<method>`` under ``part`` (default: the method's name)."""
        original = getattr(owner, method)
        seconds = self.seconds.setdefault(part or method, [])
        sync = self._sync

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = original(*args, **kwargs)
            sync()
            seconds.append(time.perf_counter() - start)
            return result

        setattr(owner, method, timed)

    def watch_rest(self, owner: Any, method: str, part: str, inner: str) -> None:
        """Time every call of ``owner.<method>`` less the seconds of the ``inner`` part's calls made within it.

        What a call spends outside ``inner`` (a training step's collection: the step less its gradient
        steps), call by call, so it is never negative as a difference of separate medians can be.
        """
        original = getattr(owner, method)
        seconds = self.seconds.setdefault(part, [])
        inside = self.seconds.setdefault(inner, [])
        sync = self._sync

        def timed(*args: Any, **kwargs: Any) -> Any:
            before = len(inside)
            start = time.perf_counter()
            result = original(*args, **kwargs)
            sync()
            seconds.append(time.perf_counter() - start - sum(inside[before:]))
            return result

        setattr(owner, method, timed)

    def counts(self) -> dict[str, int]:
        return {part: len(values) for part, values in self.seconds.items()}


def measure_in_loop(
    step: Callable[[], Any],
    clock: Clock,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    min_repetition_s: float = HOST_REPETITION_S,
    sync: Callable[[], Any] | None = None,
) -> tuple[Timing, dict[str, Timing]]:
    """Time ``step()`` as :func:`measure` does, and each part ``clock`` watches per call.

    Returns:
        The timing of one ``step()`` and, per watched part, the median over the
        repetitions of the mean seconds of its calls in that repetition (its
        ``calls``: the fewest calls a repetition made; parts not called in
        every repetition are left out).
    """
    marks: list[dict[str, int]] = []

    def marked() -> None:
        marks.append(clock.counts())
        step()

    whole = measure(marked, repeats, warmup, min_repetition_s, sync)
    starts = marks[len(marks) - whole.n * whole.calls :: whole.calls] + [clock.counts()]
    parts = {}
    for part, seconds in clock.seconds.items():
        means, counts = [], []
        for begin, end in zip(starts, starts[1:]):
            calls = seconds[begin.get(part, 0) : end.get(part, 0)]
            if calls:
                means.append(sum(calls) / len(calls))
                counts.append(len(calls))
        if len(means) == whole.n:
            parts[part] = _summary(means, min(counts))
    return whole, parts


class Timer:
    """What a workload times with: ``timer(fn)`` (:func:`measure`) and ``timer.in_loop(step, clock)``."""

    def __init__(self, repeats: int = REPEATS) -> None:
        self.repeats = repeats

    def __call__(self, fn: Callable[[], Any], **kwargs: Any) -> Timing:
        return measure(fn, repeats=max(self.repeats, kwargs.pop("repeats", 0)), **kwargs)

    def in_loop(self, step: Callable[[], Any], clock: Clock, **kwargs: Any) -> tuple[Timing, dict[str, Timing]]:
        return measure_in_loop(step, clock, repeats=max(self.repeats, kwargs.pop("repeats", 0)), **kwargs)


def _summary(times: Sequence[float], calls: int = 1) -> Timing:
    ordered = sorted(times)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    else:
        q1, q3 = ordered[0], ordered[-1]
    return Timing(statistics.median(ordered), q1, q3, len(ordered), calls, statistics.fmean(ordered))


def _nothing() -> None:
    return None


@dataclasses.dataclass
class ReplayEntry:
    """The replay primitives of one configuration: ``insert``, ``sample``, ``update``, ``phase_relaxed``.

    ``phase_relaxed`` (a training phase with staleness 1 and ``worker="auto"``)
    is ``None`` where the workload has no worker thread (Tianshou applies the
    relaxed schedule on the learner's thread); ``worker`` is where that
    phase's pipeline ran its work (``"thread"`` or ``"inline"``), as
    ``worker="auto"`` decided.
    """

    config: ReplayConfig
    times: dict[str, Timing | None]
    source: str = MEASURED
    worker: str | None = None

    def __getitem__(self, step: str) -> float:
        timing = self.times.get(step)
        if timing is None:
            raise KeyError(step)
        return timing.expected

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "source": self.source,
            "worker": self.worker,
            "times": {k: None if t is None else t.to_dict() for k, t in self.times.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplayEntry:
        times = {k: None if t is None else Timing.from_dict(t) for k, t in data["times"].items()}
        return cls(ReplayConfig.from_dict(data["config"]), times, data.get("source", MEASURED), data.get("worker"))


@dataclasses.dataclass
class Profile:
    """Everything the model needs, measured once on one machine for one workload.

    Attributes:
        workload: what was profiled.
        machine: where (:func:`machine`): CPU, cores, torch threads, GPUs, versions.
        host: per learner device, the host library's steps (:data:`HOST_STEPS`) and
            ``"reference"``, the replay configuration they were timed with.
        replay: one entry per replay configuration.
        skipped: configurations that could not be built here, with the reason.
        seconds: how long profiling took.
    """

    workload: WorkloadSpec
    machine: dict[str, Any]
    host: dict[str, dict[str, Any]]
    replay: list[ReplayEntry]
    skipped: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    created: str = ""
    version: str = ""

    def entry(self, config: ReplayConfig) -> ReplayEntry:
        for e in self.replay:
            if e.config == config:
                return e
        raise KeyError(f"no profile entry for {config.key}")

    def host_time(self, learner: str, step: str) -> float:
        return float(self.host[learner][step].expected)

    def reference(self, learner: str) -> ReplayConfig:
        return ReplayConfig.from_dict(self.host[learner]["reference"])

    def to_dict(self) -> dict[str, Any]:
        host = {
            device: {k: (v.to_dict() if isinstance(v, Timing) else v) for k, v in steps.items()}
            for device, steps in self.host.items()
        }
        return {
            "format": FORMAT,
            "version": self.version,
            "created": self.created,
            "seconds": self.seconds,
            "workload": self.workload.to_dict(),
            "machine": self.machine,
            "host": host,
            "replay": [e.to_dict() for e in self.replay],
            "skipped": self.skipped,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        if data.get("format") != FORMAT:
            raise ProfileError(f"profile format {data.get('format')!r}, this version reads {FORMAT}")
        host = {
            device: {k: (v if k == "reference" else Timing.from_dict(v)) for k, v in steps.items()}
            for device, steps in data["host"].items()
        }
        return cls(
            workload=WorkloadSpec.from_dict(data["workload"]),
            machine=dict(data["machine"]),
            host=host,
            replay=[ReplayEntry.from_dict(e) for e in data["replay"]],
            skipped=list(data.get("skipped", [])),
            seconds=float(data.get("seconds", 0.0)),
            created=str(data.get("created", "")),
            version=str(data.get("version", "")),
        )

    def save(self, path: str | os.PathLike[str]) -> pathlib.Path:
        """Write the profile as JSON, as :func:`~hetero_replay.storage.files.replace_file` writes.

        Atomically, through a temporary of unpredictable name created exclusively
        (mode 0600), so a name planted in a shared folder is never written through;
        a folder another user could change is refused (``ValueError``); folders
        created on the way are 0700.
        """
        return replace_file(path, json.dumps(self.to_dict(), indent=1).encode(), "profile path")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        """Read a profile saved by :meth:`save` (on this machine or another).

        Raises:
            FileNotFoundError: no file at ``path`` (``OSError`` if it cannot be opened).
            ProfileError: the file is not a profile of this format: not a regular file
                (a FIFO or device is not waited on), larger than :data:`MAX_PROFILE_BYTES`,
                not JSON, or not a profile's fields.
        """
        path = pathlib.Path(path)
        try:
            text = read_regular_file(path, MAX_PROFILE_BYTES, "profile").decode()
            return cls.from_dict(json.loads(text))
        except ProfileError as e:
            raise ProfileError(f"{path}: {e}") from None
        except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError) as e:
            raise ProfileError(f"{path} is not a hetero-replay profile ({type(e).__name__}: {e})") from None


def version() -> str:
    """hetero-replay's installed version (profiles of another version are re-measured)."""
    try:
        return importlib.metadata.version("hetero-replay")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def machine() -> dict[str, Any]:
    """What a profile's numbers depend on besides the workload: CPU, cores, threads, GPUs, versions."""
    import hetero_replay._native as native

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "replay_threads": native.num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hetero_replay": version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
    except ImportError:
        info.update(torch=None, torch_threads=1, gpus=[])
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):  # no /proc (not Linux): ask the platform module
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def cache_dir() -> pathlib.Path:
    """Where profiles are cached: ``$HETERO_REPLAY_CACHE``, ``$XDG_CACHE_HOME/hetero-replay`` or ``~/.cache/hetero-replay``."""
    explicit = os.environ.get("HETERO_REPLAY_CACHE")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "hetero-replay"


def cache_path(spec: WorkloadSpec, configs: Iterable[ReplayConfig], learners: Iterable[str]) -> pathlib.Path:
    """The cache file of this workload on this machine with this version, profiling these configurations.

    Its folder is made private here (0700; an existing one must be this user's,
    writable by nobody else, below directories no other user may change: see
    :mod:`hetero_replay.storage.files`): the names in it are known in advance, so
    a profile planted in a shared folder would be trusted. ``ValueError`` otherwise.
    """
    key = {
        "workload": spec.to_dict(),
        "machine": {k: v for k, v in machine().items() if k != "platform"},
        "configs": sorted(c.key for c in configs),
        "learners": sorted(learners),
        "format": FORMAT,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = f"{spec.lib}-{spec.algo}-{spec.env}-{digest}.json".replace("/", "_")
    folder = pathlib.Path(os.path.abspath(cache_dir() / "profiles"))
    private_directory(folder, "profile cache")
    return folder / name


def collect(
    workload: Workload,
    configs: Sequence[ReplayConfig],
    learners: Sequence[str],
    repeats: int = REPEATS,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    """Profile ``workload`` on this machine: host steps per learner device, replay primitives per config.

    Args:
        workload: the host library's setup.
        configs: the replay configurations to time (:func:`hetero_replay.advisor.explore.replay_configs`).
        learners: the learner devices to time the host library's steps on.
        repeats: repetitions per primitive (median kept).
        progress: called with a short label before each measurement (a progress bar).

    A configuration that cannot be built here (its backend refuses the
    capacity, the host library refuses the storage) is recorded in
    :attr:`Profile.skipped` with the reason instead of failing the profile.
    """
    started = time.perf_counter()
    timer = Timer(repeats)
    note = progress or _nothing_with
    host: dict[str, dict[str, Any]] = {}
    for learner in learners:
        reference = reference_config(configs, learner)
        note(f"host steps on {learner}")
        steps = dict(workload.time_host(learner, reference, timer))
        _require_keys(steps, HOST_STEPS, "time_host")
        steps["reference"] = reference.to_dict()
        host[learner] = steps
    replay, skipped = [], []
    for config in configs:
        if config.learner not in host:
            continue
        note(config.key)
        try:
            times = dict(workload.time_replay(config, timer))
        except (ValueError, TypeError, ImportError, RuntimeError, MemoryError) as e:
            skipped.append({"config": config.to_dict(), "reason": f"{type(e).__name__}: {e}"})
            continue
        _require_keys(times, REPLAY_STEPS, "time_replay")
        worker = times.pop("worker", None)
        kept = [*REPLAY_STEPS, *(k for k in OPTIONAL_REPLAY_STEPS if times.get(k) is not None)]
        replay.append(ReplayEntry(config, {k: times[k] for k in kept}, worker=worker))
    return Profile(
        workload=workload.spec,
        machine=machine(),
        host=host,
        replay=replay,
        skipped=skipped,
        seconds=time.perf_counter() - started,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        version=version(),
    )


def reference_config(configs: Sequence[ReplayConfig], learner: str) -> ReplayConfig:
    """The configuration the host steps are timed with: the first one on ``learner`` (explore lists the default first)."""
    for config in configs:
        if config.learner == learner:
            return config
    raise ValueError(f"no replay configuration has the learner {learner!r}")


def _require_keys(times: dict[str, Any], keys: Sequence[str], method: str) -> None:
    missing = [k for k in keys if k not in times]
    if missing:
        raise TypeError(f"the workload's {method} returned no {missing}; it must return {list(keys)}")


def _nothing_with(label: str) -> None:
    return None


__all__ = [
    "HOST_REPETITION_S",
    "HOST_STEPS",
    "MEASURED",
    "MODELLED",
    "REPEATS",
    "REPLAY_STEPS",
    "Profile",
    "ProfileError",
    "Clock",
    "ReplayEntry",
    "Timer",
    "Timing",
    "cache_dir",
    "cache_path",
    "collect",
    "machine",
    "measure",
    "measure_in_loop",
]
