"""ShardedReplay learner throughput as shards grow (issue 29): old code and new, interleaved, on one machine.

Each measurement is part 1 of ``bench_distributed.py`` (W writer processes adding chunks of 64 as fast as
they can while the learner samples B = 256 and updates B priorities) at the learner's highest staleness,
for S shards; it records the learner's sampled transitions/s and its CPU time per step
(``time.process_time`` of the learner process, Ray's client threads included: the learner's Ray CPU).

A *variant* is a code tree and a ``batches_per_call``: ``base`` runs the code of ``--base-dir`` (a git
worktree of the starting commit, the native module copied in) in child processes whose ``sitecustomize``
puts that tree first and hides the editable install, so Ray's shard and writer processes (which inherit
``PYTHONPATH``) import it too; ``new`` runs this checkout. Every repeat runs every variant once, in turn
(each in a fresh Ray instance); medians over repeats.

    python benchmarks/bench_distributed_scaling.py --base-dir /tmp/h29/base --name distributed-scaling
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "HETERO_REPLAY_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if "editable" not in repr(f).lower() and "editable" not in type(f).__module__.lower()]
sys.path.insert(0, {base!r})
"""


def child(args: argparse.Namespace) -> None:
    """One repeat of every shard count for one variant, in a fresh local Ray; JSON on stdout's last line."""
    import numpy as np
    import ray

    sys.path.insert(0, str(HERE))
    import bench_distributed as bd

    import hetero_replay

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, namespace="hetero_replay",
             log_to_driver=False)  # fmt: skip
    hetero_replay.set_num_threads(1)
    helpers = bd.start_helpers(args.writers)
    shard_file = ray.get(helpers[0].__ray_call__.remote(lambda _: __import__("hetero_replay").__file__))
    options: dict[str, Any] = {"staleness": args.staleness}
    if args.batches_per_call > 1:
        options["batches_per_call"] = args.batches_per_call
    fill = bd.transitions(args.capacity, np.random.default_rng(0))
    tds = bd.td_pool()
    cells = []
    for s in args.shards:
        c = bd.Ours(s, args.capacity // s, **options)
        c.fill(fill)
        ray.get([w.prepare.remote(f"ours-{s}", c.writer()) for w in helpers])
        c0 = time.process_time()
        got = bd.measure_throughput(c, helpers, args.seconds, tds)
        got["learner_cpu_per_step_s"] = (time.process_time() - c0) / got["steps"]
        cells.append({"shards": s, **got})
        c.close()
    ray.shutdown()
    print(json.dumps({"hetero_replay": hetero_replay.__file__, "writer_imports": shard_file, "cells": cells}))


def run_variant(args: argparse.Namespace, name: str, code: Path | None, per_call: int) -> dict[str, Any]:
    env = dict(os.environ)
    if code is not None:
        site = Path(tempfile.mkdtemp(prefix="h29-site-"))
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(base=str(code)))
        env["PYTHONPATH"] = str(site)
    cmd = [sys.executable, __file__, "--child", "--staleness", str(args.staleness), "--writers", str(args.writers),
           "--capacity", str(args.capacity), "--seconds", str(args.seconds), "--batches-per-call", str(per_call),
           "--shards", *map(str, args.shards)]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
    if out.returncode:
        raise SystemExit(f"{name} failed:\n{out.stderr[-4000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if code is not None and not got["writer_imports"].startswith(str(code)):
        raise SystemExit(f"{name}: Ray workers imported {got['writer_imports']}, not {code}")
    # Checked above; the record keeps which code ran, not this machine's paths.
    imported = "base" if code is not None else "this checkout"
    got["hetero_replay"] = got["writer_imports"] = imported
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-dir", type=Path, help="the starting commit's worktree (native module copied in)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--batches-per-call", type=int, nargs="+", default=[4], help="the new code's (1: as before)")
    parser.add_argument("--capacity", type=int, default=2**17)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="distributed-scaling")
    args = parser.parse_args()
    if args.child:
        args.batches_per_call = args.batches_per_call[0]
        return child(args)

    sys.path.insert(0, str(HERE))
    from report import cpu_model, git_revision, table

    variants = [(f"new, {m} per call", None, m) for m in args.batches_per_call]
    if args.base_dir is not None:
        variants.insert(0, ("base", args.base_dir.resolve(), 1))
    runs: dict[str, list[dict[str, Any]]] = {v[0]: [] for v in variants}
    load0 = os.getloadavg()
    for r in range(args.repeats):
        for name, code, m in variants[r % len(variants) :] + variants[: r % len(variants)]:
            got = run_variant(args, name, code, m)
            runs[name].append(got)
            rates = ", ".join(f"S={c['shards']}: {c['samples_per_s']:.0f}/s" for c in got["cells"])
            print(f"repeat {r} {name} ({got['hetero_replay']}): {rates}", flush=True)
    med: dict[tuple[str, int], dict[str, float]] = {}
    for name, rs in runs.items():
        for s in args.shards:
            cs = [c for run in rs for c in run["cells"] if c["shards"] == s]
            med[name, s] = {k: statistics.median(c[k] for c in cs)
                            for k in ("samples_per_s", "inserts_per_s", "learner_cpu_per_step_s")}  # fmt: skip
            med[name, s]["redraws"] = sum(c["redraws"] for c in cs)
            med[name, s]["inexact"] = sum(c["inexact_batches"] for c in cs)
    body = []
    for s in args.shards:
        ref = med.get(("base", s))
        for name, _, _ in variants:
            m = med[name, s]
            vs = "" if ref is None else (f"{m['samples_per_s'] / ref['samples_per_s']:.2f}× / "
                                         f"{m['learner_cpu_per_step_s'] / ref['learner_cpu_per_step_s']:.2f}×")  # fmt: skip
            body.append([str(s), name, f"{m['samples_per_s']:,.0f}", f"{m['learner_cpu_per_step_s'] * 1e6:,.0f}",
                         f"{m['inserts_per_s']:,.0f}", vs, f"{m['redraws']:.0f} / {m['inexact']:.0f}"])  # fmt: skip
    cmd = " ".join(["python", "benchmarks/bench_distributed_scaling.py", *sys.argv[1:]])
    lines = [
        "# ShardedReplay: learner throughput vs shards, before and after batching draws per call",
        "",
        f"`{cmd}`; {cpu_model()}, {os.cpu_count()} cores (shared: 1-min load {load0[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end), git {git_revision()}, {time.strftime('%Y-%m-%d %H:%M')}. "
        f"W = {args.writers} writer processes adding chunks of 64 as fast as they can; learner batch B = 256, "
        f"staleness {args.staleness}; {args.capacity:,} transitions over S shards; median of {args.repeats} "
        f"interleaved repeats of {args.seconds:g} s, each variant in a fresh Ray instance. Learner, shards and "
        "writers all share these cores.",
        "",
        *table(
            [
                "S",
                "variant",
                "sampled transitions/s",
                "learner CPU µs/step",
                "inserts/s",
                "vs base (rate / CPU)",
                "redraws / inexact",
            ],
            body,
        ),  # fmt: skip
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text("\n".join(lines))
    (args.out / f"{args.name}.json").write_text(json.dumps(runs, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
