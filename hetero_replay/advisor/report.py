"""Show the advisor's ranking: a terminal table, a JSON file, and PNG figures.

The ranking is a list of rows, best first, one per candidate placement (see
:class:`RankedRow`). This module only renders what it is given: the order of
the rows is their rank, and it never re-ranks them.

* :func:`format_table`: the ranking as aligned text for a 120-column terminal,
  with a speed-up column relative to the row tagged ``"baseline"`` and, for
  validated rows, the measured throughput and the prediction's error.
* :func:`to_json` / :func:`write_json`: the same as plain JSON (``None`` where a
  number is missing or not finite, never ``NaN``).
* :func:`plot`: two panels, predicted vs measured env steps/s, and the time per
  env step each primitive takes.
* :func:`mape`, :func:`mape_by_config`, :func:`format_validation`,
  :func:`plot_validation`: how far the predictions are from measured
  end-to-end runs, over many configurations at once.

Errors are relative to the measurement: ``(predicted - measured) / measured``;
the mean absolute percentage error (MAPE) is the mean of its absolute value,
returned as a fraction (``0.08`` is 8 %).

Plots need matplotlib (the ``sb3`` extra); it is imported only
when a plot is drawn, and drawn on a bare Agg canvas, so pyplot's global state
(backend, open figures) is left alone.
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hetero_replay.advisor.model import PARTS  # the parts of an env step's time, in display order
from hetero_replay.registry import install_hint
from hetero_replay.storage.files import replace_file

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from hetero_replay.advisor.workload import Candidate

#: Bumped when the JSON layout changes.
FORMAT = 1
#: Tags a row may carry; the table and the figure highlight them.
TAGS = ("best", "baseline", "default")
#: Table width the columns are fitted to.
WIDTH = 120
#: The narrowest the table's label column gets while abbreviations still make labels fit.
MIN_LABEL = 50
#: Relative distance from the best prediction within which placements count as "as good" (summary).
NEAR_BEST = 0.05
#: Half-width of the band around y = x in :func:`plot_validation`, and the MAPE target.
TARGET = 0.15

# Colours of the highlighted rows (matplotlib's tab10 family, readable in grey print too).
_TAG_COLOURS = {"best": "#2ca02c", "baseline": "#7f7f7f", "default": "#1f77b4"}
_OTHER_COLOUR = "#aec7e8"
# Shortenings tried in turn on a label that is too wide; the table prints their meaning.
_ABBREVIATIONS = (("relaxed k=", "k="), ("learner ", "L:"), ("tree ", "T:"))
_ABBREVIATION_LEGEND = "labels shortened: T: tree device, L: learner, k=: staleness"


class RankedRow(Protocol):
    """One ranked placement, as the advisor's model produces it (any object with these attributes).

    Attributes:
        candidate: the placement (its ``label`` names the row).
        predicted: predicted env steps per second.
        learner_steps: predicted gradient steps per second.
        breakdown: seconds per environment step spent in each part (keys among
            :data:`PARTS`; a missing key is 0).
        measured: env steps per second measured by validation, or ``None``.
        measured_spread: ``(low, high)`` of the measured runs, or ``None``.
        predicted_only: the replay times come from an analytical model, not a measurement.
        tags: a subset of :data:`TAGS`.
    """

    @property
    def candidate(self) -> Candidate: ...
    @property
    def predicted(self) -> float: ...
    @property
    def learner_steps(self) -> float: ...
    @property
    def breakdown(self) -> Mapping[str, float]: ...
    @property
    def measured(self) -> float | None: ...
    @property
    def measured_spread(self) -> tuple[float, float] | None: ...
    @property
    def predicted_only(self) -> bool: ...
    @property
    def tags(self) -> Iterable[str]: ...


#: A validation point: ``(configuration title, placement label, predicted, measured)`` env steps/s.
Point = tuple[str, str, float, float]


# ---------------------------------------------------------------------------------------------- numbers


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def format_rate(x: float | None) -> str:
    """A rate (steps/s) with thousands separators, about three significant figures below 1,000; ``-`` if missing."""
    if x is None or not math.isfinite(x):
        return "-"
    magnitude = abs(x)
    if magnitude >= 100:
        return f"{x:,.0f}"
    if magnitude >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _percent(fraction: float | None, signed: bool = False) -> str:
    if fraction is None or not math.isfinite(fraction):
        return "-"
    return f"{100 * fraction:+.1f}%" if signed else f"{100 * fraction:.1f}%"


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or not math.isfinite(numerator) or not math.isfinite(denominator):
        return None
    return numerator / denominator if denominator > 0 else None


def error(row: RankedRow) -> float | None:
    """The prediction's relative error ``(predicted - measured) / measured``; ``None`` if not validated."""
    measured = row.measured
    if measured is None or not math.isfinite(measured) or measured <= 0:
        return None
    return _ratio(row.predicted - measured, measured)


