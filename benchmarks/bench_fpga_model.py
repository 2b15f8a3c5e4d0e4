"""The FPGA cycle model's predicted sampling rate next to our measured C++ tree.

    python benchmarks/bench_fpga_model.py            # N in {1e5, 1e6} x B in {32, 256, 4096}, ~1 minute
    python benchmarks/bench_fpga_model.py --quick    # smoke run: 3 repeats of 0.02 s

**Predicted** (``hetero_replay.fpga.cycle_model``), per FPGA part: draws per
second of back-to-back SAMPLE commands of ``B`` draws, kernel only
(``B / (cycles / clock)``) and end to end (plus the command and response words
over the board's link and its fixed per-call host overhead). A part whose
on-chip memory cannot hold ``N`` leaves is refused, with the reason.

**Measured**, on this machine: ``tree.sample(B, rng, beta=0.4)`` of the C++
tree (``make_tree("native", N)``, fanout 16, random priorities; stratified
draws and IS weights, the same work the RMM's SAMPLE plus the host's weights
do), with one replay thread and with every core
(``hetero_replay.set_num_threads``); no torch. Every cell is timed in
interleaved repeats (round-robin over all cells of an N, timing.py) and the
median kept; samples/s = B / median seconds per call.

Results go to ``<out>/fpga-model.{json,md,png}``; the Markdown is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import report
from timing import Task, calibrate, run_interleaved

import hetero_replay
from hetero_replay.fpga import cycle_model as cm
from hetero_replay.trees import make_tree

CAPACITIES = (100_000, 1_000_000)
BATCHES = (32, 256, 4096)
FANOUT = 16
BETA = 0.4


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 repeats of >= 0.02 s (a smoke run)")
    p.add_argument("--repeats", type=int, default=15, help="interleaved repeats per cell (median kept)")
    p.add_argument("--min-time", type=float, default=0.1, help="seconds of back-to-back calls per repeat")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"), help="output folder")
    args = p.parse_args(argv)
    repeats, min_time = (3, 0.02) if args.quick else (args.repeats, args.min_time)
    results = run(CAPACITIES, BATCHES, repeats, min_time)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "fpga-model" + ("-quick" if args.quick else "")
    (out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    png = out / f"{name}.png"
    text = markdown(results, png if plot(results, png) else None)
    (out / f"{name}.md").write_text(text)
    print(text)
    return 0


def run(capacities: Sequence[int], batches: Sequence[int], repeats: int, min_time: float) -> dict[str, Any]:
    """Measure the C++ tree's sample at every (N, B, threads); predict every part's; a dict for JSON."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    thread_counts = sorted({1, cores})
    default_threads = hetero_replay.num_threads()
    started = os.getloadavg()
    measured = []
    rng = np.random.default_rng(0)
    try:
        for capacity in capacities:
            tree = make_tree("native", capacity, fanout=FANOUT)
            tree.load_leaves((rng.random(capacity) + 1e-3).astype(np.float32))  # priorities already ** alpha
            draws = np.random.default_rng(1)
            tasks = [
                Task(
                    {"capacity": capacity, "batch": batch, "threads": threads},
                    lambda b=batch, t=tree, r=draws: t.sample(b, r, BETA),
                    lambda t=threads: hetero_replay.set_num_threads(t),
                )
                for batch in batches
                for threads in thread_counts
            ]
            for task in tasks:
                calibrate(task, min_time)
            run_interleaved(tasks, repeats)
            for task in tasks:
                row = task.summary()
                row["samples_per_s"] = row["batch"] / row["median_s"]
                measured.append(row)
            print(f"N = {capacity:,}: measured", file=sys.stderr)
    finally:
        hetero_replay.set_num_threads(default_threads)
    return {
        "machine": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpu": report.cpu_model(),
            "cores": cores,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "hetero_replay": report.package_version("hetero-replay"),
            "git": report.git_revision(),
            "loadavg_start": started,
            "loadavg_end": os.getloadavg(),
        },
        "plan": {
            "capacities": list(capacities),
            "batches": list(batches),
            "threads": thread_counts,
            "fanout": FANOUT,
            "repeats": repeats,
            "min_time_s": min_time,
        },
        "model": {
            "parts": [_part(p) for p in cm.parts()],
            "latencies": _latencies(),
            "cells": predict(capacities, batches),
        },
        "measured": measured,
    }


