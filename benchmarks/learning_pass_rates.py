"""How often the learning tests pass: every seed's run, under several floating-point set-ups.

The learning test (``tests/test_sb3_learning.py``) trains PERDQN on CartPole-v1 on a few seeds
and asserts on how many of them reach an evaluation return. Which seeds do is chaotic: a change in
the last bit of one matrix product (another CPU, another BLAS code path, another SIMD width)
sends a seed down another trajectory. This script measures the pass rate of the test's rule,
not of one trajectory:

* it runs the test's own ``train()`` on many seeds (``--seeds``), each variant in a fresh
  subprocess, so that environment variables read at import time (``ATEN_CPU_CAPABILITY``,
  ``MKL_CBWR``, ``OMP_NUM_THREADS``) take effect;
* a *variant* perturbs the floating-point arithmetic the way another machine would
  (see :data:`VARIANTS`); ``differs`` in the table counts the seeds whose evaluations differ
  from the first variant's, i.e. whether the variant really simulated another machine (on an
  AMD EPYC with AVX-512, ``aten-avx2``, ``mkl-avx2``, ``flush-denormal`` and ``threads-2``
  change nothing, presumably because MKL takes its AVX2 path on AMD anyway and products
  this small run on one thread);
* per seed it records the best evaluation return, the env steps trained and the step at which
  the test's threshold was first reached; per variant it prints the fraction of seeds that
  reach it, the fraction of disjoint seed groups (0-2, 3-5, ...) and of all seed groups of the
  test's size that pass the test's rule, and the binomial estimate from the per-seed rate.

By default each run stops when it reaches the test's threshold, like the test (``--full`` trains
every seed for the whole budget instead, which shows the whole learning curve but costs more).

Run from the repository root, one at a time (each run uses one core)::

    python benchmarks/learning_pass_rates.py                         # all variants, seeds 0-9
    python benchmarks/learning_pass_rates.py --variants baseline aten-default --seeds 0-4
    python benchmarks/learning_pass_rates.py --json out.json         # also save every run

Cost (one core each): 2-4 s per seed that reaches the threshold at 2,000-3,000 steps (nearly
all), about 15 s per seed that trains the whole budget (every seed with ``--full``). The default
(9 variants x 10 seeds) takes about 6 minutes; ``--seeds 0-19`` about 12; ``threads-2`` costs
twice the CPU of the others.

The rule measured (seeds per group, seeds needed, threshold, budget) is the test's own:
``SEEDS``, ``NEEDED``, ``THRESHOLD`` and ``BUDGET`` in ``tests/test_sb3_learning.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name -> (environment variables, settings applied in the worker before training, what it simulates)
VARIANTS: dict[str, tuple[dict[str, str], dict[str, object], str]] = {
    "baseline": ({}, {}, "this machine, torch's default kernels, 1 torch thread"),
    "aten-default": ({"ATEN_CPU_CAPABILITY": "default"}, {}, "torch's non-vectorised (scalar) kernels"),
    "aten-avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, {}, "torch's AVX2 kernels (a CPU without AVX-512)"),
    "mkl-compat": ({"MKL_CBWR": "COMPATIBLE"}, {}, "MKL's SSE2 GEMM path (another BLAS code path)"),
    "mkl-avx2": ({"MKL_CBWR": "AVX2"}, {}, "MKL's AVX2 GEMM path (a CPU without AVX-512)"),
    "flush-denormal": ({}, {"flush_denormal": True}, "torch.set_flush_denormal(True)"),
    "threads-2": ({"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}, {"threads": 2}, "2 torch threads"),
    "scalar": (
        {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
        {},
        "aten-default and mkl-compat together",
    ),
    "perturb-1ulp": ({}, {"perturb": True}, "one initial Q-network weight moved by one ulp (any other rounding)"),
}


def parse_seeds(text: str) -> list[int]:
    """``"0-9"``, ``"0,3,5"`` or ``"0-4,10"`` -> a list of seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def perturbed(cls: type) -> type:
    """``cls`` whose Q-network's first weight is moved by one ulp after set-up: the smallest change
    another machine's rounding could make, which shows how chaotic the trajectories are."""
    import torch

    class Perturbed(cls):
        def _setup_model(self) -> None:
            super()._setup_model()
            with torch.no_grad():
                w = next(self.q_net.parameters()).view(-1)
                w[0] = torch.nextafter(w[0], torch.tensor(float("inf")))
                self.q_net_target.load_state_dict(self.q_net.state_dict())

    return Perturbed


# -- the worker: one variant, many seeds, one JSON line per seed on stdout ---------------------------


def worker(seeds: list[int], settings: dict[str, object], full: bool) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from tests import test_sb3_learning as t

    if settings.get("flush_denormal"):
        torch.set_flush_denormal(True)
    if settings.get("perturb"):
        t.PERDQN = perturbed(t.PERDQN)
    info = {"cpu_capability": torch.backends.cpu.get_cpu_capability()}
    print(json.dumps({"info": info}), flush=True)
    for seed in seeds:
        cpu = time.process_time()
        run = t.train(seed, stop_at=None if full else t.THRESHOLD, threads=int(settings.get("threads", 1)))
        record = {
            "seed": seed, "steps": run.steps, "best": run.best, "reached": run.reached(t.THRESHOLD),
            "curve": run.curve, "beta": run.beta, "max_priority": run.max_priority, "n_updates": run.n_updates,
            "cpu_s": time.process_time() - cpu,
        }  # fmt: skip
        print(json.dumps(record), flush=True)


# -- the driver ---------------------------------------------------------------------------------------


