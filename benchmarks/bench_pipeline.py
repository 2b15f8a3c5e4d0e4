"""Learner steps/s with strict PER against RelaxedReplay (staleness k), on a CPU learner.

    python benchmarks/bench_pipeline.py            # full: N in {1e5, 1e6} x hidden {8x8, 64x64, 256x256} x B in {64..4096}
    python benchmarks/bench_pipeline.py --quick    # smoke run: N = 1e5, hidden 64x64, B in {64, 1024}, 3 repeats
    python benchmarks/bench_pipeline.py --capacities 1e6 --batches 4096 --hidden 256x256   # one cell ("custom")

**What.** A learner step is ``sample B -> forward/backward/Adam step of an MLP
(obs_dim -> hidden... -> 4 actions) -> update B priorities``. Strict PER runs
it in series on a :class:`~hetero_replay.PrioritizedReplay`; with
:class:`~hetero_replay.pipeline.RelaxedReplay` (``staleness=k, prefetch=k``) a
worker thread draws the next batches and applies the updates while the learner
trains, so a step should cost ``max(T_replay, T_train)`` instead of the sum.

**How.** For each N the buffers (one strict, one per k, ``tree="native"``) are
filled once with the same N random DQN-like transitions (obs float32 (obs_dim,),
action int64, reward float32, next_obs float32 (obs_dim,), done float32) and
random |N(0,1)| priorities, reused by every (hidden, B) cell of that N and
closed before the next N. The TD error is ``q[action] - reward``, the loss
``(weights * td**2).mean()``, and ``|td|`` (NumPy) goes back to the buffer. Per
cell six tasks are timed: ``replay`` (sample + update with precomputed |td| on
the strict buffer: T_replay), ``train`` (the training part alone on pre-sampled
batches: T_train), ``strict`` and each ``k=<k>`` learner loop. They run
round-robin (benchmarks/timing.py): each is warmed up and calibrated to
``--min-time`` s per repeat, then timed ``--repeats`` times in rounds; figures are
medians; gc is off during a repeat. Before every repeat the relaxed buffers are
brought to rest (``RelaxedReplay.rng`` rewinds the batches drawn ahead and stops
the worker's drawing), so no worker runs behind another task's timing. torch runs
on one thread and hetero-replay's C++ pool on one thread; a relaxed buffer adds
one worker thread, so a relaxed learner uses up to two cores.

**Targets** (per cell, in the report): (a) where the replay work is >= 25% of a
strict step (``T_replay / T_strict``), the smallest k gives >= 1.25x the strict
steps/s; (b) the smallest k reaches >= 90% of the bound ``1 / max(T_replay,
T_train)``. Output: ``<out>/pipeline-<name>.{json,md,png}``; the Markdown is also
printed to stdout. See benchmarks/README.md.
"""

from __future__ import annotations

import os

# Before numpy loads: its bundled OpenBLAS would start a thread per core.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import gc
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_replay import machine_info
from report import rate, table
from timing import WARMUP_CALLS, Task, calibrate, run_interleaved
from tqdm import tqdm

import hetero_replay
from hetero_replay import PrioritizedReplay, Sample
from hetero_replay.options import WORKER_MODES
from hetero_replay.pipeline import RelaxedReplay

N_ACTIONS = 4
#: Pre-sampled batches / |td| arrays the component tasks cycle through.
POOL = 8
FILL_CHUNK = 100_000
TARGET_SHARE, TARGET_SPEEDUP, TARGET_BOUND = 0.25, 1.25, 0.90

Hidden = tuple[int, ...]
Buffers = dict[str, Any]  # "strict" -> PrioritizedReplay, "k=<k>" -> RelaxedReplay


@dataclass(frozen=True)
class Plan:
    """What to run: capacities N, batch sizes B, hidden layer sizes, staleness values, timing."""

    capacities: tuple[int, ...]
    batches: tuple[int, ...]
    hidden: tuple[Hidden, ...]
    staleness: tuple[int, ...]
    repeats: int
    min_time: float
    obs_dim: int
    workers: tuple[str, ...] = ("auto",)  # RelaxedReplay's worker modes: the first is the reference