# ---------------------------------------------------------------------------------------------- rows


def _check_rows(rows: Sequence[RankedRow]) -> list[RankedRow]:
    rows = list(rows)
    if not rows:
        raise ValueError("rows must not be empty: there is no placement to report")
    baselines = [r.candidate.label for r in rows if "baseline" in r.tags]
    if len(baselines) > 1:
        raise ValueError(f"rows: at most one row may be tagged 'baseline', got {len(baselines)}: {baselines}")
    return rows


def _tagged(rows: Sequence[RankedRow], tag: str) -> RankedRow | None:
    return next((r for r in rows if tag in r.tags), None)


def speedups(rows: Sequence[RankedRow]) -> list[float | None]:
    """Each row's predicted throughput over the ``"baseline"`` row's (``None`` for all when there is none)."""
    baseline = _tagged(_check_rows(rows), "baseline")
    return [_ratio(r.predicted, baseline.predicted) if baseline else None for r in rows]


def summarize(rows: Sequence[RankedRow], near_best: float = NEAR_BEST) -> dict[str, Any]:
    """The summary the table, JSON and figure show when the caller gives none.

    Returns:
        ``best``, ``baseline``, ``default``: labels (``best`` is the row tagged
        so, else the highest prediction; the others ``None`` if no row is
        tagged); ``speedup_vs_baseline`` and ``speedup_vs_default``: the best
        prediction over theirs; ``within_5%_of_best``: the other placements
        predicted within ``near_best`` of the best; ``validated``: rows with a
        measurement; ``mape``: their mean absolute percentage error (a fraction).
    """
    rows = _check_rows(rows)
    finite = [r for r in rows if _finite(r.predicted)]
    best = _tagged(rows, "best") or (max(finite, key=lambda r: r.predicted) if finite else rows[0])
    baseline, default = _tagged(rows, "baseline"), _tagged(rows, "default")
    near = [
        r.candidate.label
        for r in finite
        if r is not best and _finite(best.predicted) and r.predicted >= (1 - near_best) * best.predicted
    ]
    errors = [e for e in (error(r) for r in rows) if e is not None]
    return {
        "best": best.candidate.label,
        "baseline": baseline.candidate.label if baseline else None,
        "default": default.candidate.label if default else None,
        "speedup_vs_baseline": _ratio(best.predicted, baseline.predicted) if baseline else None,
        "speedup_vs_default": _ratio(best.predicted, default.predicted) if default else None,
        f"within_{100 * near_best:g}%_of_best": near,
        "validated": len(errors),
        "mape": sum(abs(e) for e in errors) / len(errors) if errors else None,
    }


# ---------------------------------------------------------------------------------------------- table


def shorten_labels(labels: Sequence[str], width: int, cut: bool = True) -> list[str]:
    """``labels`` fitted into ``width`` characters: abbreviations first, then an ellipsis in the middle.

    The abbreviations (:data:`_ABBREVIATIONS`) keep every field of a
    candidate's label readable, and the same ones are applied to every label
    so that a column reads alike; cutting (unless ``cut`` is false) is the last resort.
    """
    if width < 5:
        raise ValueError(f"width must be at least 5, got {width}")
    labels = list(labels)
    for long, short in _ABBREVIATIONS:
        if all(len(label) <= width for label in labels):
            return labels
        labels = [label.replace(long, short) for label in labels]
    if not cut:
        return labels
    head = (width - 3) // 2
    return [label if len(label) <= width else f"{label[:head]}...{label[len(label) - (width - 3 - head) :]}"
            for label in labels]  # fmt: skip