def run_variant(name: str, seeds: list[int], full: bool, progress) -> tuple[dict, list[dict]]:
    env_vars, settings, _ = VARIANTS[name]
    env = {**os.environ, **env_vars}
    cmd = [sys.executable, __file__, "--worker", ",".join(map(str, seeds)), json.dumps(settings)]
    cmd += ["--full"] if full else []
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    info, records = {}, []
    assert proc.stdout is not None
    for line in proc.stdout:
        data = json.loads(line)
        if "info" in data:
            info = data["info"]
            continue
        records.append(data)
        progress.set_postfix_str(f"{name} seed {data['seed']}: best {data['best']:.0f} at {data['steps']}")
        progress.update(1)
    if proc.wait() != 0:
        raise RuntimeError(f"variant {name} failed (exit {proc.returncode})")
    return info, records


def passes(group: list[dict], threshold: float, need: int) -> bool:
    return sum(r["best"] >= threshold for r in group) >= need


def summarize(records: list[dict], threshold: float, size: int, need: int) -> dict:
    """Per-seed rate, and the pass rates of 'need of size seeds reach threshold' over seed groups."""
    ok = [r["best"] >= threshold for r in records]
    p = sum(ok) / len(ok)
    disjoint = [records[i : i + size] for i in range(0, len(records) - size + 1, size)]
    groups = list(itertools.combinations(records, size))
    binomial = sum(math.comb(size, k) * p**k * (1 - p) ** (size - k) for k in range(need, size + 1))
    return {
        "seed_rate": (sum(ok), len(ok)),
        "disjoint": (sum(passes(g, threshold, need) for g in disjoint), len(disjoint)),
        "all_groups": (sum(passes(list(g), threshold, need) for g in groups), len(groups)),
        "binomial": binomial,
    }


def table(results: dict, threshold: float, size: int, need: int) -> str:
    """Markdown: one row per seed and variant, then one row of pass rates per variant."""
    names = list(results)
    seeds = [r["seed"] for r in results[names[0]]["records"]]
    out = [f"Per seed: best evaluation return / env steps trained (* = reached {threshold:g})", ""]
    out.append("| seed | " + " | ".join(names) + " |")
    out.append("|---:|" + "---:|" * len(names))
    for i, seed in enumerate(seeds):
        cells = []
        for name in names:
            r = results[name]["records"][i]
            cells.append(f"{r['best']:.1f} / {r['steps']}" + (" *" if r["best"] >= threshold else ""))
        out.append(f"| {seed} | " + " | ".join(cells) + " |")
    out += ["", f"Pass rates of the test's rule: >= {need} of {size} seeds reach {threshold:g}", ""]
    out.append("| variant | differs | seeds reaching | disjoint groups | all groups | binomial | median steps "
               "to reach | CPU s |")  # fmt: skip
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    base = {r["seed"]: r["curve"] for r in results[names[0]]["records"]}
    for name in names:
        recs = results[name]["records"]
        s = summarize(recs, threshold, size, need)
        changed = sum(r["curve"] != base.get(r["seed"]) for r in recs)
        differs = "-" if name == names[0] else f"{changed}/{len(recs)}"
        reached = sorted(r["reached"] for r in recs if r["reached"] is not None)
        median = reached[len(reached) // 2] if reached else float("nan")
        cpu = sum(r["cpu_s"] for r in recs)
        frac = lambda k_n: f"{k_n[0]}/{k_n[1]}"  # noqa: E731
        out.append(f"| {name} | {differs} | {frac(s['seed_rate'])} | {frac(s['disjoint'])} | {frac(s['all_groups'])} "
                   f"| {s['binomial']:.3f} | {median} | {cpu:.0f} |")  # fmt: skip
    pooled = [r for name in names for r in results[name]["records"]]
    s = summarize(pooled, threshold, size, need)
    out.append(f"| **all runs pooled** | | {s['seed_rate'][0]}/{s['seed_rate'][1]} | | | {s['binomial']:.3f} | | |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seeds", default="0-9", help="seeds to run, e.g. 0-9 or 0,2,5 (default 0-9)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="NAME",
                        help="floating-point set-ups to run (default: all):\n" +
                        "\n".join(f"  {k}: {v[2]}" for k, v in VARIANTS.items()))  # fmt: skip
    parser.add_argument("--full", action="store_true", help="train the whole budget (no stop at the threshold)")
    parser.add_argument("--json", help="also write every run (curves included) to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("settings", nargs="?", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(parse_seeds(args.worker), json.loads(args.settings), args.full)
        return 0

    from tqdm import tqdm

    sys.path.insert(0, str(ROOT))
    from tests import test_sb3_learning as t

    seeds = parse_seeds(args.seeds)
    results: dict[str, dict] = {}
    start = time.perf_counter()
    with tqdm(total=len(seeds) * len(args.variants), unit="run", disable=args.no_progress) as progress:
        for name in args.variants:
            info, records = run_variant(name, seeds, args.full, progress)
            results[name] = {"info": info, "env": VARIANTS[name][0], "settings": VARIANTS[name][1],
                             "records": records}  # fmt: skip
    size, need = len(t.SEEDS), t.NEEDED
    print(f"PERDQN on CartPole-v1, budget {t.BUDGET} env steps, evaluation every {t.EVAL_EVERY} "
          f"({t.EVAL_EPISODES} episodes); seeds {args.seeds}; {time.perf_counter() - start:.0f} s wall\n")  # fmt: skip
    for name in args.variants:
        print(f"- {name}: {VARIANTS[name][2]} (torch CPU capability {results[name]['info'].get('cpu_capability')})")
    print()
    print(table(results, t.THRESHOLD, size, need))
    if args.json:
        Path(args.json).write_text(json.dumps({"threshold": t.THRESHOLD, "budget": t.BUDGET, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
