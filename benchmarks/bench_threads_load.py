"""The C++ pool's default thread count against one thread, on a quiet machine and with a core busy.

    python benchmarks/bench_threads_load.py            # N = 1e6, B in {256, 1024, 4096}, 9 repeats
    python benchmarks/bench_threads_load.py --quick    # B = 1024, 3 repeats

**What.** A learner step of the engine (``PrioritizedReplay(tree="native")``:
sample B with rows and IS weights, then update B priorities) timed with
``hetero_replay.set_num_threads(1)`` and with the library's default
(``set_num_threads(None)``: all hardware threads, of which a call uses those other
processes leave idle; csrc/hetero_replay/task_pool.hpp), interleaved (benchmarks/timing.py),
medians; after each change of the thread count, ``SETTLE_CALLS`` untimed calls let the pool's
back-off settle as it does early in a run. Twice: on the machine as it is, and "under load", with another
process spinning on one core (as a simulator or a SubprocVecEnv worker would).
Target (issue 26): under load the default is never slower than one thread.
Output: ``<out>/threads-load-<name>.{json,md}``; the Markdown is printed too.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from bench_replay import machine_info
from report import table
from timing import Task, calibrate, run_interleaved

import hetero_replay
from hetero_replay import PrioritizedReplay

#: Untimed calls after each change of the thread count, before a timed repeat: setting the count forgets the
#: pool's back-off (task_pool.hpp), which takes up to 8 + 16 + ... + 1024 calls to settle again, once per run in a
#: user's training but once per repeat here. Timed from the first call, the repeats measured that ramp, not the
#: steady state a run spends its time in.
SETTLE_CALLS = 2100

SCHEMA = {"obs": ((8,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
          "next_obs": ((8,), "float32"), "done": ((), "float32")}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--capacity", type=float, default=1e6)
    p.add_argument("--repeats", type=int)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--name", default=None)
    args = p.parse_args()
    default = hetero_replay.num_threads()
    batches = (1024,) if args.quick else (256, 1024, 4096)
    repeats = args.repeats or (3 if args.quick else 9)
    n = int(args.capacity)
    rng = np.random.default_rng(0)
    buf = PrioritizedReplay(n, SCHEMA, tree="native", seed=0)
    for s in range(0, n, 100_000):
        k = min(100_000, n - s)
        buf.add({"obs": rng.standard_normal((k, 8), np.float32), "action": rng.integers(0, 4, k),
                 "reward": rng.standard_normal(k, np.float32), "next_obs": rng.standard_normal((k, 8), np.float32),
                 "done": np.zeros(k, np.float32)})  # fmt: skip
        buf.update_priorities(np.arange(s, s + k), np.abs(rng.standard_normal(k)))
    records = []
    for load in ("quiet", "one core busy"):
        spinner = None
        if load != "quiet":
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for b in batches:
                tds = [np.abs(rng.standard_normal(b)) for _ in range(8)]

                def step(b: int = b, tds: list = tds) -> None:
                    s = buf.sample(b)
                    buf.update_priorities(s.indices, tds[int(s.indices[0]) % 8])

                def activate(t: int | None, step: Callable[[], None] = step) -> None:
                    hetero_replay.set_num_threads(t)  # which forgets the pool's back-off: let it settle again
                    for _ in range(SETTLE_CALLS):
                        step()

                tasks = [
                    Task({"load": load, "batch": b, "threads": t}, step, partial(activate, None if t == default else t))
                    for t in (1, default)
                ]  # the default: set_num_threads(None), not a count chosen (which has no idle-core cap)
                for task in tasks:
                    calibrate(task, 0.2)
                run_interleaved(tasks, repeats)
                records.extend(task.summary() for task in tasks)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    hetero_replay.set_num_threads(None)
    result = {"machine": machine_info(), "capacity": n, "default_threads": default, "repeats": repeats,
              "results": records}  # fmt: skip
    name = args.name or ("quick" if args.quick else "full")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"threads-load-{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (out / f"threads-load-{name}.md").write_text(text)
    print(text)
    return 0


def markdown(result: dict) -> str:
    m, default = result["machine"], result["default_threads"]
    t = {(r["load"], r["batch"], r["threads"]): r["median_s"] for r in result["results"]}
    head = ["load", "B", "1 thread µs", f"default ({default}) µs", "default ÷ 1 thread (time)", "default not slower"]
    body = []
    for load, b in dict.fromkeys((r["load"], r["batch"]) for r in result["results"]):
        one, dflt = t[load, b, 1], t[load, b, default]
        body.append([load, str(b), f"{one * 1e6:,.0f}", f"{dflt * 1e6:,.0f}", f"{dflt / one:.2f}",
                     "yes" if dflt <= one * 1.05 else "NO"])  # fmt: skip
    return "\n".join([
        "# Learner step (sample + update) with the default thread count against one thread",
        "",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores; run {m['date']}, git {m['git']}",
        f"- **Workload:** PrioritizedReplay(N={result['capacity']:,}, tree='native'), LunarLander-like rows; "
        f"median of {result['repeats']} interleaved repeats; 'one core busy': another process runs "
        "`while True: pass` meanwhile",
        "- **Command:** `python benchmarks/bench_threads_load.py`",
        "",
        *table(head, body),
        "",
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
