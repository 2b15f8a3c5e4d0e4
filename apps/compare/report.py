"""Summarise comparison runs: a printed table, CSV and JSON files, and a PNG.

Per variant, over seeds:

* **final return** — the evaluation return at the end of training;
* **AUC** — the area under the return-vs-env-steps curve divided by the steps,
  i.e. the mean return over training (rewards learning fast, not just learning);
* **env-steps/s** — training-loop throughput (evaluations excluded), and its
  ratio to the baseline (the runner's first variant) taken seed by seed, since
  runs of one seed run next to each other;
* **CPU ratio** — the same ratio from the process's CPU time, which other
  programs on a shared machine disturb less than wall-clock time.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero_replay.apps.compare.base import RunResult
from hetero_replay.storage.files import check_parents, replace_file


@dataclass(frozen=True)
class Stat:
    """Mean and standard deviation (over seeds) of one measure."""

    mean: float
    std: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            return cls(float("nan"), float("nan"))
        return cls(float(arr.mean()), float(arr.std()))

    def __str__(self) -> str:
        return f"{self.mean:.1f} ± {self.std:.1f}"


@dataclass(frozen=True)
class VariantSummary:
    """One row of the table: a variant's results over all its seeds."""

    variant: str
    seeds: tuple[int, ...]
    final_return: Stat
    auc: Stat
    env_steps_per_s: Stat
    ratio: Stat  # env-steps/s over the baseline's, per seed
    cpu_ratio: Stat  # the same from CPU time; nan when a runner does not report it
    train_s: Stat


