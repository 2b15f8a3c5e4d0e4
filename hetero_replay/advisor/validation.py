"""Validation: train the top-ranked placements end to end and compare the measured speed with the prediction.

Each validated candidate trains in the real adapter (:meth:`Workload.run
<hetero_replay.advisor.workload.Workload.run>`) for the same number of env
steps, ``repeats`` times; the repetitions are interleaved (every candidate
once, then every candidate again) so a slow spell of a shared machine hits all
of them alike, and the median counts. The advice's rows then carry the
measurement, and its summary the mean absolute percentage error (MAPE) and
whether the top-ranked placement measured within 5% of the fastest measured one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from hetero_replay.advisor.advice import Advice, progress_bar
from hetero_replay.advisor.explore import Row
from hetero_replay.advisor.workload import Candidate, Workload

#: Seconds one validation run should last (at the median prediction), to average out noise.
TARGET_RUN_S = 4.0
#: Fewest env steps a run times.
MIN_ENV_STEPS = 1000


def choose(advice: Advice, top: int = 3, everything: bool = False) -> list[Row]:
    """The rows to validate: the ``top`` ranked, the default and the baseline (or every row).

    Predicted-only rows (a modelled device, not on this machine) cannot be trained here and are left out.
    """
    runnable = [r for r in advice.rows if not r.predicted_only]
    if everything:
        return runnable
    chosen = runnable[: max(1, top)]
    for tag in ("default", "baseline"):
        row = advice.row(tag)
        if row is not None and row not in chosen:
            chosen.append(row)
    return chosen


def default_env_steps(advice: Advice, rows: Sequence[Row]) -> int:
    """Env steps per run: about :data:`TARGET_RUN_S` at the rows' median prediction, whole training phases."""
    spec = advice.profile.workload
    phase = spec.collect_steps * spec.n_envs
    rate = statistics.median(r.predicted for r in rows)
    steps = max(MIN_ENV_STEPS, int(rate * TARGET_RUN_S))
    return -(-steps // phase) * phase


def validate(
    advice: Advice,
    workload: Workload,
    rows: Sequence[Row] | None = None,
    env_steps: int | None = None,
    repeats: int = 3,
    progress: bool | Callable[[str], None] = False,
) -> dict[str, object]:
    """Measure ``rows`` (default: :func:`choose`) end to end; store the medians in them; return the summary.

    Raises:
        ValueError: the workload is not the one the advice was made for, or
            ``repeats`` / ``env_steps`` below 1.
    """
    if not workload.spec.same_setup(advice.profile.workload):
        raise ValueError(
            f"the advice is for {advice.profile.workload.title()}, the workload is {workload.spec.title()}"
        )
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rows = list(rows if rows is not None else choose(advice))
    if env_steps is None:
        env_steps = default_env_steps(advice, rows)
    elif env_steps < 1:
        raise ValueError(f"env_steps must be >= 1, got {env_steps}")
    measured: dict[Candidate, list[float]] = {row.candidate: [] for row in rows}
    note = progress if callable(progress) else progress_bar(len(rows) * repeats, "validating") if progress else None
    for repeat in range(repeats):
        for row in rows:
            if note is not None:
                note(f"{repeat + 1}/{repeats} {row.candidate.label}")
            measured[row.candidate].append(workload.run(row.candidate, env_steps))
    for row in rows:
        values = measured[row.candidate]
        row.measured = statistics.median(values)
        row.measured_spread = (min(values), max(values))
    summary = advice.summary()
    summary["env_steps_per_run"] = env_steps
    summary["repeats"] = repeats
    return summary


__all__ = ["MIN_ENV_STEPS", "TARGET_RUN_S", "choose", "default_env_steps", "validate"]
