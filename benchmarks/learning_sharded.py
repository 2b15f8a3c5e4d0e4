"""SB3 PERDQN on CartPole-v1 from one local buffer vs a 2-shard ShardedReplay: same seeds, same budget.

Each seed trains the full budget (no early stop) with the hyperparameters of
``tests/test_sb3_learning.py``; every ``EVAL_EVERY`` steps the greedy policy is
evaluated. The table compares the two replays per seed (best and last
evaluation, area under the curve) and across seeds (mean, standard deviation,
Welch's t-test p-value): "within seed noise" means the difference of the means
is small next to the spread across seeds. Writes
``benchmarks/results/distributed-learning.{md,json}``.

    python benchmarks/learning_sharded.py            # 12 seeds x 10,000 steps, about 20 minutes on 2 cores
    python benchmarks/learning_sharded.py --seeds 2  # a quick look
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import cpu_model, git_revision, table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--budget", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    import ray
    from scipy import stats

    from tests import test_sb3_learning as t

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="hetero_replay", log_to_driver=False)
    runs: dict[str, list[dict]] = {"1 buffer": [], "2 shards": []}
    for seed in range(args.seeds):  # interleaved: machine noise hits both alike
        for label, shards in (("1 buffer", 0), ("2 shards", 2)):
            start = time.perf_counter()
            run = t.train(seed, budget=args.budget, stop_at=None, shards=shards)
            returns = [r for _, r in run.curve]
            runs[label].append(
                dict(seed=seed, curve=run.curve, best=max(returns), last=returns[-1], auc=float(np.mean(returns)),
                     seconds=time.perf_counter() - start)
            )  # fmt: skip
            print(f"seed {seed} {label}: best {max(returns):.1f}, last {returns[-1]:.1f}, "
                  f"mean over evaluations {np.mean(returns):.1f} ({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
    ray.shutdown()

    body = []
    for metric in ("best", "last", "auc"):
        a = np.array([r[metric] for r in runs["1 buffer"]])
        b = np.array([r[metric] for r in runs["2 shards"]])
        p = stats.ttest_ind(a, b, equal_var=False).pvalue if len(a) > 1 else float("nan")
        body.append([metric, f"{a.mean():.1f} ± {a.std(ddof=1):.1f}", f"{b.mean():.1f} ± {b.std(ddof=1):.1f}",
                     f"{b.mean() - a.mean():+.1f}", f"{p:.2f}"])  # fmt: skip
    per_seed = [
        [str(x["seed"]), f"{x['best']:.0f} / {x['last']:.0f}", f"{y['best']:.0f} / {y['last']:.0f}",
         f"{x['seconds']:.0f} / {y['seconds']:.0f}"]
        for x, y in zip(runs["1 buffer"], runs["2 shards"])
    ]  # fmt: skip
    lines = [
        "# PERDQN on CartPole-v1: one buffer vs a 2-shard ShardedReplay",
        "",
        f"`python benchmarks/learning_sharded.py --seeds {args.seeds} --budget {args.budget}`; "
        f"{cpu_model()}, git {git_revision()}, {time.strftime('%Y-%m-%d')}. Hyperparameters of "
        "tests/test_sb3_learning.py, trained the whole budget; greedy evaluation every "
        f"1,000 steps over 5 episodes. Torch on 1 thread; Ray local, 2 CPUs.",
        "",
        "Across seeds (mean ± sample standard deviation; Welch's t-test of equal means):",
        "",
        *table(["evaluation return", "1 buffer", "2 shards", "difference", "p"], body),
        "",
        "`auc`: the mean of all evaluations of a run (area under its learning curve).",
        "",
        "Per seed (best / last evaluation; wall seconds 1 buffer / 2 shards):",
        "",
        *table(["seed", "1 buffer", "2 shards", "seconds"], per_seed),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distributed-learning.md").write_text("\n".join(lines))
    (args.out / "distributed-learning.json").write_text(json.dumps(runs, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
