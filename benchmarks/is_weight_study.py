"""The IS-weight scale study (docs/is-weights.md): global normalisation with the default eps against
batch-maximum normalisation and a larger eps, over several tasks.

Each task is one ``hetero-replay compare`` folder run with the study's variants (SB3:
``per,per-batchnorm,per-eps1e-3``; Tianshou: ``hetero-per,hetero-per-batchnorm,hetero-per-eps1e-3``).
Per task and variant: the interquartile mean of the runs' area under the evaluation curve (their
mean return over training) and of their final return, with 95% stratified-bootstrap CIs
(:mod:`compare_iqm`), and the median of the runs' final mean IS weight (``extra["final_mean_weight"]``:
the mean weight of 16 batches drawn after training, the scale of the last updates). Variants are
named by their rule (``global``, ``batch``, ``eps1e-3``) across libraries. Runs of one seed share
their env seeds and network initialisation, so each rule is also compared with ``global`` seed by
seed: the mean AUC difference with a 95% percentile-bootstrap CI, and the seeds it wins.

Run (after the compare runs; the commands are in benchmarks/results/is-weights/README.md):
    python benchmarks/is_weight_study.py out/is-weights/sb3-dqn-CartPole-v1 ... --out benchmarks/results/is-weights

writes ``study.md``, ``study.json`` and ``study.png`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_iqm import estimates  # noqa: E402

from hetero_replay.apps.compare.report import auc  # noqa: E402

#: The study's variant names of both runners, by the rule they test.
RULES = {
    "per": "global",
    "hetero-per": "global",
    "per-batchnorm": "batch",
    "hetero-per-batchnorm": "batch",
    "per-eps1e-3": "eps1e-3",
    "hetero-per-eps1e-3": "eps1e-3",
}
ORDER = ("global", "batch", "eps1e-3")
PAIRED_BOOTSTRAP_REPS = 10_000


def task_name(runs: Sequence[dict]) -> str:
    """``"sb3 dqn CartPole-v1 (20000 steps)"`` from the runs' common spec."""
    spec = runs[0]["spec"]
    envs = f", {spec['n_envs']} envs" if spec["n_envs"] > 1 else ""
    return f"{spec['lib']} {spec['algo']} {spec['env_id']} ({spec['steps']} steps{envs})"


def summarize(folder: str) -> dict[str, Any]:
    """One task: ``{"task", "folder", "variants": {rule: {seeds, auc, final_return, final_mean_weight}}}``."""
    with open(os.path.join(folder, "results.json")) as f:
        runs = [r for r in json.load(f)["runs"] if r["spec"]["variant"] in RULES]
    table = estimates(runs)
    aucs = {(r["spec"]["variant"], r["spec"]["seed"]): auc(r["eval_steps"], r["eval_returns"]) for r in runs}
    variants = {}
    for variant, est in table.items():
        mine = [r for r in runs if r["spec"]["variant"] == variant]
        weights = [r["extra"]["final_mean_weight"] for r in mine if "final_mean_weight" in r["extra"]]
        variants[RULES[variant]] = {
            "variant": variant,
            "seeds": sorted(r["spec"]["seed"] for r in mine),
            **{name: vars(e) for name, e in est.items()},
            "final_mean_weight": float(np.median(weights)) if weights else None,
        }
    base = next(v for v in table if RULES[v] == "global")
    for variant in table:
        if variant != base:
            variants[RULES[variant]]["paired"] = paired(aucs, base, variant)
    return {"task": task_name(runs), "folder": os.path.basename(os.path.normpath(folder)), "variants": variants}


def paired(aucs: dict[tuple[str, int], float], base: str, variant: str) -> dict[str, Any]:
    """``variant``'s AUC minus ``base``'s over the seeds both ran: mean, 95% bootstrap CI, seeds won."""
    seeds = sorted(s for v, s in aucs if v == variant and (base, s) in aucs)
    diff = np.array([aucs[variant, s] - aucs[base, s] for s in seeds])
    rng = np.random.default_rng(0)
    means = diff[rng.integers(0, len(diff), (PAIRED_BOOTSTRAP_REPS, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(diff.mean()), "low": float(low), "high": float(high), "wins": int((diff > 0).sum()),
            "seeds": len(seeds)}  # fmt: skip


def verdict(task: dict[str, Any]) -> str:
    """Which variants' AUC intervals exclude the global rule's, and which way."""
    base = task["variants"]["global"]["auc"]
    words = []
    for rule in ORDER[1:]:
        if rule not in task["variants"]:
            continue
        est, d = task["variants"][rule]["auc"], task["variants"][rule]["paired"]
        if est["low"] > base["high"]:
            word = "better"
        elif est["high"] < base["low"]:
            word = "worse"
        else:
            word = "~ global (IQM CIs overlap)"
        words.append(
            f"{rule} {word}; paired AUC difference {d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}], "
            f"wins {d['wins']}/{d['seeds']} seeds"
        )
    return "; ".join(words)


def format_markdown(tasks: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| task | rule | seeds | AUC IQM [95% CI] | final return IQM [95% CI] | final mean IS weight (median) |",
        "|---|---|---|---|---|---|",
    ]
    for task in tasks:
        for rule in ORDER:
            v = task["variants"].get(rule)
            if v is None:
                continue
            w = "-" if v["final_mean_weight"] is None else f"{v['final_mean_weight']:.2g}"
            auc, fin = v["auc"], v["final_return"]
            lines.append(
                f"| {task['task']} | {rule} (`{v['variant']}`) | {len(v['seeds'])} "
                f"| {auc['iqm']:.1f} [{auc['low']:.1f}, {auc['high']:.1f}] "
                f"| {fin['iqm']:.1f} [{fin['low']:.1f}, {fin['high']:.1f}] | {w} |"
            )
    lines += ["", "Per task, AUC intervals against the global rule's:", ""]
    lines += [f"* {task['task']}: {verdict(task)}" for task in tasks]
    return "\n".join(lines) + "\n"


def plot(tasks: Sequence[dict[str, Any]], path: str) -> None:
    """One panel per task: each rule's AUC IQM with its 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(3.4 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rules = [r for r in ORDER if r in task["variants"]]
        points = [task["variants"][r]["auc"] for r in rules]
        iqm = np.array([p["iqm"] for p in points])
        err = np.array([[p["iqm"] - p["low"] for p in points], [p["high"] - p["iqm"] for p in points]])
        ax.bar(range(len(rules)), iqm, yerr=err, capsize=4, color=["tab:blue", "tab:orange", "tab:green"][: len(rules)])
        ax.set_xticks(range(len(rules)), rules)
        ax.set_title(task["task"], fontsize=8)
        ax.set_ylabel("AUC (mean return), IQM, 95% CI", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", help="hetero-replay compare output folders (each holds results.json)")
    parser.add_argument("--out", required=True, help="folder for study.md, study.json and study.png")
    args = parser.parse_args(argv)
    tasks = [summarize(folder) for folder in args.folders]
    os.makedirs(args.out, exist_ok=True)
    table = format_markdown(tasks)
    print(table)
    with open(os.path.join(args.out, "study.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump(tasks, f, indent=1)
    plot(tasks, os.path.join(args.out, "study.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
