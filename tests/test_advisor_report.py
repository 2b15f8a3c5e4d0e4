"""The advisor's report: the ranking table, its JSON, its figures, and the validation error.

Rows are built by hand (a small dataclass with the attributes the report reads),
so every number the report prints can be checked against a known value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable

import pytest

from hetero_replay.advisor import report
from hetero_replay.advisor.workload import Candidate, ReplayConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclasses.dataclass
class Row:
    """What the advisor's model gives the report for one placement."""

    candidate: Candidate
    predicted: float
    learner_steps: float
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)
    measured: float | None = None
    measured_spread: tuple[float, float] | None = None
    predicted_only: bool = False
    tags: set[str] = dataclasses.field(default_factory=set)


def candidate(tree: str = "native", threads: int = 1, device: str = "cpu", staleness: int = 0) -> Candidate:
    storage = "host" if device == "cpu" else "pinned"
    return Candidate(ReplayConfig(tree, threads, storage, device, device), staleness)


def breakdown(predicted: float) -> dict[str, float]:
    """Seconds per env step adding up to 1 / predicted, over every part."""
    total = 1.0 / predicted
    shares = dict(zip(report.PARTS, (0.3, 0.2, 0.1, 0.05, 0.1, 0.2, 0.05, 0.0, 0.0)))
    return {part: share * total for part, share in shares.items()}


def three_rows() -> list[Row]:
    """Best (validated), an FPGA row predicted only, and the baseline (validated, the default)."""
    return [
        Row(candidate("native", 4, staleness=2), 12_000.0, 3_000.0, breakdown(12_000.0), measured=10_000.0,
            measured_spread=(9_500.0, 10_400.0), tags={"best"}),
        Row(candidate("fpga"), 9_000.0, 2_250.0, breakdown(9_000.0), predicted_only=True),
        Row(candidate("numpy"), 4_000.0, 1_000.0, breakdown(4_000.0), measured=5_000.0,
            measured_spread=(4_900.0, 5_100.0), tags={"baseline", "default"}),
    ]  # fmt: skip


def many_rows(n: int, measured: bool) -> list[Row]:
    """``n`` distinct candidates ranked by a decreasing prediction; every other one measured if ``measured``."""
    candidates = [
        candidate(tree, threads, device, staleness)
        for tree in ("native", "numpy", "torch", "cupy", "fpga")
        for threads in (1, 2, 4)
        for device in ("cpu", "cuda:0")
        for staleness in (0, 4)
    ]
    assert n <= len(candidates)
    rows = []
    for i, c in enumerate(candidates[:n]):
        predicted = 20_000.0 / (1 + 0.1 * i)
        m = predicted * (1.1 if i % 3 else 0.9) if measured and i % 2 == 0 else None
        rows.append(Row(c, predicted, predicted / 4, breakdown(predicted), measured=m,
                        measured_spread=(0.95 * m, 1.05 * m) if m else None, predicted_only=c.replay.tree == "fpga"))  # fmt: skip
    rows[0].tags.add("best")
    rows[-1].tags.add("baseline")
    rows[min(2, n - 1)].tags.add("default")
    return rows


# ---------------------------------------------------------------------------------------------- table


def table_lines(text: str) -> dict[str, str]:
    """The table's body lines, by their rank."""
    out = {}
    for line in text.splitlines():
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if first.isdigit():
            out[first] = line
    return out


def test_table_lists_every_label_in_rank_order_with_speedups() -> None:
    rows = three_rows()
    text = report.format_table(rows, "sb3 DQN CartPole-v1", width=200)  # wide: labels are not shortened
    assert text.splitlines()[0] == "sb3 DQN CartPole-v1"
    lines = table_lines(text)
    assert sorted(lines) == ["1", "2", "3"]
    for rank, row in enumerate(rows, start=1):
        assert row.candidate.label in lines[str(rank)]
    # speed-up over the baseline row (4,000 env steps/s)
    assert "3.00x" in lines["1"] and "2.25x" in lines["2"] and "1.00x" in lines["3"]
    assert "12,000" in lines["1"] and "3,000" in lines["1"]
    # measured and signed error (predicted - measured) / measured for validated rows, a dash otherwise
    assert "10,000" in lines["1"] and "+20.0%" in lines["1"]
    assert "5,000" in lines["3"] and "-20.0%" in lines["3"]
    assert "%" not in lines["2"]


def test_table_marks_predicted_only_rows_and_tags() -> None:
    lines = table_lines(report.format_table(three_rows(), "t"))
    assert "predicted only" in lines["2"]
    assert "predicted only" not in lines["1"] and "predicted only" not in lines["3"]
    assert lines["1"].rstrip().endswith("best")
    assert "baseline" in lines["3"] and "default" in lines["3"]


def test_table_columns_are_aligned() -> None:
    text = report.format_table(many_rows(12, measured=True), "t")
    lines = list(table_lines(text).values())
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#"))
    # the numeric columns are right-aligned: each "x" of a speed-up sits in the same column
    speedup_end = header.index("speed-up") + len("speed-up") - 1
    assert all(line[speedup_end] == "x" for line in lines)