def _notes(row: RankedRow) -> str:
    ordered = [t for t in TAGS if t in row.tags] + sorted(set(row.tags) - set(TAGS))
    return ", ".join(ordered + (["predicted only"] if row.predicted_only else []))


def _summary_value(key: str, value: Any) -> str:
    """One summary value as text: speed-ups as ``2.31x``, MAPE and errors as percentages, lists joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if key.startswith("speedup"):
            return f"{value:.2f}x" if math.isfinite(value) else "-"
        if "mape" in key or "error" in key:
            return _percent(value)
        return format_rate(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_summary_value(str(k), v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(_summary_value(key, v) for v in value) or "none"
    return str(value)


def format_summary(summary: Mapping[str, Any]) -> list[str]:
    """The summary as ``"key: value"`` lines, keys' underscores read as spaces (see :func:`summarize`)."""
    return [f"{key.replace('_', ' ')}: {_summary_value(key, value)}" for key, value in summary.items()]


def format_table(
    rows: Sequence[RankedRow], title: str, summary: Mapping[str, Any] | None = None, width: int = WIDTH
) -> str:
    """The ranking as an aligned text table, then the summary lines.

    Columns: rank (the rows' order), placement label (shortened to fit
    ``width``), predicted env steps/s, predicted learner (gradient) steps/s,
    speed-up over the row tagged ``"baseline"``, and, when any row was
    validated, the measured env steps/s and the prediction's signed error;
    last the notes: the row's tags and ``"predicted only"`` for rows whose
    replay times come from an analytical model.

    Args:
        rows: the ranked rows, best first.
        title: printed above the table.
        summary: printed below it (:func:`format_summary`); :func:`summarize` of the rows when ``None``.
        width: the width, in characters, the label column is shortened to fit.

    Raises:
        ValueError: no rows, or more than one row tagged ``"baseline"``.
    """
    rows = _check_rows(rows)
    summary = summarize(rows) if summary is None else summary
    ups = speedups(rows)
    validated = any(r.measured is not None for r in rows)
    header = ["#", "placement", "env steps/s", "learner/s", "speed-up"]
    right = [True, False, True, True, True]  # numbers align right
    if validated:
        header += ["measured", "error"]
        right += [True, True]
    header.append("notes")
    right.append(False)
    cells: list[list[str]] = []
    for rank, (row, up) in enumerate(zip(rows, ups), start=1):
        line = [str(rank), row.candidate.label, format_rate(row.predicted), format_rate(row.learner_steps)]
        line.append(f"{up:.2f}x" if up is not None else "-")
        if validated:
            line += [format_rate(row.measured), _percent(error(row), signed=True)]
        line.append(_notes(row))
        cells.append(line)
    widths = [max(len(header[i]), *(len(c[i]) for c in cells)) for i in range(len(header))]
    gap = "  "
    # The label column gets what the other columns leave, but never less than the labels need with
    # their fields abbreviated (up to MIN_LABEL): long notes may then run past ``width``, labels stay whole.
    abbreviated = shorten_labels([c[1] for c in cells], MIN_LABEL, cut=False)
    floor = min(MIN_LABEL, max(len(label) for label in abbreviated))
    room = max(floor, width - (sum(widths) - widths[1]) - len(gap) * (len(header) - 1))
    shortened = False
    if widths[1] > room:
        for c, short in zip(cells, shorten_labels([c[1] for c in cells], room)):
            shortened |= short != c[1]
            c[1] = short
        widths[1] = max(len(header[1]), *(len(c[1]) for c in cells))

    def render(line: list[str]) -> str:
        parts = [s.rjust(w) if r else s.ljust(w) for s, w, r in zip(line, widths, right)]
        return gap.join(parts).rstrip()

    out = [title, "", render(header), render(["-" * w for w in widths])]
    out += [render(c) for c in cells]
    notes = []
    if not _tagged(rows, "baseline"):
        notes.append("speed-up: no row is tagged 'baseline'")
    if any(r.predicted_only for r in rows):
        notes.append("predicted only: replay times from an analytical model of a device not here; never chosen as best")
    if shortened:
        notes.append(_ABBREVIATION_LEGEND)
    if validated:
        notes.append("error: (predicted - measured) / measured")
    out += [""] + notes if notes else []
    lines = format_summary(summary)
    out += [""] + lines if lines else []
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- JSON