def auc(steps: Sequence[int], returns: Sequence[float]) -> float:
    """Mean return over training: trapezoid area under the curve / the steps it spans."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(returns, dtype=np.float64)
    if x.size == 0:
        return float("nan")
    if x.size == 1 or x[-1] == x[0]:
        return float(y.mean())
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0 / (x[-1] - x[0]))


def _cpu_rate(result: RunResult) -> float:
    cpu = result.extra.get("train_cpu_s")
    return result.spec.steps / cpu if cpu else float("nan")


def summarize(results: Sequence[RunResult]) -> list[VariantSummary]:
    """One :class:`VariantSummary` per variant, in order of first appearance; the baseline is
    the first variant (``build_specs`` puts the runner's baseline first for seed 0)."""
    if not results:
        raise ValueError("no results to summarise")
    variants = list(dict.fromkeys(r.spec.label for r in results))
    by_key = {(r.spec.label, r.spec.seed): r for r in results}
    baseline = variants[0]
    rows = []
    for variant in variants:
        runs = [r for r in results if r.spec.label == variant]
        paired = [(r, by_key[(baseline, r.spec.seed)]) for r in runs if (baseline, r.spec.seed) in by_key]
        rows.append(
            VariantSummary(
                variant=variant,
                seeds=tuple(r.spec.seed for r in runs),
                final_return=Stat.of([r.eval_returns[-1] for r in runs if r.eval_returns]),
                auc=Stat.of([auc(r.eval_steps, r.eval_returns) for r in runs]),
                env_steps_per_s=Stat.of([r.env_steps_per_s for r in runs]),
                ratio=Stat.of([r.env_steps_per_s / b.env_steps_per_s for r, b in paired]),
                cpu_ratio=Stat.of([_cpu_rate(r) / _cpu_rate(b) for r, b in paired]),
                train_s=Stat.of([r.train_s for r in runs]),
            )
        )
    return rows


def format_table(results: Sequence[RunResult], summary: Sequence[VariantSummary]) -> str:
    """The summary as a plain-text table, with a title line naming the comparison."""
    spec = results[0].spec
    n_steps = f"n_steps={spec.n_steps}, " if spec.n_steps > 1 else ""  # algorithms with their own n-step say so
    title = (
        f"{spec.lib} {spec.algo} on {spec.env_id}: {spec.steps:,} env steps x {len(summary[0].seeds)} seeds, "
        f"n_envs={spec.n_envs}, {n_steps}{spec.torch_threads} torch thread(s); "
        f"baseline = {summary[0].variant}"
    )
    header = [
        "variant",
        "final return",
        "AUC (mean return)",
        "env-steps/s",
        "x baseline",
        "x baseline (CPU)",
        "train s",
    ]
    body = [
        [
            s.variant,
            str(s.final_return),
            str(s.auc),
            f"{s.env_steps_per_s.mean:,.0f} ± {s.env_steps_per_s.std:,.0f}",
            f"{s.ratio.mean:.3f}",
            "n/a" if np.isnan(s.cpu_ratio.mean) else f"{s.cpu_ratio.mean:.3f}",
            str(s.train_s),
        ]
        for s in summary
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(row: list[str]) -> str:  # the variant name flush left, numbers flush right
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells)

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([title, "", line(header), rule, *map(line, body)])


@contextlib.contextmanager
def _written(path: str) -> Iterator[io.StringIO]:
    """Text written to ``path`` when the block ends (:func:`~hetero_replay.storage.files.replace_file`)."""
    text = io.StringIO(newline="")
    yield text
    replace_file(path, text.getvalue().encode(), "out_dir")


def save_figure(fig: Any, path: str, dpi: int) -> None:
    """A matplotlib figure as a PNG at ``path``, written as :func:`_written` writes."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=dpi)
    replace_file(path, png.getvalue(), "out_dir")


def check_out_dir(out_dir: str) -> None:
    """Refuse, before any run, an output folder whose files :func:`write_all` would refuse (``ValueError``)."""
    check_parents(os.path.join(out_dir, "results.json"), "out_dir")


def write_csv(results: Sequence[RunResult], out_dir: str) -> tuple[str, str]:
    """``runs.csv`` (one row per run) and ``curves.csv`` (one row per evaluation)."""
    runs_path, curves_path = os.path.join(out_dir, "runs.csv"), os.path.join(out_dir, "curves.csv")
    with _written(runs_path) as f:
        w = csv.writer(f)
        w.writerow(["lib", "algo", "env_id", "variant", "seed", "steps", "n_envs", "wall_s", "train_s",
                    "env_steps_per_s", "final_return", "auc"])  # fmt: skip
        for r in results:
            s = r.spec
            w.writerow([s.lib, s.algo, s.env_id, s.label, s.seed, s.steps, s.n_envs, f"{r.wall_s:.3f}",
                        f"{r.train_s:.3f}", f"{r.env_steps_per_s:.1f}",
                        r.eval_returns[-1] if r.eval_returns else "", auc(r.eval_steps, r.eval_returns)])  # fmt: skip
    with _written(curves_path) as f:
        w = csv.writer(f)
        w.writerow(["variant", "seed", "env_steps", "mean_return"])
        for r in results:
            for step, ret in zip(r.eval_steps, r.eval_returns, strict=True):
                w.writerow([r.spec.label, r.spec.seed, step, ret])
    return runs_path, curves_path


def write_json(results: Sequence[RunResult], summary: Sequence[VariantSummary], out_dir: str) -> str:
    """``results.json``: every run in full, and the summary rows."""
    from dataclasses import asdict

    path = os.path.join(out_dir, "results.json")
    with _written(path) as f:
        json.dump({"runs": [r.to_json() for r in results], "summary": [asdict(s) for s in summary]}, f, indent=1)
    return path


def write_png(results: Sequence[RunResult], summary: Sequence[VariantSummary], out_dir: str) -> str:
    """``comparison.png``: return vs env steps (mean and min..max over seeds), and throughput bars (mean ± std)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    spec = results[0].spec
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for s in summary:
        runs = [r for r in results if r.spec.label == s.variant]
        steps = np.asarray(runs[0].eval_steps)
        # seeds share the evaluation schedule; keep the common prefix if one stopped early
        n = min(len(r.eval_returns) for r in runs)
        returns = np.asarray([r.eval_returns[:n] for r in runs])
        (line,) = curves.plot(steps[:n], returns.mean(axis=0), label=f"{s.variant} (AUC {s.auc.mean:.0f})")
        curves.fill_between(steps[:n], returns.min(axis=0), returns.max(axis=0), color=line.get_color(), alpha=0.2)
    curves.set_xlabel("environment steps")
    curves.set_ylabel(f"mean evaluation return ({spec.eval_episodes} episodes)")
    curves.set_title(f"{spec.algo.upper()} on {spec.env_id}: mean of {len(summary[0].seeds)} seeds, band = min..max")
    curves.legend()
    curves.grid(alpha=0.3)
    names = [s.variant for s in summary]
    means = [s.env_steps_per_s.mean for s in summary]
    stds = [s.env_steps_per_s.std for s in summary]
    colors = [f"C{i}" for i in range(len(summary))]
    bars.bar(names, means, yerr=stds, color=colors, capsize=6)
    for i, s in enumerate(summary):
        bars.annotate(f"x{s.ratio.mean:.2f}", (i, means[i] + stds[i]), ha="center", va="bottom",
                      xytext=(0, 4), textcoords="offset points")  # fmt: skip
    bars.set_ylim(0, max(m + e for m, e in zip(means, stds, strict=True)) * 1.15)
    bars.set_ylabel("env steps / s (training loop)")
    bars.set_title(f"throughput ({spec.torch_threads} torch thread{'s' if spec.torch_threads > 1 else ''})")
    bars.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "comparison.png")
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def write_all(results: Sequence[RunResult], summary: Sequence[VariantSummary], out_dir: str) -> list[str]:
    """Write the CSV, JSON and PNG files into ``out_dir`` (created if needed); returns their paths.

    Each file is written as :func:`hetero_replay.storage.files.replace_file` writes: a folder
    another user could change is refused (``ValueError``), a link planted at a name is replaced,
    never followed.
    """
    return [*write_csv(results, out_dir), write_json(results, summary, out_dir), write_png(results, summary, out_dir)]
