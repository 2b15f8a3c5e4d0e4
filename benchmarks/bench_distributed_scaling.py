"""ShardedReplay learner throughput as shards grow (issue 29): old code and new, interleaved, on one machine.

Each measurement is part 1 of ``bench_distributed.py`` (W writer processes adding chunks of 64 as fast as
they can while the learner samples B = 256 and updates B priorities) at the learner's highest staleness,
for S shards; it records the learner's sampled transitions/s and its CPU time per step
(``time.process_time`` of the learner process, Ray's client threads included: the learner's Ray CPU).

A *variant* is a code tree and a ``batches_per_call`` ``m``, a number or ``cS`` (``c`` per shard: ``m = c * S``, so
the learner makes ``S / m = 1 / c`` calls per step at every S): ``base`` runs the code of ``--base-dir`` (the
starting commit's ``hetero_replay``, e.g. ``git archive``, the native module copied in) at each ``m`` too, in
child processes whose ``sitecustomize`` puts that tree first and hides the editable install, so Ray's shard and
writer processes (which inherit ``PYTHONPATH``) import it too; ``new`` runs this checkout. Every repeat runs
every variant once, in turn (each in a fresh Ray instance); medians over repeats.

It also records the bytes the learner moves per sampled transition (pickled sizes of its shard calls and of
the replies it waits for, over untimed steps after each run), fits ``learner CPU per step = a + (r + c * S) / m``
per code tree (per step, per round of calls, per shard call) on all its (S, m, W) cells but the held-out ones
(default S = 8 and W = 4), reports the model's error on those, and projects the learner-bound sample rate at
each variant's ``m`` to 8..64 nodes (one shard each, 25 Gb/s).

    python benchmarks/bench_distributed_scaling.py --batches-per-call 1 4 --seconds 2 --name distributed-scaling-s8
    python benchmarks/bench_distributed_scaling.py --base-dir ../base --shards 1 2 4 8 --writers 2 \
        --batches-per-call 4 2S --seconds 2 --name distributed-scaling-s8-after
"""

from __future__ import annotations

import os
import pickle

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
BATCH = 256
NETWORK_BPS = 25e9  # the learner's network link in the projection
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
    fill = bd.transitions(args.capacity, np.random.default_rng(0))
    tds = bd.td_pool()
    cells = []
    for s in args.shards:
        m = per_call(args.batches_per_call, s)
        c = bd.Ours(s, args.capacity // s, **options, **({"batches_per_call": m} if m > 1 else {}))
        c.fill(fill)
        ray.get([w.prepare.remote(f"ours-{s}", c.writer()) for w in helpers])
        c0 = time.process_time()
        got = bd.measure_throughput(c, helpers, args.seconds, tds)
        got["learner_cpu_per_step_s"] = (time.process_time() - c0) / got["steps"]
        got.update(probe_bytes(c.replay, tds, args.probe_steps))
        cells.append({"shards": s, **got})
        c.close()
    ray.shutdown()
    print(json.dumps({"hetero_replay": hetero_replay.__file__, "writer_imports": shard_file, "cells": cells}))


class _CountedMethod:
    """An actor method whose calls add the pickled size of their arguments to ``tally["sent"]``."""

    def __init__(self, method: Any, tally: dict[str, int]) -> None:
        self.method, self.tally = method, tally

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.tally["sent"] += len(pickle.dumps((args, kwargs), protocol=5))
        self.tally["calls"] += 1
        return self.method.remote(*args, **kwargs)


class _CountedHandle:
    """A shard's actor handle whose method calls are counted (:class:`_CountedMethod`)."""

    def __init__(self, handle: Any, tally: dict[str, int]) -> None:
        self.handle, self.tally = handle, tally

    def __getattr__(self, name: str) -> Any:
        return _CountedMethod(getattr(self.handle, name), self.tally)


class _CountedRay:
    """The ``ray`` module, but ``get`` adds the pickled size of what it returns to ``tally["received"]``."""

    def __init__(self, ray: Any, tally: dict[str, int]) -> None:
        self.ray, self.tally = ray, tally

    def get(self, refs: Any, *args: Any, **kwargs: Any) -> Any:
        got = self.ray.get(refs, *args, **kwargs)
        self.tally["received"] += len(pickle.dumps(got, protocol=5))
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ray, name)