def test_table_without_measurements_has_no_measured_columns() -> None:
    text = report.format_table(many_rows(5, measured=False), "t")
    assert "measured" not in text.splitlines()[2]
    assert "error" not in text.splitlines()[2]


def test_table_shortens_long_labels_to_its_width_the_same_way_for_every_row() -> None:
    rows = many_rows(30, measured=True)
    text = report.format_table(rows, "t")
    lines = table_lines(text)
    assert len(lines) == 30
    assert "labels shortened" in text
    # every label keeps all its fields (abbreviated, not cut) and rows without long notes fit in 120 columns
    for rank, row in enumerate(rows, start=1):
        assert row.candidate.replay.tree in lines[str(rank)]
        assert "..." not in lines[str(rank)]
        if not row.predicted_only and not row.tags:
            assert len(lines[str(rank)]) <= report.WIDTH
    assert all(" L:" in line for line in lines.values())


def test_shorten_labels_cuts_in_the_middle_as_a_last_resort() -> None:
    labels = ["a" * 30 + "b" * 30, "short"]
    out = report.shorten_labels(labels, 21)
    assert out[1] == "short"
    assert len(out[0]) == 21 and out[0].startswith("a") and out[0].endswith("b") and "..." in out[0]
    with pytest.raises(ValueError, match="width"):
        report.shorten_labels(labels, 2)


def test_table_summary_defaults_to_summarize() -> None:
    rows = three_rows()
    text = report.format_table(rows, "t")
    summary = report.summarize(rows)
    assert summary["best"] == rows[0].candidate.label
    assert summary["baseline"] == summary["default"] == rows[2].candidate.label
    assert summary["speedup_vs_baseline"] == pytest.approx(3.0)
    assert summary["validated"] == 2
    assert summary["mape"] == pytest.approx(0.2)
    assert summary["within_5%_of_best"] == []
    assert "speedup vs baseline: 3.00x" in text
    assert "mape: 20.0%" in text


def test_table_prints_a_given_summary() -> None:
    text = report.format_table(three_rows(), "t", {"best": "x", "speedup_vs_default": 1.5, "mape": 0.123, "n": 3})
    assert "best: x" in text and "speedup vs default: 1.50x" in text and "mape: 12.3%" in text and "n: 3" in text


def test_summary_lists_placements_near_the_best() -> None:
    rows = three_rows()
    rows[1].predicted = 11_500.0  # within 5% of 12,000
    assert report.summarize(rows)["within_5%_of_best"] == [rows[1].candidate.label]


def test_table_without_a_baseline_shows_no_speedups() -> None:
    rows = three_rows()
    rows[2].tags = {"default"}
    text = report.format_table(rows, "t")
    assert "no row is tagged 'baseline'" in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("#"))
    speedup_end = header.index("speed-up") + len("speed-up") - 1
    assert all(line[speedup_end] == "-" for line in table_lines(text).values())
    assert report.speedups(rows) == [None, None, None]


@pytest.mark.parametrize(
    "fn", [report.format_table, report.to_json, report.summarize, report.speedups], ids=lambda f: f.__name__
)
def test_empty_rows_are_refused(fn: Callable[..., object]) -> None:
    args: tuple[object, ...] = ([], "t") if fn in (report.format_table, report.to_json) else ([],)
    with pytest.raises(ValueError, match="rows must not be empty"):
        fn(*args)


def test_two_baselines_are_refused() -> None:
    rows = three_rows()
    rows[0].tags.add("baseline")
    with pytest.raises(ValueError, match="baseline"):
        report.format_table(rows, "t")


# ---------------------------------------------------------------------------------------------- JSON


def test_json_round_trips_with_none_for_missing_numbers(tmp_path) -> None:
    rows = three_rows()
    rows[1].learner_steps = math.nan  # a number the model could not give
    profile = {"machine": {"cpu": "test"}, "entries": [{"sample": 1e-5, "bad": math.inf}]}
    data = report.to_json(rows, "sb3 DQN", profile_dict=profile)
    text = json.dumps(data, allow_nan=False)  # raises on a NaN or an infinity
    back = json.loads(text)
    assert back["title"] == "sb3 DQN"
    assert [r["rank"] for r in back["rows"]] == [1, 2, 3]
    assert [r["label"] for r in back["rows"]] == [r.candidate.label for r in rows]
    assert Candidate.from_dict(back["rows"][0]["candidate"]) == rows[0].candidate
    middle = back["rows"][1]
    assert middle["measured_env_steps_per_s"] is None and middle["measured_spread"] is None
    assert middle["error"] is None and middle["learner_steps_per_s"] is None
    assert middle["predicted_only"] is True
    assert back["rows"][0]["error"] == pytest.approx(0.2)
    assert back["rows"][0]["measured_spread"] == [9_500.0, 10_400.0]
    assert back["rows"][0]["speedup_vs_baseline"] == pytest.approx(3.0)
    assert back["rows"][2]["tags"] == ["baseline", "default"]
    assert back["parts"] == list(report.PARTS)
    assert sum(back["rows"][0]["breakdown_s_per_env_step"].values()) == pytest.approx(1 / 12_000)
    assert back["profile"]["entries"][0]["bad"] is None
    assert back["summary"]["best"] == rows[0].candidate.label

    path = report.write_json(tmp_path / "sub" / "ranking.json", rows, "sb3 DQN", profile_dict=profile)
    assert json.loads(path.read_text()) == back


