"""Sum trees on one device, side by side: our CUDA kernels (``tree="cupy"``), our torch
tree, and TorchRL's prioritized sampler with its tree on the same device.

    python benchmarks/bench_tree_device.py                  # on the GPU: N in {1e6, 1e7} x B in {256, 4096}
    python benchmarks/bench_tree_device.py --device cpu --quick   # smoke run on the CPU

Two operations per (N, B), after filling N leaves with random priorities:

* **sample**: B stratified draws, the descent and the IS weights, results left
  on the device as tensors (draws made on the device where the backend can);
* **update**: B new priorities ``(|td| + eps) ** alpha`` from a TD-error
  tensor already on the device.

Each call is followed by a device synchronisation, so a time is what a
learner waiting for the result sees. samples/s and updates/s = B / median
seconds per call over interleaved repeats (timing.py). On the CPU, ``cupy``
means the same kernels run by the C++ CPU executor. Results go to
``<out>/tree-device-<device>.{json,md}`` and the Markdown is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import report
import torch
from bench_replay import machine_info
from contenders import Workload
from contenders.torchrl_per import load_extension as load_torchrl_extension
from timing import Task, calibrate, run_interleaved
from tqdm import tqdm

from hetero_replay.trees import make_tree

#: Distinct (indices, |td|) pairs an update cycles through.
POOL = 8


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: this torch has no CUDA device (use --device cpu for a smoke run)")
    capacities = [100_000] if args.quick else args.capacities
    batches = [256] if args.quick else args.batches
    repeats, min_time = (3, 0.02) if args.quick else (args.repeats, args.min_time)
    torch.set_num_threads(1)
    results = run(device, capacities, batches, repeats, min_time, Workload())
    text = markdown(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"tree-device-{device.type}" + ("-quick" if args.quick else "")
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (out / f"{name}.md").write_text(text)
    print(text)
    return 0


def run(
    device: torch.device,
    capacities: Sequence[int],
    batches: Sequence[int],
    repeats: int,
    min_time: float,
    workload: Workload,
) -> dict[str, Any]:
    """Time sample and update of every contender that builds on ``device``; a dict for JSON."""
    rows: list[dict[str, Any]] = []
    unavailable: dict[str, str] = {}
    setups: dict[str, str] = {}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(0)
    for capacity in capacities:
        leaves = rng.random(capacity) + 1e-3  # priorities already raised to alpha
        contenders = []
        for label, build in CONTENDERS.items():
            try:
                contenders.append(build(capacity, leaves, device, workload))
                setups[label] = contenders[-1].setup
            except Exception as error:  # a missing library or device removes one column only
                unavailable[label] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        tasks = []
        for c in contenders:
            for batch in batches:
                idx = [torch.as_tensor(rng.integers(0, capacity, batch), device=device) for _ in range(POOL)]
                tds = [torch.as_tensor(rng.random(batch), dtype=torch.float32, device=device) for _ in range(POOL)]
                key = {"capacity": capacity, "batch": batch, "label": c.label}
                tasks.append(Task({**key, "op": "sample"}, _synced(lambda b=batch, c=c: c.sample(b), sync), _noop))
                pairs = itertools.cycle(list(zip(idx, tds)))
                tasks.append(
                    Task({**key, "op": "update"}, _synced(lambda c=c, p=pairs: c.update(*next(p)), sync), _noop)
                )
        with tqdm(total=len(tasks) * (repeats + 1), desc=f"N={capacity:,}", leave=False) as bar:
            for task in tasks:
                calibrate(task, min_time)
                bar.update()
            run_interleaved(tasks, repeats, bar.update)
        rows += [task.summary() for task in tasks]
        del contenders
    return {
        "device": str(device),
        "gpu": _gpu_name(device),
        "machine": machine_info(),
        "workload": vars(workload),
        "method": {"repeats": repeats, "min_time_s": min_time},
        "contenders": setups,
        "unavailable": unavailable,
        "results": rows,
    }


class Contender:
    """A sum tree on a device behind two calls; ``setup`` says how it is driven."""

    label: str
    setup: str

    def sample(self, batch: int) -> Any: ...

    def update(self, indices: torch.Tensor, td: torch.Tensor) -> Any: ...


class Ours(Contender):
    """A hetero-replay tree backend (``"cupy"`` or ``"torch"``) on ``device``."""

    def __init__(self, backend: str, capacity: int, leaves: np.ndarray, device: torch.device, w: Workload) -> None:
        self.label = f"ours/{backend}"
        self.tree = make_tree(backend, capacity, device=str(device))
        self.tree.load_leaves(leaves.astype(np.float32))
        self.w = w
        if backend == "torch":
            self.rng: Any = torch.Generator(device=device).manual_seed(0)  # draws on the device
            draws = "torch.Generator on the device"
        elif device.type == "cuda":
            import cupy

            self.rng = cupy.random.default_rng(0)
            draws = "cupy Generator on the device"
        else:
            self.rng, draws = np.random.default_rng(0), "numpy Generator (CPU executor)"
        # The CPU executor takes NumPy; on a GPU the tensors stay where they are.
        self.host = device.type == "cpu" and backend == "cupy"
        self.setup = (
            f"make_tree({backend!r}, N, fanout=16, float32, device); sample_tensors(B, rng, beta) "
            f"with {draws}; update_td(indices, |td|, alpha, eps) with device tensors"
        )

    def sample(self, batch: int) -> Any:
        return self.tree.sample_tensors(batch, self.rng, self.w.beta)

    def update(self, indices: torch.Tensor, td: torch.Tensor) -> Any:
        if self.host:
            indices, td = indices.numpy(), td.numpy()
        return self.tree.update_td(indices, td, self.w.alpha, self.w.eps)


class TorchRL(Contender):
    """TorchRL's ``PrioritizedSampler`` with its trees on ``device`` (a CUDA tree needs a CUDA build)."""

    label = "torchrl"

    def __init__(self, capacity: int, leaves: np.ndarray, device: torch.device, w: Workload) -> None:
        load_torchrl_extension()
        from torchrl.data import LazyTensorStorage
        from torchrl.data.replay_buffers import PrioritizedSampler

        self.sampler = PrioritizedSampler(capacity, alpha=w.alpha, beta=w.beta, eps=w.eps, device=device)
        self.storage = LazyTensorStorage(capacity, device=device)
        self.storage.set(torch.arange(capacity), torch.zeros(capacity, device=device))
        index = torch.arange(capacity, device=device)
        self.sampler.extend(index)
        self.sampler.update_priority(index, torch.as_tensor(leaves, dtype=torch.float32, device=device))
        if device.type == "cuda" and getattr(self.sampler, "device", torch.device("cpu")).type != "cuda":
            raise RuntimeError("TorchRL kept its tree on the CPU: its C++ extension has no CUDA trees here")
        self.setup = (
            f"PrioritizedSampler(N, alpha, beta, eps, device={str(device)!r}) over "
            "LazyTensorStorage(N, device); sample(storage, B); update_priority(index, |td|)"
        )

    def sample(self, batch: int) -> Any:
        return self.sampler.sample(self.storage, batch)

    def update(self, indices: torch.Tensor, td: torch.Tensor) -> Any:
        return self.sampler.update_priority(indices, td)