def probe_bytes(replay: Any, tds: list[Any], steps: int) -> dict[str, float]:
    """Bytes the learner sends and receives per sampled transition, over ``steps`` more learner steps (untimed).

    What Ray moves is measured as the pickled size (protocol 5, what Ray's serializer writes, its
    out-of-band NumPy buffers included) of every shard call's arguments and every reply the learner waits
    for: draws, updates, summaries. Writers' adds are the writers' traffic, not counted here.
    """
    tally = {"sent": 0, "received": 0, "calls": 0}
    shards, ray = replay._shards, replay._ray
    replay._shards = [_CountedHandle(h, tally) for h in shards]
    replay._ray = _CountedRay(ray, tally)
    try:
        for i in range(steps):
            batch = replay.sample(256)
            replay.update_priorities(batch.indices, tds[i % len(tds)])
        replay.summaries  # noqa: B018 - collects the last replies (counted)
    finally:
        replay._shards, replay._ray = shards, ray
    transitions = steps * 256
    return {
        "sent_bytes_per_transition": tally["sent"] / transitions,
        "received_bytes_per_transition": tally["received"] / transitions,
        "calls_per_step": tally["calls"] / steps,
    }


def per_call(spec: str, shards: int) -> int:
    """Batches per call at ``shards`` shards: ``"4"`` is 4; ``"2S"`` is 2 per shard (one call per shard every 2S steps,
    so S/m = 1/2 call per step at every S)."""
    return int(spec[:-1]) * shards if spec.endswith("S") else int(spec)


def run_variant(args: argparse.Namespace, name: str, code: Path | None, per_call: str, writers: int) -> dict[str, Any]:
    env = dict(os.environ)
    if code is not None:
        site = Path(tempfile.mkdtemp(prefix="h29-site-"))
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(base=str(code)))
        env["PYTHONPATH"] = str(site)
    cmd = [sys.executable, __file__, "--child", "--staleness", str(args.staleness), "--writers", str(writers),
           "--capacity", str(args.capacity), "--seconds", str(args.seconds), "--batches-per-call", str(per_call),
           "--probe-steps", str(args.probe_steps), "--shards", *map(str, args.shards)]  # fmt: skip
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


def fit_learner_cpu(points: list[tuple[int, int, int, float]], held_out: set[tuple[int, int]]) -> dict[str, Any]:
    """Least-squares ``learner CPU per step = a + (r + c * S) / m`` (µs) on the (S, m, W, µs) points not in ``held_out``.

    ``a`` is the learner's work per step (sample, update, IS weights), ``r`` its work per round of calls (routing,
    one wait, assembling the replies), ``c`` its work per shard call (Ray's submit and reply, our encoding): a round
    of S calls serves ``m`` steps. Returns ``a``, ``r``, ``c`` and, for every point, the model's value and its relative
    error; the held-out (S, W) points validate the model (they were not fitted).
    """
    import numpy as np

    fit = [(s, m, us) for s, m, w, us in points if (s, w) not in held_out]
    a_matrix = np.array([[1.0, 1.0 / m, s / m] for s, m, _ in fit])
    (a, r, c), *_ = np.linalg.lstsq(a_matrix, np.array([us for *_, us in fit]), rcond=None)
    rows = []
    for s, m, w, us in points:
        model = a + (r + c * s) / m
        rows.append({"shards": s, "batches_per_call": m, "writers": w, "measured_us": us, "model_us": model,
                     "error": model / us - 1, "held_out": (s, w) in held_out})  # fmt: skip
    return {"a_us": float(a), "r_us": float(r), "c_us": float(c), "points": rows}