def predict(capacities: Sequence[int], batches: Sequence[int]) -> list[dict[str, Any]]:
    """Every part's predicted SAMPLE rate per (N, B), or why the part refuses N."""
    cells = []
    for part in cm.parts():
        for capacity in capacities:
            for batch in batches:
                cell: dict[str, Any] = {"part": part.key, "capacity": capacity, "batch": batch}
                try:
                    t = cm.call_time(part, "sample", batch, capacity, FANOUT)
                except cm.FpgaCapacityError as e:
                    cell["refused"] = str(e)
                else:
                    cell.update(
                        cycles=t.cycles,
                        kernel_s=t.kernel_s,
                        link_s=t.link_s,
                        overhead_s=t.overhead_s,
                        kernel_samples_per_s=batch / t.kernel_s,
                        samples_per_s=batch / t.total_s,
                    )
                cells.append(cell)
    return cells


def _part(part: cm.Part) -> dict[str, Any]:
    return {
        "key": part.key,
        "label": part.label,
        "device": part.device,
        "bram36": part.bram36,
        "uram": part.uram,
        "clock_hz": part.clock_hz,
        "link": part.link,
        "link_bytes_per_s": part.link_bytes_per_s,
        "call_overhead_s": part.call_overhead_s,
        "max_leaves_k16": cm.max_leaves(part, FANOUT),
        "max_depth_k16": cm.part_max_depth(part, FANOUT),
        "note": part.note,
    }


def _latencies() -> dict[str, int]:
    names = ("HEADER_LATENCY", "READ_DRAW_LATENCY", "SCALE_LATENCY", "MEMORY_READ_LATENCY", "ENCODE_LATENCY",
             "WRITE_RESULT_LATENCY", "LEAF_WRITE_LATENCY", "REFRESH_WRITE_LATENCY", "GET_LATENCY", "CLEAR_LATENCY",
             "TRAILER_READ_LATENCY")  # fmt: skip
    return {name: getattr(cm, name) for name in names}


# -- report ------------------------------------------------------------------------------------------


def markdown(results: dict[str, Any], png: Path | None) -> str:
    """Per N: rows B; measured C++ tree (1 thread, all threads), each part's prediction, and the ratios."""
    m, plan, model = results["machine"], results["plan"], results["model"]
    measured = {(r["capacity"], r["batch"], r["threads"]): r["samples_per_s"] for r in results["measured"]}
    cells = {(c["part"], c["capacity"], c["batch"]): c for c in model["cells"]}
    parts = model["parts"]
    one, many = plan["threads"][0], plan["threads"][-1]
    out = [
        "# FPGA cycle model vs the measured C++ tree: samples/s",
        "",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores; 1-min load average {m['loadavg_start'][0]:.2f} → "
        f"{m['loadavg_end'][0]:.2f}",
        f"- **Run:** {m['date']}, git {m['git']}; Python {m['python']}, NumPy {m['numpy']}",
        f"- **Measured:** `make_tree('native', N, fanout={plan['fanout']}).sample(B, rng, beta={BETA})` (stratified "
        "draws, IS weights), random priorities, no torch; median of "
        f"{plan['repeats']} interleaved repeats of ≥ {plan['min_time_s']} s each; `1t` = one replay thread, "
        f"`{many}t` = every core.",
        "- **Predicted:** `hetero_replay.fpga.cycle_model`, back-to-back SAMPLE commands of B draws, fanout "
        f"{plan['fanout']}, a build sized to the part's largest tree; *kernel* = B / (cycles / clock), *end to end* "
        "adds the command and response words over the link and the per-call host overhead (estimates, "
        "below). Predicted only: no board was measured.",
        "",
    ]
    if png is not None:
        out += [f"![samples/s]({png.name})", ""]
    for capacity in plan["capacities"]:
        out += [f"## N = {capacity:,}", ""]
        head = ["B", f"C++ {one}t", f"C++ {many}t"]
        for p in parts:
            head += [f"{p['key']} kernel", f"{p['key']} end to end", f"÷ C++ {one}t", f"÷ C++ {many}t"]
        body = []
        for batch in plan["batches"]:
            ours_one, ours_many = measured.get((capacity, batch, one)), measured.get((capacity, batch, many))
            row = [str(batch), report.rate(ours_one), report.rate(ours_many)]
            for p in parts:
                c = cells[(p["key"], capacity, batch)]
                if "refused" in c:
                    row += ["refused", "refused", "–", "–"]
                    continue
                e2e = c["samples_per_s"]
                row += [
                    report.rate(c["kernel_samples_per_s"]),
                    report.rate(e2e),
                    report.ratio(e2e / ours_one if ours_one else None),
                    report.ratio(e2e / ours_many if ours_many else None),
                ]
            body.append(row)
        out += report.table(head, body) + [""]
        refused = {c["part"]: c["refused"] for c in model["cells"] if c["capacity"] == capacity and "refused" in c}
        out += [f"- refused, {key}: {why}" for key, why in refused.items()] + ([""] if refused else [])
    out += [
        "## The parts and the model's constants",
        "",
        "Ratios `÷` are the predicted end-to-end rate over the measured one (> 1: the FPGA predicted faster).",
        "",
    ]
    body = [
        [
            p["label"],
            f"{p['bram36']} / {p['uram']}",
            f"{p['max_leaves_k16']:,}",
            str(p["max_depth_k16"]),
            f"{p['link_bytes_per_s'] / 1e9:g} GB/s",
            f"{p['call_overhead_s'] * 1e6:g} µs",
            p["note"] or "–",
        ]
        for p in parts
    ]
    out += report.table(["part", "BRAM36 / URAM", "max leaves (K=16)", "MAX_DEPTH", "link", "per call", "note"], body)
    out += ["", "Links: " + "; ".join(sorted({p["link"] for p in parts})) + ".", ""]
    out += ["Latencies (cycles): " + ", ".join(f"{k} {v}" for k, v in model["latencies"].items()) + ".", ""]
    return "\n".join(out)


