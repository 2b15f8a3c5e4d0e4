"""How close the advisor's predictions come to measured training speed, over several workloads.

    python benchmarks/bench_advisor.py                 # the six workloads below, results in benchmarks/results/advisor/
    python benchmarks/bench_advisor.py --only sb3-dqn-b64 --repeats 2     # one workload

For each workload the advisor profiles this machine from scratch (no cache),
ranks every placement (tree backend x threads x storage x staleness 0/1 on the
CPU learner; GPUs too where present), then trains placements end to end in the
real adapter (``hetero_replay.advisor.validation``): every ranked placement in the
workloads marked ``all`` (so each valid placement is validated in at least two
workloads), the top three plus the default and the baseline elsewhere. Each run
times a fixed number of env steps (~4 s at the median prediction); runs repeat
``--repeats`` times, interleaved, and the median counts.

Outputs, per workload ``<out>/<name>/``: ``advice.txt`` (the ranked table with
measured speeds and errors), ``advice.json``, ``advice.png``, ``profile.json``;
across workloads ``<out>/validation.{md,json,png}``: MAPE per workload and
overall, whether the top-ranked placement measured within 5% of the fastest, and
the advisor's choice vs the default vs the baseline, measured (the paper's
speed-up table on this machine). torch runs on one thread (``--torch-threads``)
so that the cores left for the replay are known; say so when quoting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from hetero_replay import advisor
from hetero_replay.advisor import report, validation


@dataclasses.dataclass(frozen=True)
class Study:
    """One workload of the study: a name, ``make_workload``'s arguments, whether to validate every placement."""

    name: str
    setup: dict[str, Any]
    validate_all: bool = False


def _setup(lib: str, algo: str, env: str, batch_size: int, buffer_size: int, n_envs: int = 1) -> dict[str, Any]:
    return dict(lib=lib, algo=algo, env=env, batch_size=batch_size, buffer_size=buffer_size, n_envs=n_envs)


STUDIES = (
    Study("sb3-dqn-b64", _setup("sb3", "dqn", "CartPole-v1", 64, 1_000_000), validate_all=True),
    Study("sb3-dqn-b1024", _setup("sb3", "dqn", "CartPole-v1", 1024, 1_000_000), validate_all=True),
    Study("sb3-ddpg-b256", _setup("sb3", "ddpg", "Pendulum-v1", 256, 1_000_000)),
    Study("sb3-sac-b256", _setup("sb3", "sac", "Pendulum-v1", 256, 1_000_000)),
    Study("tianshou-dqn-4envs-b64", _setup("tianshou", "dqn", "CartPole-v1", 64, 100_000, 4), validate_all=True),
    Study("sb3-dqn-n4m-b4096", _setup("sb3", "dqn", "CartPole-v1", 4096, 4_000_000)),
)


def run_study(study: Study, out: Path, repeats: int, top: int, env_steps: int | None) -> dict[str, Any]:
    """Profile, rank, validate one workload; write its folder; return its summary."""
    workload = advisor.make_workload(**study.setup)
    started = time.perf_counter()
    advice = advisor.advise(workload, cache=False, progress=sys.stderr.isatty())
    profile_s = time.perf_counter() - started
    rows = validation.choose(advice, top=top, everything=study.validate_all)
    summary = validation.validate(
        advice, workload, rows, env_steps=env_steps, repeats=repeats, progress=sys.stderr.isatty()
    )
    advice.save(out / study.name)
    print(advice.table(), flush=True)
    summary.update(name=study.name, title=advice.title, profile_wall_s=profile_s)
    points = [(study.name, r.candidate.label, r.predicted, r.measured) for r in advice.rows if r.measured]
    return {"summary": summary, "points": points}


def write_overall(results: list[dict[str, Any]], out: Path, argv: list[str]) -> None:
    """``validation.{md,json,png}``: errors and speed-ups across workloads."""
    points = [tuple(p) for r in results for p in r["points"]]
    lines = [
        "# Advisor validation",
        "",
        f"Command: `{' '.join(['python benchmarks/bench_advisor.py', *argv])}`; torch on one thread.",
        "",
        "| workload | validated | MAPE | top-ranked within 5% of measured best | advisor's choice | "
        "measured: choice / default | choice / baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["summary"]
        lines.append(
            f"| {s['name']} | {s['validated']} | {100 * s['mape']:.1f}% | {'yes' if s['top_ranked_within_5pct'] else 'no'} "
            f"| {s['best'].replace('|', '/')} | {_ratio(s.get('measured_speedup_vs_default'))} "
            f"| {_ratio(s.get('measured_speedup_vs_baseline'))} |"
        )
    overall = report.mape([(p[0], p[1], p[2], p[3]) for p in points])
    within = sum(bool(r["summary"]["top_ranked_within_5pct"]) for r in results)
    lines += [
        "",
        f"Overall MAPE over {len(points)} validated (workload, placement) pairs: **{100 * overall:.1f}%**; "
        f"top-ranked within 5% of the measured best in **{within}/{len(results)}** workloads.",
        "",
        report.format_validation(points),
    ]
    (out / "validation.md").write_text("\n".join(lines) + "\n")
    (out / "validation.json").write_text(json.dumps({"results": results, "mape": overall}, indent=1, default=str))
    report.plot_validation(points, out / "validation.png")
    print("\n".join(lines))


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="*", default=None, help="names of the workloads to run (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="validation runs per placement (median)")
    p.add_argument("--top", type=int, default=3, help="top-ranked placements validated where not all are")
    p.add_argument("--env-steps", type=int, default=None, help="env steps per validation run (default: ~4 s)")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/advisor")
    args = p.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    studies = [s for s in STUDIES if args.only is None or s.name in args.only]
    if not studies:
        p.error(f"--only names none of {[s.name for s in STUDIES]}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for study in studies:
        print(f"== {study.name}", flush=True)
        results.append(run_study(study, out, args.repeats, args.top, args.env_steps))
        (out / f"{study.name}.partial.json").write_text(json.dumps(results[-1], indent=1, default=str))
    write_overall(results, out, argv)
    for study in studies:
        (out / f"{study.name}.partial.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