def _clean(value: Any) -> Any:
    """``value`` as plain JSON: non-finite floats become ``None``, sets sorted lists, objects their ``to_dict()``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return [_clean(v) for v in sorted(value, key=str)]
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "to_dict"):
        return _clean(value.to_dict())
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _clean(value.tolist())
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"cannot write a {type(value).__name__} to the report's JSON: {value!r}")


def _parts(rows: Sequence[RankedRow]) -> list[str]:
    """The breakdown keys in display order: :data:`PARTS` that appear, then the others sorted."""
    present = {k for r in rows for k in r.breakdown}
    return [p for p in PARTS if p in present] + sorted(present - set(PARTS))


def to_json(
    rows: Sequence[RankedRow],
    title: str,
    summary: Mapping[str, Any] | None = None,
    profile_dict: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ranking as a JSON-serialisable dict (no ``NaN``: missing numbers are ``None``).

    Layout: ``{"format", "title", "summary", "parts", "rows", "profile"}``;
    each row has ``rank``, ``label``, ``candidate`` (``Candidate.to_dict()``),
    ``predicted_env_steps_per_s``, ``learner_steps_per_s``,
    ``speedup_vs_baseline``, ``breakdown_s_per_env_step`` (every part in
    ``parts``), ``measured_env_steps_per_s``, ``measured_spread`` (``[low,
    high]``), ``error`` (a signed fraction), ``predicted_only`` and ``tags``.

    Args:
        rows: the ranked rows, best first.
        title: the ranking's title.
        summary: :func:`summarize` of the rows when ``None``.
        profile_dict: the profile the predictions came from (``Profile.to_dict()``), kept as given.

    Raises:
        ValueError: no rows, or more than one row tagged ``"baseline"``.
    """
    rows = _check_rows(rows)
    summary = summarize(rows) if summary is None else summary
    parts = _parts(rows)
    out_rows = []
    for rank, (row, up) in enumerate(zip(rows, speedups(rows)), start=1):
        spread = row.measured_spread
        out_rows.append({
            "rank": rank,
            "label": row.candidate.label,
            "candidate": row.candidate.to_dict(),
            "predicted_env_steps_per_s": row.predicted,
            "learner_steps_per_s": row.learner_steps,
            "speedup_vs_baseline": up,
            "breakdown_s_per_env_step": {p: float(row.breakdown.get(p, 0.0)) for p in parts},
            "measured_env_steps_per_s": row.measured,
            "measured_spread": list(spread) if spread is not None else None,
            "error": error(row),
            "predicted_only": bool(row.predicted_only),
            "tags": sorted(row.tags),
        })  # fmt: skip
    return _clean({
        "format": FORMAT, "title": title, "summary": summary, "parts": parts, "rows": out_rows,
        "profile": profile_dict,
    })  # fmt: skip


def write_json(
    path: str | os.PathLike[str],
    rows: Sequence[RankedRow],
    title: str,
    summary: Mapping[str, Any] | None = None,
    profile_dict: Mapping[str, Any] | None = None,
) -> pathlib.Path:
    """Write :func:`to_json` to ``path`` (its folder created if needed); returns the path.

    Written as :func:`~hetero_replay.storage.files.replace_file` writes: never through a link
    planted at the name; a folder another user could change is refused (``ValueError``).
    """
    data = to_json(rows, title, summary, profile_dict)
    # allow_nan=False: a NaN that slipped through is a bug here, not a file other tools cannot read
    return replace_file(path, (json.dumps(data, indent=1, allow_nan=False) + "\n").encode(), "out")


# ---------------------------------------------------------------------------------------------- figures