def test_json_breakdown_fills_missing_parts_with_zero() -> None:
    rows = three_rows()
    rows[0].breakdown = {"train": 1e-4}
    rows[1].breakdown = {}
    rows[2].breakdown = {"env step": 2e-5, "train": 1e-4}
    data = report.to_json(rows, "t")
    assert data["parts"] == ["env step", "train"]
    assert data["rows"][1]["breakdown_s_per_env_step"] == {"env step": 0.0, "train": 0.0}


# ---------------------------------------------------------------------------------------------- figures


@pytest.mark.parametrize("n", [1, 3, 30])
@pytest.mark.parametrize("measured", [True, False], ids=["measured", "predicted"])
def test_plot_writes_a_png(tmp_path, n: int, measured: bool) -> None:
    pytest.importorskip("matplotlib")
    rows = many_rows(n, measured)
    summary = report.summarize(rows) if measured else None
    path = report.plot(rows, "sb3 DQN CartPole-v1", tmp_path / "out" / "ranking.png", summary)
    assert path == tmp_path / "out" / "ranking.png"
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def test_plot_handles_negative_and_missing_parts(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    rows = three_rows()
    rows[0].breakdown["pipeline"] = -2e-5  # time the relaxed pipeline hides
    rows[1].breakdown = {}
    path = report.plot(rows, "t", tmp_path / "ranking.png")
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_plot_refuses_empty_rows(tmp_path) -> None:
    with pytest.raises(ValueError, match="rows must not be empty"):
        report.plot([], "t", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plots_name_the_extra_without_matplotlib(tmp_path, monkeypatch) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it raises ImportError
    with pytest.raises(ImportError, match=r"pip install '\.\[sb3\]'"):
        report.plot(three_rows(), "t", tmp_path / "x.png")
    with pytest.raises(ImportError, match=r"pip install '\.\[sb3\]'"):
        report.plot_validation([("c", "m", 1.0, 1.0)], tmp_path / "y.png")


# ---------------------------------------------------------------------------------------------- validation

POINTS = [
    ("sb3 DQN", "a", 110.0, 100.0),  # +10%
    ("sb3 DQN", "b", 180.0, 200.0),  # -10%
    ("tianshou SAC", "c", 1_500.0, 1_000.0),  # +50%
    ("sb3 DQN", "d", 50.0, 50.0),  # 0%
]


def test_mape_is_the_mean_absolute_relative_error() -> None:
    assert report.mape(POINTS) == pytest.approx((0.1 + 0.1 + 0.5 + 0.0) / 4)
    assert report.mape_by_config(POINTS) == pytest.approx({"sb3 DQN": 0.2 / 3, "tianshou SAC": 0.5})
    assert list(report.mape_by_config(POINTS)) == ["sb3 DQN", "tianshou SAC"]


def test_format_validation_reports_each_configuration_and_the_overall_error() -> None:
    text = report.format_validation(POINTS)
    sb3 = next(line for line in text.splitlines() if line.startswith("sb3 DQN"))
    tianshou = next(line for line in text.splitlines() if line.startswith("tianshou SAC"))
    assert " 3 " in sb3 and "6.7%" in sb3
    assert "50.0%" in tianshou and "+50.0%" in tianshou and tianshou.endswith("c")
    assert "overall MAPE 17.5% over 4 points in 2 configurations" in text
    assert "NOT met" in text
    assert "target" not in report.format_validation(POINTS, target=None)
    detailed = report.format_validation(POINTS[:2], detail=True)
    assert "met)" in detailed and "error +10.0%" in detailed and "error -10.0%" in detailed


@pytest.mark.parametrize(
    "points, match",
    [
        ([], "must not be empty"),
        ([("c", "m", 1.0, 0.0)], "measured"),
        ([("c", "m", 1.0, math.nan)], "measured"),
        ([("c", "m", math.inf, 1.0)], "predicted"),
        ([("c", "m", 1.0)], "config_title, label, predicted, measured"),
    ],
)
def test_validation_refuses_bad_points(points, match) -> None:
    with pytest.raises(ValueError, match=match):
        report.mape(points)
    with pytest.raises(ValueError, match=match):
        report.format_validation(points)


def test_plot_validation_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    points = [(f"config {c}", f"m{i}", 1_000.0 * (c + 1) * (1 + 0.05 * i), 1_000.0 * (c + 1)) for c in range(6)
              for i in range(5)]  # fmt: skip
    path = report.plot_validation(points, tmp_path / "validation.png")
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(ValueError, match="band"):
        report.plot_validation(points, tmp_path / "bad.png", band=1.5)
