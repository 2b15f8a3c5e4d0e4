"""Turn raw benchmark results into ``replay-<name>.json``, ``.md`` and ``.png``.

The JSON keeps every repeat of every measurement plus a per-(N, B) summary;
the Markdown puts the learner-step table first (one per N: rows B, columns
contenders, then the speed-up of each of ours over the best anchor), followed
by the detail tables; the plot shows learner steps/s against B, one panel per N.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The issue's targets: ours single-threaded vs the best anchor in every cell,
#: ours on all cores vs the best anchor from B = 1024, PER sample vs SB3 uniform from B = 256.
TARGET_SINGLE = 3.0
TARGET_MULTI = 5.0
MULTI_FROM_B = 1024
UNIFORM_FROM_B = 256

Results = dict[str, Any]


def write(results: Results, out_dir: Path, name: str) -> dict[str, Path]:
    """Write the three files; return their paths (no ``png`` when matplotlib is missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {**results, "summary": summarize(results)}
    paths = {ext: out_dir / f"replay-{name}.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(results, indent=1) + "\n")
    if not plot(results, paths["png"]):
        del paths["png"]
    paths["md"].write_text(markdown(results, name, paths.get("png")))
    return paths


# -- summary ------------------------------------------------------------------------


def summarize(results: Results) -> list[dict[str, Any]]:
    """Per (N, B): learner steps/s and sample throughput per contender, and the ratios."""
    median = {(r["capacity"], r["op"], r["size"], r["label"]): r["median_s"] for r in results["results"]}
    contenders = results["contenders"]
    cells = []
    for capacity in results["plan"]["capacities"]:
        for batch in results["plan"]["batches"]:
            # a uniform buffer's learner step is its sample: nothing to update
            step = {
                label: median[key]
                for label, d in contenders.items()
                if (key := (capacity, "step" if d["prioritized"] else "sample", batch, label)) in median
            }
            sample = {
                label: batch / median[(capacity, "sample", batch, label)]
                for label in contenders
                if (capacity, "sample", batch, label) in median
            }
            anchors = {label: s for label, s in step.items() if contenders[label]["role"] == "anchor"}
            ours = [label for label in step if contenders[label]["role"] == "ours"]
            uniform = next((label for label in sample if contenders[label]["role"] == "uniform"), None)
            best = min(anchors, key=anchors.__getitem__) if anchors else None
            cells.append(
                {
                    "capacity": capacity,
                    "batch": batch,
                    "steps_per_s": {label: 1 / s for label, s in step.items()},
                    "sample_transitions_per_s": sample,
                    "best_anchor": best,
                    "speedup_vs_best_anchor": {o: anchors[best] / step[o] for o in ours} if best else {},
                    "speedup_vs_anchor": {o: {a: anchors[a] / step[o] for a in anchors} for o in ours},
                    "uniform": uniform,
                    "sample_vs_uniform": {o: sample[o] / sample[uniform] for o in ours} if uniform else {},
                }
            )
    return cells


# -- Markdown -----------------------------------------------------------------------


def markdown(results: Results, name: str, png: Path | None) -> str:
    """The readable report: headline tables first, details after."""
    cells = results.get("summary") or summarize(results)
    contenders = results["contenders"]
    labels = list(contenders)
    ours = [label for label in labels if contenders[label]["role"] == "ours"]
    anchors = [label for label in labels if contenders[label]["role"] == "anchor"]
    out = [f"# Replay benchmark: {name}", "", *_header(results), ""]

    out += [
        "## Learner steps/s",
        "",
        "One learner step = sample B (data gather + IS weights) + update B priorities; higher is better. "
        "`× best` = our steps/s over the best PER anchor's in the same run. "
        "sb3-uniform has no priorities: its step is its sample alone.",
        "",
    ]
    if png is not None:
        out += [f"![learner steps/s]({png.name})", ""]
    for capacity, rows in _by_capacity(cells):
        out += [f"### N = {capacity:,}", ""]
        head = ["B", *labels, "best anchor", *(f"{o} × best" for o in ours)]
        body = [
            [
                str(c["batch"]),
                *(rate(c["steps_per_s"].get(label)) for label in labels),
                c["best_anchor"] or "–",
                *(ratio(c["speedup_vs_best_anchor"].get(o)) for o in ours),
            ]
            for c in rows
        ]
        out += table(head, body) + [""]

    out += [
        "## Targets",
        "",
        f"Single thread ≥ {TARGET_SINGLE:g}× the best anchor in every cell; all cores ≥ {TARGET_MULTI:g}× "
        f"from B = {MULTI_FROM_B}; PER sample throughput ≥ SB3 uniform from B = {UNIFORM_FROM_B}.",
        "",
    ]
    out += _targets(cells, contenders) + [""]

    out += ["## Speed-up over each anchor (learner step)", ""]
    for capacity, rows in _by_capacity(cells):
        pairs = [(o, a) for o in ours for a in anchors]
        out += [f"### N = {capacity:,}", ""]
        head = ["B", *(f"{o} ÷ {a}" for o, a in pairs)]
        body = [[str(c["batch"]), *(ratio(c["speedup_vs_anchor"].get(o, {}).get(a)) for o, a in pairs)] for c in rows]
        out += table(head, body) + [""]

    out += [
        "## Sample throughput (transitions/s)",
        "",
        "sample B, data gather and IS weights included; `÷ uniform` = ours over SB3's uniform sample.",
        "",
    ]
    for capacity, rows in _by_capacity(cells):
        out += [f"### N = {capacity:,}", ""]
        head = ["B", *labels, *(f"{o} ÷ uniform" for o in ours)]
        body = [
            [
                str(c["batch"]),
                *(rate(c["sample_transitions_per_s"].get(label)) for label in labels),
                *(ratio(c["sample_vs_uniform"].get(o)) for o in ours),
            ]
            for c in rows
        ]
        out += table(head, body) + [""]

    out += ["## Median time per call (µs)", ""] + _op_times(results, labels) + [""]
    out += ["## Insert (transitions/s)", ""] + _inserts(results, labels) + [""]
    profile = _profile(results)
    if profile:
        out += (
            [
                "## Profile of our learner step (µs, share of the step)",
                "",
                "The parts timed on their own, interleaved with the rest; glue = step − parts "
                "(argument checks, Python calls, result objects).",
                "",
            ]
            + profile
            + [""]
        )
    out += ["## Contenders", ""] + _contenders(results) + [""]
    return "\n".join(out)


def _header(results: Results) -> list[str]:
    m, plan, w, meth = results["machine"], results["plan"], results["workload"], results["method"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    load = f"{m['loadavg_start'][0]:.2f} → {m['loadavg_end'][0]:.2f}" if "loadavg_end" in m else "n/a"
    threads = {k: v for k, v in m["thread_env"].items() if v is not None}
    return [
        f"- **Machine:** {m['cpu']}, {m['cores']} cores, caches {m['caches'] or 'unknown'}, "
        f"{m['memory_gib']} GiB; {m['os']}; 1-min load average {load}",
        f"- **Run:** {m['date']}, git {m['git']}; Python {m['python']}; {versions}",
        f"- **Threads:** torch {meth['torch_threads']}; hetero-replay's thread pool defaults to "
        f"{m['replay_threads_default']}, each of ours pinned to the thread count in "
        f"its label; environment {threads or 'unset'}",
        f"- **Workload:** N filled transitions (obs float32 (8,), action int64, reward float32, "
        f"next_obs float32 (8,), done float32); alpha {w['alpha']}, beta {w['beta']}, eps {w['eps']}; "
        f"N ∈ {{{', '.join(f'{n:,}' for n in plan['capacities'])}}}, "
        f"B ∈ {{{', '.join(map(str, plan['batches']))}}}",
        f"- **Method:** median of {plan['repeats']} interleaved repeats (round-robin over every "
        f"contender and operation of a cell), each ≥ {plan['min_time']} s of back-to-back calls after "
        f"{meth['warmup_calls']} warm-up calls; {meth['gc']}",
    ] + (
        ["- **Unavailable:** " + "; ".join(f"{k} ({v})" for k, v in results["unavailable"].items())]
        if results["unavailable"]
        else []
    )


def _targets(cells: list[dict[str, Any]], contenders: dict[str, Any]) -> list[str]:
    single = [label for label, d in contenders.items() if d["role"] == "ours" and d["threads"] == 1]
    multi = [label for label, d in contenders.items() if d["role"] == "ours" and (d["threads"] or 0) > 1]
    head = [
        "N",
        "B",
        *(f"{s} × best" for s in single),
        *(f"{m} × best" for m in multi),
        *(f"{o} sample ÷ uniform" for o in single + multi),
    ]
    body, short = [], 0
    for c in cells:
        row = [f"{c['capacity']:,}", str(c["batch"])]
        checks = [(s, c["speedup_vs_best_anchor"].get(s), TARGET_SINGLE) for s in single]
        checks += [
            (m, c["speedup_vs_best_anchor"].get(m), TARGET_MULTI if c["batch"] >= MULTI_FROM_B else None) for m in multi
        ]
        checks += [
            (o, c["sample_vs_uniform"].get(o), 1.0 if c["batch"] >= UNIFORM_FROM_B else None) for o in single + multi
        ]
        for _, value, target in checks:
            mark = "" if target is None or value is None else (" ✓" if value >= target else " ✗")
            short += mark == " ✗"
            row.append(ratio(value) + mark)
        body.append(row)
    return table(head, body) + ["", f"Checks short of their target: {short}."]


def _op_times(results: Results, labels: list[str]) -> list[str]:
    rows: dict[tuple[int, str, int], dict[str, float]] = {}
    for r in results["results"]:
        if r["op"] in ("sample", "update", "step"):
            rows.setdefault((r["capacity"], r["op"], r["size"]), {})[r["label"]] = r["median_s"]
    order = {"sample": 0, "update": 1, "step": 2}
    keys = sorted(rows, key=lambda k: (k[0], k[2], order[k[1]]))
    body = [[f"{n:,}", str(b), op, *(_us(rows[(n, op, b)].get(label)) for label in labels)] for n, op, b in keys]
    return table(["N", "B", "op", *labels], body)


def _inserts(results: Results, labels: list[str]) -> list[str]:
    rows: dict[tuple[int, int], dict[str, float]] = {}
    for r in results["results"]:
        if r["op"] == "insert":
            rows.setdefault((r["capacity"], r["size"]), {})[r["label"]] = r["size"] / r["median_s"]
    body = [[f"{n:,}", str(k), *(rate(rows[(n, k)].get(label)) for label in labels)] for n, k in sorted(rows)]
    fills: dict[int, dict[str, float]] = {}
    for f in results["fills"]:
        fills.setdefault(f["capacity"], {})[f["label"]] = f["seconds"]
    body += [
        [f"{n:,}", "fill (s, untimed setup)", *(_seconds(fills[n].get(label)) for label in labels)]
        for n in sorted(fills)
    ]
    return table(["N", "chunk", *labels], body)


def _profile(results: Results) -> list[str]:
    parts: dict[tuple[str, int, int], dict[str, float]] = {}
    steps: dict[tuple[str, int, int], float] = {}
    for r in results["results"]:
        key = (r["label"], r["capacity"], r["size"])
        if r["op"].startswith("profile:"):
            parts.setdefault(key, {})[r["op"].removeprefix("profile:")] = r["median_s"]
        elif r["op"] == "step":
            steps[key] = r["median_s"]
    if not parts:
        return []
    names = list(next(iter(parts.values())))
    body = []
    for key in sorted(parts):
        step, p = steps[key], parts[key]
        glue = step - sum(p.values())
        body.append(
            [
                key[0],
                f"{key[1]:,}",
                str(key[2]),
                _us(step),
                *(f"{_us(p[n])} ({p[n] / step:.0%})" for n in names),
                f"{_us(glue)} ({glue / step:.0%})",
            ]
        )
    return table(["contender", "N", "B", "step", *names, "glue"], body)


def _contenders(results: Results) -> list[str]:
    body = [
        [label, f"{d['library']} {d['version'] or ''}".strip(), d["role"], d["setup"]]
        for label, d in results["contenders"].items()
    ]
    body += [[name, name, "unavailable", reason] for name, reason in results["unavailable"].items()]
    return table(["label", "library", "role", "setup"], body)


def _by_capacity(cells: list[dict[str, Any]]) -> Iterable[tuple[int, list[dict[str, Any]]]]:
    for capacity in dict.fromkeys(c["capacity"] for c in cells):
        yield capacity, [c for c in cells if c["capacity"] == capacity]


def table(head: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def rate(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _us(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e6:,.1f}"


def _seconds(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds:.2f}"


# -- plot ---------------------------------------------------------------------------


def plot(results: Results, path: Path) -> bool:
    """Learner steps/s against B (log-log), one panel per N; ``False`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cells = results["summary"]
    capacities = list(dict.fromkeys(c["capacity"] for c in cells))
    batches = results["plan"]["batches"]
    fig, axes = plt.subplots(1, len(capacities), figsize=(2 + 4.5 * len(capacities), 4.5), sharey=True, squeeze=False)
    styles = {
        "ours": dict(lw=2.2, marker="o"),
        "anchor": dict(lw=1.2, marker="s"),
        "uniform": dict(lw=1.2, ls="--", marker="^"),
    }
    for ax, capacity in zip(axes[0], capacities):
        rows = [c for c in cells if c["capacity"] == capacity]
        for label, d in results["contenders"].items():
            points = [(c["batch"], c["steps_per_s"][label]) for c in rows if label in c["steps_per_s"]]
            if points:
                ax.plot(*zip(*points), label=label, **styles[d["role"]])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_title(f"N = {capacity:,}")
        ax.set_xlabel("batch size B")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("learner steps/s (sample + update)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    m = results["machine"]
    fig.suptitle(f"{m['cpu']}, {m['cores']} cores, torch 1 thread, {m['date'][:10]}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1 - 1.6 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# -- where a result came from (every benchmark script records these) --------------------------------


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what :mod:`platform` reports."""
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    """Total RAM in GiB (Linux ``/proc/meminfo``), or ``None``."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().split()
        return round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1)
    return None


def package_version(package: str) -> str | None:
    """The installed version of ``package``, or ``None``."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_revision() -> str | None:
    """``HEAD``'s short hash, with a mark when the core (csrc/, hetero_replay/) has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "csrc", "hetero_replay"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("+uncommitted core changes" if dirty else "")
