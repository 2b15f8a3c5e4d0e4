"""``advise()``: profile (or load a profile), rank every placement, and say which one to use and why."""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hetero_replay.advisor import devices, explore
from hetero_replay.advisor import profile as profiling
from hetero_replay.advisor.explore import Row
from hetero_replay.advisor.profile import Profile
from hetero_replay.advisor.workload import Workload, make_workload
from hetero_replay.checks import check_staleness
from hetero_replay.placement import Placement
from hetero_replay.storage.files import replace_file

log = logging.getLogger("hetero_replay.advisor")


@dataclasses.dataclass(frozen=True)
class Choice:
    """What to run: a :class:`~hetero_replay.placement.Placement`, a staleness and the replay threads.

    Use it as ``PERDQN(..., placement=choice.placement, staleness=choice.staleness)``
    after ``hetero_replay.set_num_threads(choice.threads)`` (or :meth:`apply`).
    """

    placement: Placement
    staleness: int
    threads: int
    predicted: float  # env steps per second
    label: str

    def apply(self) -> Placement:
        """Set the replay threads and return the placement, checked against this machine."""
        from hetero_replay import _native

        placement = self.placement.checked()
        _native.set_num_threads(self.threads)
        return placement


@dataclasses.dataclass(frozen=True)
class AutoPlacement:
    """``placement=AutoPlacement(...)``: let the advisor choose, for a host library that cannot see the whole setup.

    Tianshou's algorithm knows neither the environment nor the buffer, so
    ``PEROffPolicyWrapper(..., placement=AutoPlacement(env="CartPole-v1",
    batch_size=64, buffer_size=20_000, n_envs=4))`` says what to profile. SB3's
    models know everything: ``PERDQN(..., placement="auto")``.

    Attributes:
        env: the gymnasium environment id.
        batch_size, buffer_size, n_envs: as in training.
        profile: a saved profile to advise from instead of measuring.
        cache: reuse (and keep) the cached profile of this setup.
        options: more arguments of the host library's workload (Tianshou's:
            ``hyperparams``, the training schedule of
            :class:`hetero_replay.adapters.tianshou.workload.Hyperparams`).
    """

    env: str
    batch_size: int
    buffer_size: int
    n_envs: int = 1
    profile: str | None = None
    cache: bool = True
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Advice:
    """The ranking of every placement for one workload, and the choice.

    Attributes:
        profile: the measurements the predictions come from.
        rows: every candidate, fastest predicted first (:class:`~hetero_replay.advisor.explore.Row`).
        staleness: the staleness values ranked.
    """

    def __init__(self, profile: Profile, rows: list[Row], staleness: Sequence[int]) -> None:
        self.profile = profile
        self.rows = rows
        self.staleness = tuple(staleness)

    @property
    def best(self) -> Choice:
        """The top-ranked candidate as a :class:`Choice`."""
        row = self.rows[0]
        return Choice(
            row.candidate.placement, row.candidate.staleness, row.candidate.threads, row.predicted, row.candidate.label
        )

    def row(self, tag: str) -> Row | None:
        """The row tagged ``tag`` (``"best"``, ``"default"``, ``"baseline"``), or ``None``."""
        return next((r for r in self.rows if tag in r.tags), None)

    @property
    def title(self) -> str:
        return self.profile.workload.title()

    def summary(self) -> dict[str, Any]:
        """Best, default and baseline with predicted (and measured) speed-ups; validation errors once validated."""
        out: dict[str, Any] = {}
        best = self.rows[0]
        for tag in ("best", "default", "baseline"):
            row = self.row(tag)
            out[tag] = None if row is None else row.candidate.label
            out[f"{tag}_predicted"] = None if row is None else row.predicted
            out[f"{tag}_measured"] = None if row is None else row.measured
        for tag in ("default", "baseline"):
            row = self.row(tag)
            out[f"speedup_vs_{tag}"] = None if row is None else best.predicted / row.predicted
            both = row is not None and row.measured and best.measured
            out[f"measured_speedup_vs_{tag}"] = best.measured / row.measured if both else None  # type: ignore[operator, union-attr]
        validated = [r for r in self.rows if r.measured]
        if validated:
            errors = [abs(r.error) for r in validated if r.error is not None]
            top = max(r.measured for r in validated if r.measured is not None)
            out["mape"] = sum(errors) / len(errors)
            out["validated"] = len(validated)
            out["top_ranked_within_5pct"] = best.measured is not None and best.measured >= 0.95 * top
            out["measured_best"] = max(validated, key=lambda r: r.measured or 0.0).candidate.label
        out["profile_s"] = self.profile.seconds
        return out

    def explain(self) -> str:
        """One paragraph: the choice, its predicted speed, and against what."""
        best, summary = self.rows[0], self.summary()
        parts = [f"chose {best.candidate.label}: predicted {best.predicted:,.0f} env steps/s"]
        for tag in ("default", "baseline"):
            speedup = summary[f"speedup_vs_{tag}"]
            if speedup is not None:
                parts.append(f"{speedup:.2f}x the {tag} ({summary[tag]})")
        share = max(best.breakdown.items(), key=lambda kv: kv[1])
        total = sum(best.breakdown.values())
        why = f"the largest part of an env step is {share[0]} ({share[1] / total:.0%})" if total > 0 else ""
        measured = "measured" if not best.predicted_only else "predicted only (an analytical device model)"
        return (
            "; ".join(parts) + f". Of {len(self.rows)} placements ranked from a profile taken in "
            f"{self.profile.seconds:.1f} s ({measured}); {why}."
        )

    def table(self) -> str:
        from hetero_replay.advisor import report

        return report.format_table(self.rows, self.title, self.summary())

    def to_json(self) -> dict[str, Any]:
        from hetero_replay.advisor import report

        return report.to_json(self.rows, self.title, self.summary(), self.profile.to_dict())

    def plot(self, path: str | os.PathLike[str]) -> pathlib.Path:
        """A PNG: predicted (and measured) env steps/s per placement, and each one's time per primitive."""
        from hetero_replay.advisor import report

        return report.plot(self.rows, self.title, pathlib.Path(path), self.summary())

    def save(self, directory: str | os.PathLike[str]) -> list[pathlib.Path]:
        """Write ``advice.txt`` (the table), ``advice.json``, ``advice.png`` and ``profile.json`` into ``directory``.

        Each as :func:`~hetero_replay.storage.files.replace_file` writes (a link planted at a name is
        replaced, not followed; a folder another user could change is refused with ``ValueError``).
        """
        from hetero_replay.advisor import report

        out = pathlib.Path(directory)
        written = [replace_file(out / "advice.txt", (self.table() + "\n").encode(), "out")]
        written.append(
            report.write_json(out / "advice.json", self.rows, self.title, self.summary(), self.profile.to_dict())
        )
        written.append(self.plot(out / "advice.png"))
        written.append(self.profile.save(out / "profile.json"))
        return written