# 8x8 nets: the replay-heavy cells, where replay is a large share of a strict step.
FULL = Plan((100_000, 1_000_000), (64, 256, 1024, 4096), ((8, 8), (64, 64), (256, 256)), (1, 2, 4), 9, 0.2, 8)
QUICK = Plan((100_000,), (64, 1024), ((64, 64),), (1, 2, 4), 3, 0.1, 8)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    torch.set_num_threads(1)
    hetero_replay.set_num_threads(1)
    base = QUICK if args.quick else FULL
    plan = Plan(
        tuple(args.capacities or base.capacities),
        tuple(args.batches or base.batches),
        tuple(args.hidden or base.hidden),
        tuple(sorted(set(args.staleness or base.staleness))),
        args.repeats or base.repeats,
        args.min_time or base.min_time,
        args.obs_dim,
        tuple(args.worker),
    )
    custom = args.capacities or args.batches or args.hidden
    name = args.name or ("quick" if args.quick else "custom" if custom else "full") + f"-{'-'.join(args.worker)}"
    results = run(plan)
    results["summary"] = summarize(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"pipeline-{name}.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(results, indent=1) + "\n")
    plot(results, paths["png"])
    text = markdown(results, name, paths["png"])
    paths["md"].write_text(text)
    print(text)
    print(f"written: {', '.join(map(str, paths.values()))}", file=sys.stderr)
    return 0


def run(plan: Plan) -> dict[str, Any]:
    """Fill the buffers of each N, time every (hidden, B) cell on them; return the raw results."""
    rng = np.random.default_rng(0)
    machine = machine_info()
    cells = len(plan.capacities) * len(plan.hidden) * len(plan.batches)
    tasks_per_cell = 3 + len(plan.staleness)  # replay, train, strict, one per k
    bar = tqdm(total=cells * tasks_per_cell * (plan.repeats + 1), unit="repeat", dynamic_ncols=True, disable=None)
    records: list[dict[str, Any]] = []
    for capacity in plan.capacities:
        bar.set_description(f"N={capacity:.0e} fill")
        buffers = _buffers(capacity, plan, rng)
        try:
            for hidden, batch in itertools.product(plan.hidden, plan.batches):
                bar.set_description(f"N={capacity:.0e} {_hname(hidden)} B={batch}")
                key = {"capacity": capacity, "hidden": _hname(hidden), "batch": batch}
                tasks, in_loop = _cell_tasks(buffers, key, hidden, plan.obs_dim, rng)
                gc.collect()
                gc.freeze()  # torch's objects leave the collector's view: the gc.collect per repeat stays cheap
                for task in tasks:
                    calibrate(task, plan.min_time)
                    bar.update()
                run_interleaved(tasks, plan.repeats, bar.update)
                for task in tasks:
                    record = task.summary()
                    if (spent := in_loop.get(record["variant"])) is not None:
                        record["train_in_loop_s"] = spent[0] / max(spent[1], 1)
                    records.append(record)
                gc.unfreeze()
        finally:
            for buf in buffers.values():
                buf.close()
        del buffers
        gc.collect()
    bar.close()
    machine["loadavg_end"] = os.getloadavg()
    return {
        "machine": machine,
        "plan": asdict(plan),
        "workload": {"alpha": 0.6, "beta": 0.4, "eps": 1e-6, "tree": "native", "n_actions": N_ACTIONS,
                     "optimizer": "Adam(lr=1e-4)", "relaxed": f"RelaxedReplay(staleness=k, prefetch=k, worker=w) for w in {plan.workers}"},
        "method": {
            "statistic": "median over interleaved repeats of seconds per learner step",
            "torch_threads": torch.get_num_threads(),
            "replay_threads": hetero_replay.num_threads(),
            "warmup_calls": WARMUP_CALLS,
            "gc": "collected before each timed repeat and off during it",
        },
        "results": records,
    }  # fmt: skip


def _buffers(capacity: int, plan: Plan, rng: np.random.Generator) -> Buffers:
    """The strict buffer and one relaxed buffer per k, all holding the same rows and priorities."""
    d = plan.obs_dim
    schema = {"obs": ((d,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
              "next_obs": ((d,), "float32"), "done": ((), "float32")}  # fmt: skip
    data: dict[str, np.ndarray] = {
        "obs": rng.standard_normal((capacity, d), dtype=np.float32),
        "action": rng.integers(0, N_ACTIONS, capacity, dtype=np.int64),
        "reward": rng.standard_normal(capacity, dtype=np.float32),
        "next_obs": rng.standard_normal((capacity, d), dtype=np.float32),
        "done": (rng.random(capacity) < 0.01).astype(np.float32),
    }
    td = np.abs(rng.standard_normal(capacity, dtype=np.float32))

    def filled() -> PrioritizedReplay:
        buf = PrioritizedReplay(capacity, schema, alpha=0.6, beta=0.4, eps=1e-6, tree="native", seed=0)
        for s in range(0, capacity, FILL_CHUNK):
            rows = slice(s, min(s + FILL_CHUNK, capacity))
            buf.add({name: a[rows] for name, a in data.items()})
            buf.update_priorities(np.arange(rows.start, rows.stop), td[rows])  # a tree that is not flat
        return buf

    buffers: Buffers = {"strict": filled()}
    for k in plan.staleness:
        for w in plan.workers:
            buffers[_variant(k, w, plan.workers)] = RelaxedReplay(filled(), staleness=k, prefetch=k, worker=w)
    return buffers


def _trainer(obs_dim: int, hidden: Hidden) -> Callable[[Sample], np.ndarray]:
    """One Adam step of a fresh MLP on a batch; returns |TD error| as NumPy."""
    torch.manual_seed(0)
    sizes = (obs_dim, *hidden)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], N_ACTIONS))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def train(batch: Sample) -> np.ndarray:
        d = batch.data
        q = model(torch.from_numpy(d["obs"])).gather(1, torch.from_numpy(d["action"]).unsqueeze(1)).squeeze(1)
        td = q - torch.from_numpy(d["reward"])  # target: a fixed function of the reward
        loss = (torch.from_numpy(batch.weights) * td.square()).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return td.detach().abs().numpy()

    return train


