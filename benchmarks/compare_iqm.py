"""Interquartile means with 95% bootstrap CIs for each variant of a ``hetero-replay compare`` run.

``hetero-replay compare`` reports means and standard deviations over seeds; with few seeds
and one outlier run, the interquartile mean (the mean of the middle 50% of runs) with a
stratified-bootstrap confidence interval (Agarwal et al., NeurIPS 2021, their ``rliable``
package: the ``study`` extra) says more. The scores are a run's area under its evaluation
curve (its mean return over training) and its final return, as in the staleness study.

Run:
    python benchmarks/compare_iqm.py benchmarks/results/compare/sb3-dqn-nstep3

prints one line per variant and writes ``iqm.json`` beside the run's ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

import numpy as np

from hetero_replay.apps.compare.report import auc
from hetero_replay.apps.compare.staleness_study import BOOTSTRAP_REPS, Estimate


def estimates(runs: Sequence[dict], seed: int = 0) -> dict[str, dict[str, Estimate]]:
    """``{variant: {"auc": Estimate, "final_return": Estimate}}`` over the runs of ``results.json``."""
    from rliable import library, metrics

    variants = list(dict.fromkeys(r["spec"]["variant"] for r in runs))  # the baseline first, as run
    scores: dict[str, dict[str, np.ndarray]] = {"auc": {}, "final_return": {}}
    for variant in variants:
        mine = [r for r in runs if r["spec"]["variant"] == variant]
        scores["auc"][variant] = np.array([[auc(r["eval_steps"], r["eval_returns"])] for r in mine])
        scores["final_return"][variant] = np.array([[r["eval_returns"][-1]] for r in mine])
    out: dict[str, dict[str, Estimate]] = {v: {} for v in variants}
    for name, by_variant in scores.items():
        np.random.seed(seed)  # rliable's bootstrap draws from NumPy's global generator

        def iqm(x: np.ndarray) -> np.ndarray:
            return np.array([metrics.aggregate_iqm(x)])

        point, interval = library.get_interval_estimates(by_variant, iqm, reps=BOOTSTRAP_REPS)
        for v in variants:
            out[v][name] = Estimate(float(point[v][0]), float(interval[v][0, 0]), float(interval[v][1, 0]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", help="a compare output folder (holds results.json)")
    args = parser.parse_args(argv)
    with open(os.path.join(args.folder, "results.json")) as f:
        runs = json.load(f)["runs"]
    table = estimates(runs)
    seeds = {v: sorted(r["spec"]["seed"] for r in runs if r["spec"]["variant"] == v) for v in table}
    for variant, est in table.items():
        print(
            f"{variant:>10}  seeds {len(seeds[variant])}  AUC IQM {est['auc']}  final return IQM {est['final_return']}"
        )
    record = {v: {"seeds": seeds[v], **{k: vars(e) for k, e in est.items()}} for v, est in table.items()}
    with open(os.path.join(args.folder, "iqm.json"), "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