CONTENDERS: dict[str, Callable[..., Contender]] = {
    "ours/cupy": lambda *a: Ours("cupy", *a),
    "ours/torch": lambda *a: Ours("torch", *a),
    "torchrl": TorchRL,
}


def markdown(results: dict[str, Any]) -> str:
    """Tables of samples/s and updates/s (transitions per second), ratios to our torch tree and to TorchRL."""
    rows = {(r["capacity"], r["batch"], r["label"], r["op"]): r["median_s"] for r in results["results"]}
    labels = [label for label in CONTENDERS if label in results["contenders"]]
    cells = sorted({(n, b) for n, b, _, _ in rows})
    m = results["machine"]
    lines = [
        f"# Sum trees on {results['device']}" + (f" ({results['gpu']})" if results["gpu"] else ""),
        "",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores; {m['os']}; git {m['git']}; {m['date']}",
        "- **Versions:** " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
        f"- **Method:** median of {results['method']['repeats']} interleaved repeats, each ≥ "
        f"{results['method']['min_time_s']} s of calls, a device synchronisation after every call; torch 1 thread",
        "",
    ]
    for op in ("sample", "update"):
        head = ["N", "B"] + [f"{label} {op}s/s" for label in labels]
        head += [
            f"{label} ÷ {base}"
            for base in ("ours/torch", "torchrl")
            if base in labels
            for label in labels
            if label.startswith("ours/") and label != base
        ]
        body = []
        for n, b in cells:
            rate = {label: b / rows[(n, b, label, op)] for label in labels if (n, b, label, op) in rows}
            row = [f"{n:,}", str(b)] + [report.rate(rate.get(label)) for label in labels]
            row += [
                report.ratio(rate[label] / rate[base]) if label in rate and base in rate else "–"
                for base in ("ours/torch", "torchrl")
                if base in labels
                for label in labels
                if label.startswith("ours/") and label != base
            ]
            body.append(row)
        lines += [f"## {op.capitalize()}s per second (transitions)", "", *report.table(head, body), ""]
    lines += ["## Contenders", "", *(f"- **{k}:** {v}" for k, v in results["contenders"].items())]
    if results["unavailable"]:
        lines += ["", "## Unavailable", "", *(f"- **{k}:** {v}" for k, v in results["unavailable"].items())]
    return "\n".join(lines) + "\n"


def _synced(fn: Callable[[], Any], sync: Callable[[], None]) -> Callable[[], None]:
    def call() -> None:
        fn()
        sync()

    return call


def _noop() -> None:
    pass


def _gpu_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--device", default="cuda", help="torch device of every tree (default cuda)")
    parser.add_argument(
        "--capacities",
        type=lambda s: [int(float(x)) for x in s.split(",")],
        default=[1_000_000, 10_000_000],
        help="comma-separated N (default 1e6,1e7)",
    )
    parser.add_argument(
        "--batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[256, 4096],
        help="comma-separated B (default 256,4096)",
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds of calls per repeat")
    parser.add_argument("--quick", action="store_true", help="N = 1e5, B = 256, 3 short repeats")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
