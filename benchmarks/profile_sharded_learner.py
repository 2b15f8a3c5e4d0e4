"""Where a ShardedReplay learner's CPU goes (issue 29): cProfile on the learner's main-thread CPU clock.

The learner of ``bench_distributed.py``'s throughput part (W writer processes adding chunks of 64 as fast as
they can; the learner samples B = 256 and updates B priorities at staleness 2, ``m`` batches per call) runs
``--seconds`` unprofiled, then ``--seconds`` under cProfile with ``time.thread_time`` as its clock. It reports
the learner process's CPU per step (``process_time``: Ray's core-worker threads included) and its main
thread's, and the profiled main-thread CPU per step of each part of a step. cProfile inflates Python-heavy
parts several-fold: read the parts as shares, and the unprofiled numbers as the costs.

``--base-dir`` profiles another code tree (the starting commit's ``hetero_replay``, the native module copied
in), run in a child process whose ``sitecustomize`` puts that tree first, so Ray's shard and writer processes
import it too (as ``bench_distributed_scaling.py`` does).

    python benchmarks/profile_sharded_learner.py --name distributed-learner-profile-after
    python benchmarks/profile_sharded_learner.py --base-dir /tmp/base --name distributed-learner-profile-before
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "HETERO_REPLAY_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import cProfile
import json
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: The parts of a learner step: (label, does a profiled function (file, name) belong to it).
PARTS: list[tuple[str, Callable[[str, str], bool]]] = [
    ("whole step", lambda f, n: n == "step" and f.endswith("bench_distributed.py")),
    ("Ray submit (actor method .remote)", lambda f, n: f.endswith("ray/actor.py") and n == "remote"),
    ("  of which serialising arguments", lambda f, n: f.endswith("serialization.py") and n == "serialize"),
    ("ray.get (replies)", lambda f, n: f.endswith("_private/worker.py") and n == "get"),
    ("  of which deserialising", lambda f, n: f.endswith("_private/worker.py") and n == "deserialize_objects"),
    ("update_priorities (checks, schedule)", lambda f, n: n == "update_priorities" and "sharded" in f),
    ("routing (_route)", lambda f, n: n == "_route"),
    ("splitting updates by shard", lambda f, n: n in ("_by_shard", "_updates_by_shard")),
    ("assembling replies (_assemble)", lambda f, n: n == "_assemble"),
    ("IS weights (_serve)", lambda f, n: n == "_serve" and "sharded" in f),
]


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Fill a replay, start the writers, run the learner unprofiled and then profiled; the numbers per step."""
    import numpy as np
    import ray

    sys.path.insert(0, str(HERE))
    import bench_distributed as bd

    import hetero_replay

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, namespace="hetero_replay",
             log_to_driver=False)  # fmt: skip
    hetero_replay.set_num_threads(1)
    helpers = bd.start_helpers(args.writers)
    s = args.shards
    contender = bd.Ours(s, args.capacity // s, staleness=2, batches_per_call=args.batches_per_call)
    contender.fill(bd.transitions(args.capacity, np.random.default_rng(0)))
    ray.get([w.prepare.remote(f"ours-{s}", contender.writer()) for w in helpers])
    tds = bd.td_pool()
    for i in range(50):  # warm
        contender.step(tds[i % len(tds)])
    out: dict[str, Any] = {"code": "base" if args.base_dir else "this checkout"}
    for mode in ("unprofiled", "profiled"):
        prof = cProfile.Profile(time.thread_time)
        c0, t0 = time.process_time(), time.thread_time()
        if mode == "profiled":
            prof.enable()
        got = bd.measure_throughput(contender, helpers, args.seconds, tds)
        prof.disable()
        steps = got["steps"]
        out[mode] = {
            "samples_per_s": got["samples_per_s"],
            "steps": steps,
            "process_cpu_us_per_step": (time.process_time() - c0) / steps * 1e6,
            "main_thread_cpu_us_per_step": (time.thread_time() - t0) / steps * 1e6,
        }
        if mode == "profiled":
            stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            out["parts_us_per_step"] = {
                label: sum(v[3] for (f, _, n), v in stats.items() if belongs(f, n)) / steps * 1e6
                for label, belongs in PARTS
            }
    contender.close()
    ray.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-dir", type=Path, help="profile this hetero_replay tree instead (see above)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--batches-per-call", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=2**17)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="distributed-learner-profile")
    args = parser.parse_args()
    if args.child or args.base_dir is None:
        got = profile(args)
        if args.child:
            print(json.dumps(got))
            return
    else:
        import bench_distributed_scaling as scaling

        site = Path(tempfile.mkdtemp(prefix="h29-site-"))
        (site / "sitecustomize.py").write_text(scaling.SITECUSTOMIZE.format(base=str(args.base_dir.resolve())))
        cmd = [sys.executable, __file__, "--child", *sys.argv[1:]]
        env = {**os.environ, "PYTHONPATH": str(site)}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
        got = json.loads(done.stdout.strip().splitlines()[-1])
    got["command"] = " ".join(["python", "benchmarks/profile_sharded_learner.py", *sys.argv[1:]])
    got["setting"] = {k: getattr(args, k) for k in ("shards", "writers", "batches_per_call", "capacity", "seconds")}
    got["load_1min"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(got, indent=1))
    print(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