def _cell_tasks(
    buffers: Buffers, key: dict[str, Any], hidden: Hidden, obs_dim: int, rng: np.random.Generator
) -> tuple[list[Task], dict[str, list[float]]]:
    """replay / train components, then the strict and relaxed learner loops, for one (N, hidden, B).

    Also returns, per learner loop, ``[seconds, calls]`` of its training part, filled as the loops run.
    """
    batch, strict = key["batch"], buffers["strict"]
    train = _trainer(obs_dim, hidden)
    tds = itertools.cycle([np.abs(rng.standard_normal(batch)).astype(np.float32) for _ in range(POOL)])
    batches = itertools.cycle([strict.sample(batch) for _ in range(POOL)])
    relaxed = [buf for name, buf in buffers.items() if name != "strict"]

    def rest() -> None:
        for buf in relaxed:
            buf.rng  # noqa: B018 - rewinds batches drawn ahead and holds the worker until the next sample

    def replay() -> None:
        s = strict.sample(batch)
        strict.update_priorities(s.indices, next(tds))

    in_loop: dict[str, list[float]] = {}

    def learner(name: str, buf: Any) -> Callable[[], None]:
        # The training part is timed inside the loop too: there its batch arrives fresh from the replay and
        # the replay's work has just left the caches, so it costs more than T_train on pre-sampled batches.
        spent = in_loop.setdefault(name, [0.0, 0])

        def step() -> None:
            s = buf.sample(batch)
            start = time.perf_counter()
            td = train(s)
            spent[0] += time.perf_counter() - start
            spent[1] += 1
            buf.update_priorities(s.indices, td)

        return step

    fns = {"replay": replay, "train": lambda: train(next(batches))}
    fns |= {name: learner(name, buf) for name, buf in buffers.items()}
    return [Task({**key, "variant": name}, fn, rest) for name, fn in fns.items()], in_loop