def _figure(width: float, height: float) -> Figure:
    """A matplotlib figure on an Agg canvas (pyplot untouched), or an ImportError naming the extra."""
    try:
        import matplotlib  # noqa: F401  (imported first: a clear error if it is missing)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"the advisor's plots need matplotlib: {install_hint('sb3')} ({e})") from e
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # files only: no display, no pyplot state
    return fig


def _save(fig: Figure, path: str | os.PathLike[str]) -> pathlib.Path:
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    return replace_file(path, png.getvalue(), "out")


def _colour(row: RankedRow) -> str:
    return next((_TAG_COLOURS[t] for t in TAGS if t in row.tags), _OTHER_COLOUR)


def _throughput_panel(ax: Axes, rows: Sequence[RankedRow], ups: Sequence[float | None]) -> list[Any]:
    """Panel (a): predicted env steps/s as bars, measured ones as markers with their spread; returns legend handles."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    y = list(range(len(rows)))
    predicted = [r.predicted if _finite(r.predicted) else 0.0 for r in rows]
    bars = ax.barh(y, predicted, color=[_colour(r) for r in rows], edgecolor="#333333", linewidth=0.5)
    for patch, row in zip(bars, rows):
        if row.predicted_only:
            patch.set_hatch("///")
    ends = list(predicted)  # where each row's value label starts: after its bar and its measurement
    # (rank index, measured, error bar below, error bar above) of the validated rows
    measured: list[tuple[int, float, float, float]] = []
    for i, row in enumerate(rows):
        x, spread = row.measured, row.measured_spread
        if x is not None and math.isfinite(x):
            low, high = (min(spread), max(spread)) if spread is not None else (x, x)
            measured.append((i, x, max(0.0, x - low), max(0.0, high - x)))
            ends[i] = max(ends[i], high)
    if measured:
        ax.errorbar([m[1] for m in measured], [m[0] for m in measured], xerr=[[m[2] for m in measured],
                    [m[3] for m in measured]], fmt="D", color="black", markersize=4, capsize=3, linewidth=1,
                    zorder=3)  # fmt: skip
    for i, (row, up) in enumerate(zip(rows, ups)):
        text = format_rate(row.predicted) + (f" ({up:.2f}x)" if up is not None else "")
        ax.text(ends[i], i, f"  {text}", va="center", fontsize=7)
    ax.set_xlim(0, (max(ends) or 1.0) * 1.3)  # room for the value labels
    ax.xaxis.set_major_formatter("{x:,.0f}")
    ax.set_xlabel("environment steps / s")
    ax.set_title("(a) predicted (bars) vs measured (markers) throughput", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    handles: list[Any] = [
        Patch(facecolor=_TAG_COLOURS[t], edgecolor="#333333", label=t) for t in TAGS if _tagged(rows, t)
    ]
    handles.append(Patch(facecolor=_OTHER_COLOUR, edgecolor="#333333", label="other placement"))
    if any(r.predicted_only for r in rows):
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch="///", label="predicted only"))
    if measured:
        handles.append(Line2D([], [], marker="D", color="black", linestyle="", markersize=4, label="measured"))
    return handles


def _breakdown_panel(ax: Axes, rows: Sequence[RankedRow]) -> list[Any]:
    """Panel (b): microseconds per env step per part, stacked (negative parts, e.g. overlap, to the left).

    Returns the parts' legend handles.
    """
    handles: list[Any] = []  # bar containers, which legend() takes as handles
    y = list(range(len(rows)))
    right = [0.0] * len(rows)
    left = [0.0] * len(rows)
    parts = _parts(rows)
    colours = [f"C{i % 10}" for i in range(len(parts))]
    for part, colour in zip(parts, colours):
        us = [1e6 * float(r.breakdown.get(part, 0.0)) for r in rows]
        us = [u if math.isfinite(u) else 0.0 for u in us]
        starts = [right[i] if u >= 0 else left[i] for i, u in enumerate(us)]
        handles.append(ax.barh(y, us, left=starts, color=colour, label=part, edgecolor="white", linewidth=0.3))
        for i, u in enumerate(us):
            if u >= 0:
                right[i] += u
            else:
                left[i] += u
    for i in y:
        total = right[i] + left[i]
        if right[i] > 0 or left[i] < 0:
            ax.text(max(right[i], 0.0), i, f"  {total:,.1f} µs", va="center", fontsize=7)
    ax.set_xlim(min(0.0, *left) * 1.1, (max(right) or 1.0) * 1.25)
    if min(left) < 0:
        ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel("µs per environment step")
    ax.set_title("(b) time per environment step, by part", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    if not parts:
        ax.text(0.5, 0.5, "no breakdown", transform=ax.transAxes, ha="center", va="center")
    return handles


def plot(
    rows: Sequence[RankedRow], title: str, path: str | os.PathLike[str], summary: Mapping[str, Any] | None = None
) -> pathlib.Path:
    """Draw the ranking as a PNG at ``path``; returns the path.

    Left, (a): predicted env steps/s as horizontal bars (hatched where
    predicted only; best, baseline and default coloured) with the speed-up
    over the baseline, and the measured env steps/s with their spread where
    validated. Right, (b): the time per env step each part takes, stacked.
    Rows keep their rank order, top to bottom; the figure grows with the rows.

    Args:
        rows: the ranked rows, best first.
        title: the figure's title.
        path: the PNG file (its folder created if needed).
        summary: shown under the panels (:func:`format_summary`); nothing when ``None``.

    Raises:
        ValueError: no rows, or more than one row tagged ``"baseline"``.
        ImportError: matplotlib is not installed.
    """
    rows = _check_rows(rows)
    ups = speedups(rows)
    lines = format_summary(summary) if summary else []
    panels_in = max(2.0, 0.3 * len(rows) + 1.2)  # ~0.3 inch a row keeps 8-point labels apart
    legend_columns = 6
    # The footer holds the summary (left) and one legend for both panels (right), outside the panels.
    n_handles = (2 + len(TAGS)) + len(_parts(rows))  # an upper bound on the legend's entries
    footer_in = 0.2 + 0.16 * max(len(lines), math.ceil(n_handles / legend_columns))
    fig = _figure(16, panels_in + footer_in + 0.6)
    grid = fig.add_gridspec(2, 2, height_ratios=[panels_in, footer_in])
    ax_a = fig.add_subplot(grid[0, 0])
    ax_b = fig.add_subplot(grid[0, 1], sharey=ax_a)
    footer = fig.add_subplot(grid[1, :])
    footer.axis("off")
    handles = _throughput_panel(ax_a, rows, ups) + _breakdown_panel(ax_b, rows)
    ax_a.set_yticks(range(len(rows)))
    labels = shorten_labels([r.candidate.label for r in rows], 60)
    ax_a.set_yticklabels([f"{i}. {label}" for i, label in enumerate(labels, start=1)], fontsize=8)
    ax_b.tick_params(labelleft=False)
    for tick, row in zip(ax_a.get_yticklabels(), rows):
        if any(t in row.tags for t in TAGS):
            tick.set_color(_colour(row))
            tick.set_fontweight("bold")
    ax_a.set_ylim(len(rows) - 0.5, -0.5)  # rank 1 on top (shared with panel b)
    fig.suptitle(title, fontsize=11)
    footer.legend(handles=handles, loc="upper right", ncol=legend_columns, fontsize=7, frameon=False)
    if lines:
        footer.text(0.0, 1.0, "\n".join(lines), transform=footer.transAxes, va="top", ha="left", fontsize=8)
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------- validation


def _check_points(points: Sequence[Point]) -> list[Point]:
    points = list(points)
    if not points:
        raise ValueError("points must not be empty: no validated configuration to compare")
    for point in points:
        if len(point) != 4:
            raise ValueError(f"points: each must be (config_title, label, predicted, measured), got {point!r}")
        _, _, predicted, measured = point
        if not _finite(measured) or measured <= 0:
            raise ValueError(f"points: measured env steps/s must be a positive number, got {point!r}")
        if not _finite(predicted):
            raise ValueError(f"points: predicted env steps/s must be a finite number, got {point!r}")
    return points


def _ape(point: Point) -> float:
    return abs(point[2] - point[3]) / point[3]


def mape(points: Sequence[Point]) -> float:
    """Mean absolute percentage error ``mean(|predicted - measured| / measured)``, as a fraction.

    Raises:
        ValueError: no points, a measurement that is not positive, or a prediction that is not finite.
    """
    points = _check_points(points)
    return sum(_ape(p) for p in points) / len(points)


def mape_by_config(points: Sequence[Point]) -> dict[str, float]:
    """:func:`mape` of each configuration's points, configurations in their first appearance's order."""
    groups: dict[str, list[Point]] = {}
    for point in _check_points(points):
        groups.setdefault(point[0], []).append(point)
    return {config: mape(group) for config, group in groups.items()}


def format_validation(points: Sequence[Point], target: float | None = TARGET, detail: bool = False) -> str:
    """Per configuration: points, MAPE and the worst placement; then the overall MAPE against ``target``.

    Args:
        points: ``(config_title, label, predicted, measured)`` per validated placement.
        target: the MAPE to meet (a fraction), stated on the last line; ``None`` to leave it out.
        detail: also list every point with its signed error.

    Raises:
        ValueError: as :func:`mape`.
    """
    points = _check_points(points)
    groups: dict[str, list[Point]] = {}
    for point in points:
        groups.setdefault(point[0], []).append(point)
    table = [["configuration", "points", "MAPE", "worst error", "worst placement"]]
    for config, group in groups.items():
        worst = max(group, key=_ape)
        table.append([config, str(len(group)), _percent(mape(group)), _percent((worst[2] - worst[3]) / worst[3], True),
                      worst[1]])  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    right = [False, True, True, True]
    out = []
    for n, line in enumerate(table):
        cols = [s.rjust(w) if r else s.ljust(w) for s, w, r in zip(line, widths, right)]
        out.append("  ".join([*cols, line[4]]).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in [*widths, len(line[4])]))
    if detail:
        out.append("")
        for config, label, predicted, measured in points:
            out.append(f"{config} | {label}: predicted {format_rate(predicted)}, measured {format_rate(measured)}, "
                       f"error {_percent((predicted - measured) / measured, True)}")  # fmt: skip
    overall = mape(points)
    verdict = ""
    if target is not None:
        verdict = f" (target <= {_percent(target)}: {'met' if overall <= target else 'NOT met'})"
    out += ["", f"overall MAPE {_percent(overall)} over {len(points)} points in {len(groups)} configurations{verdict}"]
    return "\n".join(out)


def plot_validation(
    points: Sequence[Point], path: str | os.PathLike[str], title: str | None = None, band: float = TARGET
) -> pathlib.Path:
    """Scatter predicted against measured env steps/s (log-log), one colour per configuration; returns the path.

    The line y = x is a perfect prediction; the shaded band is ``±band`` around it.

    Raises:
        ValueError: as :func:`mape`, or ``band`` not in ``(0, 1)``.
        ImportError: matplotlib is not installed.
    """
    points = _check_points(points)
    if not 0 < band < 1:
        raise ValueError(f"band must be in (0, 1), got {band}")
    by_config = mape_by_config(points)
    fig = _figure(8, 6.5)
    ax = fig.subplots()
    markers = "osD^vP*Xh<>"
    for n, (config, err) in enumerate(by_config.items()):
        group = [p for p in points if p[0] == config]
        ax.scatter([p[3] for p in group], [p[2] for p in group], s=22, marker=markers[n % len(markers)],
                   color=f"C{n % 10}", label=f"{config} (MAPE {_percent(err)})", zorder=3)  # fmt: skip
    values = [v for p in points for v in (p[2], p[3]) if v > 0]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                    color="grey", alpha=0.2, label=f"±{100 * band:g}%")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured environment steps / s")
    ax.set_ylabel("predicted environment steps / s")
    ax.set_title(title or f"advisor validation: MAPE {_percent(mape(points))} over {len(points)} placements",
                 fontsize=10)  # fmt: skip
    ax.grid(which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, path)


__all__ = [
    "FORMAT", "NEAR_BEST", "PARTS", "TAGS", "TARGET", "Point", "RankedRow", "error", "format_rate",
    "format_summary", "format_table", "format_validation", "mape", "mape_by_config", "plot", "plot_validation",
    "shorten_labels", "speedups", "summarize", "to_json", "write_json",
]  # fmt: skip
