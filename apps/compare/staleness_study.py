"""How much priority staleness learning tolerates: ``hetero-replay compare --staleness 0,1,2,...``.

For each staleness ``k`` of the relaxed pipeline, over seeds, two scores of a
run: the area under its evaluation curve (its mean return over training) and
its final return. Each is summarised by its interquartile mean (IQM: the mean
of the middle 50% of runs, robust to one outlier seed yet using half of them)
with a 95% stratified-bootstrap confidence interval, as recommended by Agarwal
et al. (NeurIPS 2021) and computed with their ``rliable`` package (the
``study`` extra). A staleness is *within the seed noise of k = 0* when its
interval overlaps the interval of ``k = 0`` for both scores.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from hetero_replay.apps.compare.base import RunResult
from hetero_replay.apps.compare.report import auc, save_figure
from hetero_replay.extend import install_hint
from hetero_replay.storage.files import replace_file

#: Bootstrap resamples per interval; 2,000 keeps the CI's own noise well below its width.
BOOTSTRAP_REPS = 2000


@dataclass(frozen=True)
class Estimate:
    """An interquartile mean and its 95% bootstrap confidence interval."""

    iqm: float
    low: float
    high: float

    def overlaps(self, other: Estimate) -> bool:
        return self.low <= other.high and other.low <= self.high

    def __str__(self) -> str:
        return f"{self.iqm:.1f} [{self.low:.1f}, {self.high:.1f}]"


@dataclass(frozen=True)
class StalenessRow:
    """One staleness: its runs' seeds and both scores."""

    staleness: int
    seeds: tuple[int, ...]
    auc: Estimate
    final_return: Estimate
    within_noise_of_k0: bool


def summarize(results: Sequence[RunResult], seed: int = 0) -> list[StalenessRow]:
    """One row per staleness swept (runs without a staleness, e.g. the uniform baseline, are left out).

    Raises:
        ImportError: ``rliable`` is missing (the ``study`` extra).
        ValueError: no run has a staleness.
    """
    try:
        from rliable import library, metrics
    except ImportError as e:
        raise ImportError(f"the staleness study needs rliable: {install_hint('study')}") from e
    swept = sorted({r.spec.staleness for r in results if r.spec.staleness is not None})
    if not swept:
        raise ValueError("no run has a staleness: run compare with --staleness")
    scores = {}
    for k in swept:
        runs = [r for r in results if r.spec.staleness == k and r.eval_returns]
        scores[k] = (
            tuple(r.spec.seed for r in runs),
            np.array([[auc(r.eval_steps, r.eval_returns)] for r in runs]),
            np.array([[r.eval_returns[-1]] for r in runs]),
        )

    def iqm(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x)])

    estimates = {}
    for which in (1, 2):  # AUC, final return
        np.random.seed(seed)  # rliable's bootstrap draws from NumPy's global generator
        point, interval = library.get_interval_estimates(
            {str(k): v[which] for k, v in scores.items()}, iqm, reps=BOOTSTRAP_REPS
        )
        for k in swept:
            estimates[k, which] = Estimate(
                float(point[str(k)][0]), float(interval[str(k)][0, 0]), float(interval[str(k)][1, 0])
            )
    base = swept[0]
    return [
        StalenessRow(
            staleness=k,
            seeds=scores[k][0],
            auc=estimates[k, 1],
            final_return=estimates[k, 2],
            within_noise_of_k0=estimates[k, 1].overlaps(estimates[base, 1])
            and estimates[k, 2].overlaps(estimates[base, 2]),
        )
        for k in swept
    ]


def format_table(rows: Sequence[StalenessRow]) -> str:
    """The study as a plain-text table."""
    head = ["staleness", "seeds", "AUC IQM [95% CI]", "final return IQM [95% CI]", f"CIs overlap k={rows[0].staleness}"]
    body = [[str(r.staleness), str(len(r.seeds)), str(r.auc), str(r.final_return), "yes" if r.within_noise_of_k0 else "no"]
            for r in rows]  # fmt: skip
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write(rows: Sequence[StalenessRow], results: Sequence[RunResult], out_dir: str) -> list[str]:
    """``staleness.json`` (the rows) and ``staleness.png`` (both scores vs staleness); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    json_path = os.path.join(out_dir, "staleness.json")
    replace_file(json_path, json.dumps([asdict(r) for r in rows], indent=1).encode(), "out_dir")
    spec = results[0].spec
    ks = np.array([r.staleness for r in rows], dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, name, pick in [
        (axes[0], "area under the curve (mean return)", "auc"),
        (axes[1], "final return", "final_return"),
    ]:
        est = [getattr(r, pick) for r in rows]
        mid = np.array([e.iqm for e in est])
        err = np.array([[e.iqm - e.low for e in est], [e.high - e.iqm for e in est]])
        ax.errorbar(ks, mid, yerr=err, fmt="o-", capsize=5)
        ax.axhspan(est[0].low, est[0].high, color="grey", alpha=0.2, label=f"k={rows[0].staleness}: 95% CI")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(ks, [str(int(k)) for k in ks])
        ax.set_xlabel("staleness k (learner steps a priority update lags)")
        ax.set_ylabel(f"{name}, IQM")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{spec.lib} {spec.algo.upper()} on {spec.env_id}: IQM over {len(rows[0].seeds)} seeds, 95% bootstrap CI"
    )
    fig.tight_layout()
    png_path = os.path.join(out_dir, "staleness.png")
    save_figure(fig, png_path, dpi=120)
    plt.close(fig)
    return [json_path, png_path]


__all__ = ["Estimate", "StalenessRow", "format_table", "summarize", "write"]