# -- summary, report, plot --------------------------------------------------------------


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (N, hidden, B): component times, steps/s per variant, the bound and both targets."""
    median: dict[tuple[int, str, int], dict[str, float]] = {}
    train_in_loop: dict[tuple[int, str, int], float] = {}
    for r in results["results"]:
        median.setdefault((r["capacity"], r["hidden"], r["batch"]), {})[r["variant"]] = r["median_s"]
        if r["variant"] == "strict" and "train_in_loop_s" in r:
            train_in_loop[(r["capacity"], r["hidden"], r["batch"])] = r["train_in_loop_s"]
    ref = f"k={results['plan']['staleness'][0]}"
    cells = []
    for (capacity, hidden, batch), t in median.items():
        steps = {v: 1 / s for v, s in t.items() if v not in ("replay", "train")}
        share = t["replay"] / t["strict"]
        bound = 1 / max(t["replay"], t["train"])
        speedup, of_bound = steps[ref] / steps["strict"], steps[ref] / bound
        t_loop = train_in_loop.get((capacity, hidden, batch), float("nan"))
        loop_bound = 1 / max(t["replay"], t_loop)
        cells.append({
            "capacity": capacity, "hidden": hidden, "batch": batch,
            "t_replay_s": t["replay"], "t_train_s": t["train"], "t_strict_s": t["strict"],
            "replay_share": share, "strict_over_serial": t["strict"] / (t["replay"] + t["train"]),
            "steps_per_s": steps, "bound_steps_per_s": bound, "reference": ref,
            "speedup": speedup, "of_bound": of_bound,
            "t_train_in_loop_s": t_loop, "loop_bound_steps_per_s": loop_bound, "of_loop_bound": steps[ref] / loop_bound,
            "target_a": speedup >= TARGET_SPEEDUP if share >= TARGET_SHARE else None,
            "target_b": of_bound >= TARGET_BOUND,
        })  # fmt: skip
    return cells


def markdown(results: dict[str, Any], name: str, png: Path) -> str:
    m, plan, meth = results["machine"], results["plan"], results["method"]
    cells = results["summary"]
    ks = [_variant(k, w, plan["workers"]) for k in plan["staleness"] for w in plan["workers"]]
    ref = cells[0]["reference"]
    out = [
        f"# Relaxed-replay pipeline benchmark: {name}",
        "",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores, caches {m['caches'] or 'unknown'}, {m['memory_gib']} GiB; "
        f"1-min load average {m['loadavg_start'][0]:.2f} → {m['loadavg_end'][0]:.2f}",
        f"- **Run:** {m['date']}, git {m['git']}; Python {m['python']}; torch {m['versions']['torch']}, "
        f"numpy {m['versions']['numpy']}",
        f"- **Threads:** torch {meth['torch_threads']} (`torch.set_num_threads(1)`); hetero-replay's C++ pool "
        f"{meth['replay_threads']} (`hetero_replay.set_num_threads(1)`); each relaxed buffer adds one worker thread",
        f"- **Workload:** obs float32 ({plan['obs_dim']},), action int64, reward float32, next_obs, done; "
        f"tree native, alpha 0.6, beta 0.4; MLP obs → hidden → {N_ACTIONS}, Adam; TD = q[action] − reward; "
        f"relaxed = `{results['workload']['relaxed']}`",
        f"- **Method:** median of {plan['repeats']} interleaved repeats of ≥ {plan['min_time']} s after "
        f"{meth['warmup_calls']} warm-up steps; {meth['gc']}; relaxed buffers brought to rest before each repeat",
        "",
        f"T_replay = sample + update alone (strict buffer); T_train = forward/backward/Adam alone; share = "
        f"T_replay ÷ strict step; serial = strict step ÷ (T_replay + T_train); bound = 1 / max(T_replay, T_train). "
        f"T_train in loop = the training part timed inside the strict loop (its batch fresh from the replay, the "
        f"caches just used by it); loop bound = 1 / max(T_replay, T_train in loop), what no pipeline can pass. "
        f"(a): share ≥ {TARGET_SHARE:.0%} ⇒ {ref} ≥ {TARGET_SPEEDUP:g}× strict (n.a. below); "
        f"(b): {ref} ≥ {TARGET_BOUND:.0%} of the bound.",
        "",
        f"![learner steps/s]({png.name})",
        "",
    ]
    for capacity, hidden in dict.fromkeys((c["capacity"], c["hidden"]) for c in cells):
        out += [f"## N = {capacity:,}, hidden {hidden}", ""]
        head = ["B", "T_replay µs", "T_train µs", "T_train in loop µs", "share", "serial", "strict /s",
                *(f"{k} /s" for k in ks), f"{ref} × strict", "bound /s", f"{ref} % bound", f"{ref} % loop bound",
                "(a)", "(b)"]  # fmt: skip
        body = [
            [str(c["batch"]), f"{c['t_replay_s'] * 1e6:,.0f}", f"{c['t_train_s'] * 1e6:,.0f}",
             f"{c['t_train_in_loop_s'] * 1e6:,.0f}", f"{c['replay_share']:.0%}", f"{c['strict_over_serial']:.2f}",
             rate(c["steps_per_s"]["strict"]), *(rate(c["steps_per_s"][k]) for k in ks), f"{c['speedup']:.2f}×",
             rate(c["bound_steps_per_s"]), f"{c['of_bound']:.0%}", f"{c['of_loop_bound']:.0%}",
             _mark(c["target_a"]), _mark(c["target_b"])]
            for c in cells if (c["capacity"], c["hidden"]) == (capacity, hidden)
        ]  # fmt: skip
        out += table(head, body) + [""]
    applicable = [c["target_a"] for c in cells if c["target_a"] is not None]
    out += [
        f"**Summary:** target (a) passes in {sum(applicable)} of {len(applicable)} cells where it applies "
        f"({len(cells) - len(applicable)} n.a.); target (b) passes in {sum(c['target_b'] for c in cells)} "
        f"of {len(cells)} cells.",
        "",
    ]
    return "\n".join(out)


def _mark(ok: bool | None) -> str:
    return "n.a." if ok is None else "pass" if ok else "fail"


def plot(results: dict[str, Any], path: Path) -> None:
    """Learner steps/s against B, one panel per (N, hidden): strict, each k, and the bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan, cells = results["plan"], results["summary"]
    rows, cols = plan["capacities"], [_hname(tuple(h)) for h in plan["hidden"]]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(1 + 4.5 * len(cols), 4 * len(rows)), squeeze=False)
    for (i, capacity), (j, hidden) in itertools.product(enumerate(rows), enumerate(cols)):
        ax, mine = axes[i][j], [c for c in cells if (c["capacity"], c["hidden"]) == (capacity, hidden)]
        xs = [c["batch"] for c in mine]
        for v in ["strict", *(_variant(k, w, plan["workers"]) for k in plan["staleness"] for w in plan["workers"])]:
            ax.plot(xs, [c["steps_per_s"][v] for c in mine], marker="o", lw=2.2 if v == "strict" else 1.4, label=v)
        ax.plot(xs, [c["bound_steps_per_s"] for c in mine], "k--", lw=1, label="bound 1/max(T_replay, T_train)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(b) for b in xs])
        ax.set_title(f"N = {capacity:,}, hidden {hidden}", fontsize=10)
        ax.set_xlabel("batch size B")
        ax.set_ylabel("learner steps/s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    m = results["machine"]
    fig.suptitle(f"{m['cpu']}, {m['cores']} cores; torch 1 thread, replay pool 1 thread; {m['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- command line -----------------------------------------------------------------------


def _variant(k: int, worker: str, workers: Sequence[str]) -> str:
    """A relaxed buffer's column: ``k=<k>`` for the first worker mode, ``k=<k> <worker>`` for the others."""
    return f"k={k}" if worker == workers[0] else f"k={k} {worker}"


def _hname(hidden: Hidden) -> str:
    return "x".join(map(str, hidden))


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: N = 1e5, hidden 64x64, B in {64, 1024}")
    p.add_argument("--capacities", type=_count, nargs="+", metavar="N", help="capacities, e.g. 1e5 1e6")
    p.add_argument("--batches", type=_count, nargs="+", metavar="B", help="batch sizes")
    p.add_argument("--hidden", type=_hidden, nargs="+", metavar="HxH", help="hidden layer sizes, e.g. 64x64 256x256")
    p.add_argument("--staleness", type=_count, nargs="+", metavar="K", help="staleness values (default 1 2 4)")
    p.add_argument("--repeats", type=int, help=f"interleaved repeats (full {FULL.repeats}, quick {QUICK.repeats})")
    p.add_argument("--min-time", type=float, help=f"seconds per repeat (full {FULL.min_time}, quick {QUICK.min_time})")
    p.add_argument("--obs-dim", type=_count, default=8, help="observation size (default 8)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="output directory")
    p.add_argument(
        "--worker",
        choices=WORKER_MODES,
        nargs="+",
        default=["auto"],
        help="RelaxedReplay's worker: native (C++ thread, no GIL), thread (a Python thread), inline, "
        "auto (native where it applies; default); several: compared in one run, the first is the reference",
    )
    p.add_argument("--name", help="output stem after 'pipeline-' (default: full, quick or custom, then -WORKER)")
    return p.parse_args(argv)


def _count(text: str) -> int:
    value = float(text)
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text}")
    return int(value)


def _hidden(text: str) -> Hidden:
    try:
        return tuple(_count(part) for part in text.lower().split("x"))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"not layer sizes like 64x64: {text}") from None


if __name__ == "__main__":
    sys.exit(main())