def plot(results: dict[str, Any], path: Path) -> bool:
    """samples/s against B (log-log), one panel per N; ``False`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    plan, model = results["plan"], results["model"]
    capacities, batches = plan["capacities"], plan["batches"]
    fig, axes = plt.subplots(1, len(capacities), figsize=(2 + 4.5 * len(capacities), 4.5), sharey=True, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, capacity in zip(axes[0], capacities):
        for i, threads in enumerate(plan["threads"]):
            points = [(r["batch"], r["samples_per_s"]) for r in results["measured"]
                      if r["capacity"] == capacity and r["threads"] == threads]  # fmt: skip
            ax.plot(*zip(*sorted(points)), color="black", lw=2.2, marker="o", ls=("-", "--")[i % 2],
                    label=f"C++ tree, {threads} thread{'s' if threads > 1 else ''} (measured)")  # fmt: skip
        for j, part in enumerate(model["parts"]):
            cells = [c for c in model["cells"]
                     if c["part"] == part["key"] and c["capacity"] == capacity and "refused" not in c]  # fmt: skip
            if not cells:
                ax.text(0.03, 0.93 - 0.06 * j, f"{part['key']}: refused (N > {part['max_leaves_k16']:,})",
                        transform=ax.transAxes, fontsize=7, color=colours[j + 1])  # fmt: skip
                continue
            # Parts with the same clock and link predict the same rates: the earlier ones drawn wider, so both show.
            colour, width = colours[j + 1], 1.2 + 2.4 * (len(model["parts"]) - 1 - j) / len(model["parts"])
            ax.plot([c["batch"] for c in cells], [c["samples_per_s"] for c in cells], color=colour, marker="s",
                    lw=width, ms=3 + 2 * width, label=f"{part['label']}: end to end (model)")  # fmt: skip
            ax.plot([c["batch"] for c in cells], [c["kernel_samples_per_s"] for c in cells], color=colour, ls=":",
                    lw=width, label=f"{part['label']}: kernel only (model)")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_title(f"N = {capacity:,}")
        ax.set_xlabel("batch size B")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("samples/s")
    handles: dict[str, Any] = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    labels = list(handles)
    fig.legend([handles[label] for label in labels], labels, loc="lower center", fontsize=7, ncol=2)
    m = results["machine"]
    fig.suptitle(f"FPGA cycle model (predicted) vs C++ tree measured on {m['cpu']}, {m['date'][:10]}", fontsize=9)
    fig.tight_layout(rect=(0, 0.05 + 0.025 * len(labels) / 2, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


if __name__ == "__main__":
    sys.exit(main())