def project(model: dict[str, Any], spec: str, bytes_per_transition: float, nodes: list[int]) -> list[dict[str, float]]:
    """Learner-bound sampled transitions/s with one shard per node at ``spec`` batches per call (see :func:`per_call`):
    ``B / max(a + (r + c * S) / m, network time per step)``.

    On separate nodes the shards' CPU is their own and staleness 2 hides the round trip behind the learner's
    step, so the learner's CPU per step and the bytes it moves set the rate. Network: 25 Gb/s at the learner.
    """
    out = []
    for s in nodes:
        m = per_call(spec, s)
        cpu = (model["a_us"] + (model["r_us"] + model["c_us"] * s) / m) * 1e-6
        net = BATCH * bytes_per_transition * 8 / NETWORK_BPS
        out.append({"nodes": s, "batches_per_call": m, "learner_cpu_per_step_us": cpu * 1e6,
                    "network_per_step_us": net * 1e6, "sampled_per_s": BATCH / max(cpu, net)})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-dir", type=Path, help="the starting commit's worktree (native module copied in)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--batches-per-call", nargs="+", default=["4"],
                        help="m of each variant: an integer, or cS for c per shard (m = c * S)")  # fmt: skip
    parser.add_argument("--capacity", type=int, default=2**17)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-steps", type=int, default=64, help="untimed steps that measure bytes per call")
    parser.add_argument("--held-out-shards", type=int, nargs="+", default=[8], help="S not fitted (validation)")
    parser.add_argument("--held-out-writers", type=int, nargs="+", default=[4], help="W not fitted (validation)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="distributed-scaling")
    args = parser.parse_args()
    if args.child:
        args.batches_per_call, args.writers = args.batches_per_call[0], args.writers[0]
        return child(args)

    sys.path.insert(0, str(HERE))
    from report import cpu_model, git_revision, table

    variants = [(f"W={w}, new, {m} per call", None, m, w) for w in args.writers for m in args.batches_per_call]
    if args.base_dir is not None:
        base = args.base_dir.resolve()
        variants = [
            (f"W={w}, base, {m} per call", base, m, w) for w in args.writers for m in args.batches_per_call
        ] + variants
    runs: dict[str, list[dict[str, Any]]] = {v[0]: [] for v in variants}
    load0, loads = os.getloadavg(), []
    for r in range(args.repeats):
        for name, code, m, w in variants[r % len(variants) :] + variants[: r % len(variants)]:
            got = run_variant(args, name, code, m, w)
            got["load_1min"] = os.getloadavg()[0]
            loads.append(got["load_1min"])
            runs[name].append(got)
            rates = ", ".join(f"S={c['shards']}: {c['samples_per_s']:.0f}/s" for c in got["cells"])
            print(f"repeat {r} {name} ({got['hetero_replay']}): {rates}", flush=True)
    keys = ("samples_per_s", "inserts_per_s", "learner_cpu_per_step_s", "sent_bytes_per_transition",
            "received_bytes_per_transition", "calls_per_step")  # fmt: skip
    med: dict[tuple[str, int], dict[str, float]] = {}
    for name, rs in runs.items():
        for s in args.shards:
            cs = [c for run in rs for c in run["cells"] if c["shards"] == s]
            med[name, s] = {k: statistics.median(c[k] for c in cs) for k in keys}
            med[name, s]["redraws"] = sum(c["redraws"] for c in cs)
            med[name, s]["inexact"] = sum(c["inexact_batches"] for c in cs)
    body = []
    for name, *_ in variants:
        for s in args.shards:
            m = med[name, s]
            body.append([name, str(s), f"{m['samples_per_s']:,.0f}", f"{m['learner_cpu_per_step_s'] * 1e6:,.0f}",
                         f"{m['sent_bytes_per_transition']:.1f} / {m['received_bytes_per_transition']:.1f}",
                         f"{m['calls_per_step']:.2f}", f"{m['inserts_per_s']:,.0f}",
                         f"{m['redraws']:.0f} / {m['inexact']:.0f}"])  # fmt: skip
    # One model per code tree, fitted over all its batches-per-call variants: the per-call costs scale with S/m.
    models = {}
    model_lines: list[str] = []
    for label in dict.fromkeys("new" if code is None else "base" for _, code, _, _ in variants):
        mine = [(n, spec, w) for n, code, spec, w in variants if ("new" if code is None else "base") == label]
        points = [(s, per_call(spec, s), w, med[n, s]["learner_cpu_per_step_s"] * 1e6)
                  for n, spec, w in mine for s in args.shards]  # fmt: skip
        held = {(s, w) for s, _, w, _ in points if s in args.held_out_shards or w in args.held_out_writers}
        model = fit_learner_cpu(points, held)
        model["projection"] = {}
        errs = [abs(p["error"]) for p in model["points"] if p["held_out"]]
        model_lines += [
            f"**{label}.** Learner CPU per step ≈ {model['a_us']:.0f} + ({model['r_us']:.0f} + "
            f"{model['c_us']:.0f}·S) / m µs (per step, per round of calls, per shard call), fitted on S ∉ "
            f"{{{', '.join(map(str, args.held_out_shards))}}}, W ∉ {{{', '.join(map(str, args.held_out_writers))}}}; "
            + (
                f"on the {len(errs)} held-out points the model is off by {statistics.median(errs):.0%} (median), "
                f"{max(errs):.0%} at most."
                if errs
                else "no point was held out."
            ),
            "",
            *table(
                ["S", "m", "W", "measured µs/step", "model µs/step", "error", "held out"],
                [
                    [
                        str(p["shards"]),
                        str(p["batches_per_call"]),
                        str(p["writers"]),
                        f"{p['measured_us']:,.0f}",
                        f"{p['model_us']:,.0f}",
                        f"{p['error']:+.0%}",
                        "yes" if p["held_out"] else "",
                    ]
                    for p in model["points"]
                ],
            ),  # fmt: skip
            "",
        ]
        for spec in dict.fromkeys(spec for _, spec, _ in mine):
            names = [n for n, sp, _ in mine if sp == spec]
            per_t = statistics.median(med[n, s]["sent_bytes_per_transition"] + med[n, s]["received_bytes_per_transition"]
                                      for n in names for s in args.shards)  # fmt: skip
            projection = project(model, spec, per_t, [8, 16, 32, 64])
            model["projection"][spec] = {"bytes_per_transition": per_t, "nodes": projection}
            model_lines += [
                f"Projected at m = {spec}, one shard per node, {per_t:.0f} B per sampled transition at 25 Gb/s:",
                "",
                *table(
                    ["nodes", "m", "learner CPU µs/step", "network µs/step", "sampled transitions/s"],
                    [
                        [
                            str(p["nodes"]),
                            str(p["batches_per_call"]),
                            f"{p['learner_cpu_per_step_us']:,.0f}",
                            f"{p['network_per_step_us']:.1f}",
                            f"{p['sampled_per_s']:,.0f}",
                        ]
                        for p in projection
                    ],
                ),  # fmt: skip
                "",
            ]
        models[label] = model
    cmd = " ".join(["python", "benchmarks/bench_distributed_scaling.py", *sys.argv[1:]])
    lines = [
        "# ShardedReplay: learner throughput vs shards and writers, bytes per transition, projection",
        "",
        f"`{cmd}`; {cpu_model()}, {os.cpu_count()} cores (shared: 1-min load {load0[0]:.2f} at start, "
        f"{min(loads):.2f}–{max(loads):.2f} during), git {git_revision()}, {time.strftime('%Y-%m-%d %H:%M')}. "
        f"W writer processes adding chunks of 64 as fast as they can; learner batch B = {BATCH}, "
        f"staleness {args.staleness}; {args.capacity:,} transitions over S shard processes; median of "
        f"{args.repeats} interleaved repeats of {args.seconds:g} s, each variant in a fresh Ray instance. Learner, "
        "shards and writers all share these cores. Bytes: pickled size of the learner's shard calls (sent) and "
        f"of the replies it waits for (received), over {args.probe_steps} untimed steps after each run.",
        "",
        *table(
            [
                "variant",
                "S",
                "sampled transitions/s",
                "learner CPU µs/step",
                "bytes/transition sent / received",
                "calls/step",
                "inserts/s",
                "redraws / inexact",
            ],
            body,
        ),  # fmt: skip
        "",
        "## Projection model",
        "",
        *model_lines,
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text("\n".join(lines))
    (args.out / f"{args.name}.json").write_text(json.dumps({"runs": runs, "models": models}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
