"""Fixed-point error of the FPGA tree, measured through the emulation: P(i) and IS weights against float64.

    python benchmarks/bench_fpga_error.py            # N = 1e5 PER priorities on device "fpga:emu"
    python benchmarks/bench_fpga_error.py --device fpga:ref   # the NumPy reference instead (same bits)

The RMM holds a priority ``p`` as the 32-bit leaf ``q = round(p * 2**22)``
and sums leaves exactly in 64 bits, so its sampling probability is
``P(i) = q_i / sum q`` and its IS weight ``(q_min / q_i) ** beta`` (float64,
returned as float32). This script fills a tree of N leaves with priorities
drawn the way PER makes them, ``(|td| + eps) ** alpha`` with ``eps = 1e-6``,
``alpha = 0.6`` and ``|td|`` log-uniform on ``[1e-8, 1e4]`` plus some exact
zeros (the floor ``eps ** alpha ~ 2.5e-4``), reads back every leaf (GET) and
the total (the trailer), samples a batch of N draws, and compares with the
float64 formulas ``p_i / sum p`` and ``(p_min / p_i) ** beta``:

* worst relative error of ``P(i)`` over all leaves, and per decade of ``p``;
* worst relative error of the IS weights for ``beta`` 0.4 and 1.0, over all
  leaves and over the sampled batch (the weights ``sample`` returns);
* the analytic bounds: a leaf rounds by at most ``2**-23`` (absolute), so
  ``|P err| <= (2**-23 / p_i + E) / (1 - E)`` with ``E = N 2**-23 / sum p``,
  and ``|w err| <= beta (2**-23 / p_min + 2**-23 / p_i)`` (first order) plus
  the float32 rounding ``2**-24``.

Results go to ``<out>/fpga-error.{json,md}`` and the Markdown is printed.
Takes a few seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import report

from hetero_replay import _native
from hetero_replay.fpga.fixed_point import FRAC_BITS, LEAF_BITS, MAX_PRIORITY, MIN_PRIORITY, SCALE
from hetero_replay.fpga.protocol import REG_ERRORS
from hetero_replay.trees.fpga_tree import FpgaSumTree

HALF_STEP = 2.0**-23  # largest rounding error of one leaf (absolute)
BETAS = (0.4, 1.0)


def per_priorities(rng: np.random.Generator, n: int, alpha: float, eps: float) -> np.ndarray:
    """``(|td| + eps) ** alpha`` (float64, the C++ power every CPU tree uses), ``|td|`` log-uniform on [1e-8, 1e4].

    One in a thousand TD errors is exactly 0, so the floor ``eps ** alpha`` (the worst case) is present.
    """
    td = np.exp(rng.uniform(math.log(1e-8), math.log(1e4), n))
    td[rng.random(n) < 1e-3] = 0.0
    td[0] = 0.0
    p, _ = _native.td_priorities(td, alpha, eps, np.float64)
    return p


def measure(capacity: int, device: str, seed: int, alpha: float, eps: float) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    p = per_priorities(rng, capacity, alpha, eps)
    start = time.perf_counter()
    tree = FpgaSumTree(capacity, 16, "float64", device=device)
    tree.update(np.arange(capacity), p)
    q = tree.leaves_q().astype(np.float64)  # every leaf, read back from the RMM
    total_q = tree.total() * SCALE  # from the trailer (exact: < 2**53)
    seconds = time.perf_counter() - start

    exact_p = p / math.fsum(p)
    rel_p = np.abs((q / total_q) / exact_p - 1)
    e_total = capacity * HALF_STEP / math.fsum(p)
    bound_p = (HALF_STEP / p + e_total) / (1 - e_total)

    decades = []
    edges = 10.0 ** np.arange(math.floor(math.log10(p.min())), math.ceil(math.log10(p.max())) + 1)
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (p >= lo) & (p < hi)
        if inside.any():
            decades.append(
                {
                    "p_from": float(max(lo, p[inside].min())),
                    "p_to": float(hi),
                    "leaves": int(inside.sum()),
                    "max_rel_error_p": float(rel_p[inside].max()),
                    "bound_p": float(bound_p[inside].max()),
                }
            )

    weights = []
    idx, _ = tree.sample(capacity, rng, 0.0, stratified=True)
    for beta in BETAS:
        exact_w = (p.min() / p) ** beta
        all_w = tree.is_weights(q, beta).astype(np.float64)  # what sample returns, for every leaf
        rel_all = np.abs(all_w / exact_w - 1)
        spread = HALF_STEP / p.min() + HALF_STEP / p
        bound_w = beta * spread * (1 + 3 * spread) + 2.0**-24 * (1 + beta * spread)
        sampled_idx, sampled_w = tree.sample(capacity, rng, beta, stratified=True)
        rel_sampled = np.abs(sampled_w.astype(np.float64) / exact_w[sampled_idx] - 1)
        worst = int(np.argmax(rel_all))
        weights.append(
            {
                "beta": beta,
                "max_rel_error_all_leaves": float(rel_all.max()),
                "at_p": float(p[worst]),
                "median_rel_error": float(np.median(rel_all)),
                "max_rel_error_sampled": float(rel_sampled.max()),
                "sampled": capacity,
                "bound_worst": float(bound_w.max()),
                "within_bound": bool(np.all(rel_all <= bound_w)),
            }
        )
    worst_p = int(np.argmax(rel_p))
    return {
        "p_min": float(p.min()),
        "p_max": float(p.max()),
        "sum_p": math.fsum(p),
        "probability": {
            "max_rel_error": float(rel_p.max()),
            "at_p": float(p[worst_p]),
            "median_rel_error": float(np.median(rel_p)),
            "bound_worst": float(bound_p.max()),
            "within_bound": bool(np.all(rel_p <= bound_p)),
            "by_decade": decades,
        },
        "weights": weights,
        "zero_draws": int(np.count_nonzero(q[idx] == 0)),
        "fill_and_read_s": seconds,
        "kernel_errors": int(tree.port.read_register(REG_ERRORS)),
    }


def markdown(results: dict[str, Any]) -> str:
    w, m, r = results["workload"], results["machine"], results["results"]
    prob = r["probability"]
    out = [
        "# FPGA tree: fixed-point error against float64",
        "",
        f"- **Format:** unsigned {LEAF_BITS}-bit leaves, FRAC_BITS = {FRAC_BITS}: priorities 0 or "
        f"[{MIN_PRIORITY:.3g}, {MAX_PRIORITY:.7g}], round to nearest (half a step = 2^-23 = {HALF_STEP:.3g}); "
        "exact uint64 sums",
        f"- **Workload:** N = {w['capacity']:,} PER priorities (|td| + eps)^alpha, eps = {w['eps']}, "
        f"alpha = {w['alpha']}, |td| log-uniform on [1e-8, 1e4], and 0 for 0.1 % of them; p from {r['p_min']:.4g} "
        f"(= eps^alpha) to {r['p_max']:.4g}, sum {r['sum_p']:.6g}; seed {w['seed']}",
        f"- **Measured through:** device `{w['device']}` ({w['port']}): every leaf read back with GET, the "
        "total from the trailer, N stratified draws with SAMPLE; weights as `FpgaSumTree.sample` returns them",
        f"- **Run:** {m['date']}, git {m['git']}, Python {m['python']}, NumPy {m['numpy']}, {m['cpu']}",
        "",
        "## Worst-case relative error",
        "",
        *report.table(
            ["quantity", "worst measured", "at p", "median", "bound (worst leaf)", "within bound"],
            [
                [
                    "P(i) = q_i / Σq",
                    f"{prob['max_rel_error']:.3e}",
                    f"{prob['at_p']:.4g}",
                    f"{prob['median_rel_error']:.2e}",
                    f"{prob['bound_worst']:.3e}",
                    "yes" if prob["within_bound"] else "**no**",
                ]
            ]
            + [
                [
                    f"IS weight, beta = {x['beta']}",
                    f"{x['max_rel_error_all_leaves']:.3e}",
                    f"{x['at_p']:.4g}",
                    f"{x['median_rel_error']:.2e}",
                    f"{x['bound_worst']:.3e}",
                    "yes" if x["within_bound"] else "**no**",
                ]
                for x in r["weights"]
            ],
        ),
        "",
        "Weights of the sampled batch (N draws): worst relative error "
        + ", ".join(f"{x['max_rel_error_sampled']:.3e} at beta {x['beta']}" for x in r["weights"])
        + f". Draws of a zero leaf: {r['zero_draws']}. Kernel error flags raised: {r['kernel_errors']}.",
        "",
        "Bounds: a leaf rounds by at most 2^-23 absolute, i.e. 2^-23 / p relative, so "
        "|P err| ≤ (2^-23/p_i + E)/(1 − E) with E = N·2^-23/Σp (the total's relative error), and "
        "|w err| ≤ β(2^-23/p_min + 2^-23/p_i) to first order, plus 2^-24 for the float32 result. The worst "
        "case is the smallest priority: 2^-23/(1e-6)^0.6 = 4.7e-4.",
        "",
        "## P(i) by decade of priority",
        "",
        *report.table(
            ["p from", "p to", "leaves", "worst measured", "bound"],
            [
                [
                    f"{d['p_from']:.3g}",
                    f"{d['p_to']:.3g}",
                    f"{d['leaves']:,}",
                    f"{d['max_rel_error_p']:.2e}",
                    f"{d['bound_p']:.2e}",
                ]
                for d in prob["by_decade"]
            ],
        ),
        "",
    ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    results = {
        "workload": {
            "capacity": args.capacity,
            "alpha": args.alpha,
            "eps": args.eps,
            "seed": args.seed,
            "device": args.device,
            "port": "the HLS source compiled with g++" if args.device == "fpga:emu" else "the NumPy reference",
        },
        "format": {
            "leaf_bits": LEAF_BITS,
            "frac_bits": FRAC_BITS,
            "min_priority": MIN_PRIORITY,
            "max_priority": MAX_PRIORITY,
        },  # fmt: skip
        "machine": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "git": report.git_revision(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu": report.cpu_model(),
            "hetero_replay": report.package_version("hetero-replay"),
        },
        "results": measure(args.capacity, args.device, args.seed, args.alpha, args.eps),
    }
    results["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fpga-error.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    (out / "fpga-error.md").write_text(text)
    print(text)
    ok = results["results"]["probability"]["within_bound"] and all(
        x["within_bound"] for x in results["results"]["weights"]
    )
    return 0 if ok else 1


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--capacity", type=int, default=100_000, help="leaves (default 1e5)")
    parser.add_argument("--device", default="fpga:emu", choices=["fpga:emu", "fpga:ref"])
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