def advise(
    workload: Workload | None = None,
    *,
    lib: str | None = None,
    staleness: Iterable[int] = (0, 1),
    profile: Profile | str | os.PathLike[str] | None = None,
    learners: Sequence[str] | None = None,
    threads: Sequence[int] | None = None,
    cache: bool = True,
    repeats: int = profiling.REPEATS,
    progress: bool | Callable[[str], None] = False,
    **workload_kwargs: Any,
) -> Advice:
    """Profile a workload (or load a profile), predict every placement, rank them.

    Either give a ready ``workload``, or ``lib`` and its arguments
    (``advise(lib="sb3", algo="dqn", env="CartPole-v1", batch_size=256,
    buffer_size=1_000_000, n_envs=1)``), or only a saved ``profile``, possibly
    from another machine (no host library is needed then).

    A profile measured here (or read from the cache) also gets the
    predicted-only entries of the devices that are not here
    (:mod:`~hetero_replay.advisor.devices`: the FPGA cycle model, one entry per
    part that holds ``N``), ranked next to the measured ones; a profile passed
    in is ranked as it is.

    Args:
        workload: a host library's :class:`~hetero_replay.advisor.workload.Workload`.
        lib: ``"sb3"`` or ``"tianshou"``, with ``workload_kwargs`` for its ``make_workload``.
        staleness: the staleness values to consider (0 = strict PER).
        profile: a :class:`~hetero_replay.advisor.profile.Profile` or a file to advise from.
        learners: learner devices to profile (default: the CPU and every GPU here).
        threads: replay thread counts to try (default: 1, 2, 4, ... up to the cores).
        cache: reuse a cached profile of the same workload, machine and version, and cache a new one.
        repeats: repetitions per primitive (median kept; at least 20 for the advisor's claims).
        progress: show a progress bar (or call this with each step's label).

    Raises:
        ValueError: neither a workload, ``lib`` nor a profile; a profile that
            contradicts the workload; a bad staleness.
    """
    values = sorted({check_staleness(k, "staleness") for k in staleness})
    if not values:
        raise ValueError("staleness must name at least one value, e.g. (0, 1)")
    if workload is None and lib is not None:
        workload = make_workload(lib, **workload_kwargs)
    elif workload_kwargs:
        raise TypeError(f"advise() got workload arguments {sorted(workload_kwargs)} without lib=")
    if profile is not None:
        loaded = profile if isinstance(profile, Profile) else Profile.load(profile)
        if workload is not None and not workload.spec.same_setup(loaded.workload):
            raise ValueError(
                f"the profile is of {loaded.workload.title()}, not of {workload.spec.title()}; "
                "profile this workload or pass the matching profile"
            )
        return Advice(loaded, explore.rank(loaded, values), values)
    if workload is None:
        raise ValueError("advise() needs a workload, lib=... with its arguments, or a profile")
    learners = list(learners or explore.learner_devices())
    configs = explore.replay_configs(learners, threads)
    path = profiling.cache_path(workload.spec, configs, learners) if cache else None
    measured = _cached(path)
    if measured is None:
        measured = profiling.collect(
            workload, configs, learners, repeats, _reporter(progress, len(configs) + len(learners))
        )
        devices.add_modelled(measured)
        if path is not None:
            measured.save(path)
            log.info("profile cached at %s", path)
    else:  # a profile cached before the device models were: add their entries, and keep them
        before = len(measured.replay) + len(measured.skipped)
        devices.add_modelled(measured)
        if path is not None and len(measured.replay) + len(measured.skipped) != before:
            measured.save(path)
    return Advice(measured, explore.rank(measured, values), values)


def _cached(path: pathlib.Path | None) -> Profile | None:
    if path is None or not path.exists():
        return None
    try:
        return Profile.load(path)
    except (profiling.ProfileError, OSError) as e:
        log.warning("ignoring the unreadable cached profile %s: %s", path, e)
        return None


def _reporter(progress: bool | Callable[[str], None], total: int) -> Callable[[str], None] | None:
    """``progress`` as a callback: a bar for ``True``, the user's function, or nothing."""
    if callable(progress):
        return progress
    return progress_bar(total, "profiling") if progress else None


def progress_bar(total: int, desc: str) -> Callable[[str], None]:
    """A progress callback: one tqdm step per call, showing the call's label; closes itself at ``total``."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit="step", leave=False)

    def step(label: str) -> None:
        bar.set_postfix_str(label[:50])
        bar.update(1)
        if bar.n >= total:
            bar.close()

    return step


__all__ = ["Advice", "AutoPlacement", "Choice", "advise", "progress_bar"]
