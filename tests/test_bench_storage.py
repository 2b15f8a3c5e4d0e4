"""Smoke test of benchmarks/bench_storage.py (what it measures and writes, not how fast)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cpprb")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench = pytest.importorskip("bench_storage")

NEEDS = """algorithm,environment,capacity_items,prioritized_or_reuse,item_bytes,insert_items_per_s,insert_bytes_per_s,sample_items_per_s,sample_bytes_per_s
SAC,Mujoco-Hopper,1000000,none,3000,71,213000,138,16000000
MASAC,SMAC-3s5z,1000000,none,29000,116,3000000,63,2000000
"""


def test_quick_run_writes_every_output_and_leaves_no_files(tmp_path: Path) -> None:
    needs, data, out = tmp_path / "needs.csv", tmp_path / "data", tmp_path / "out"
    needs.write_text(NEEDS)
    argv = ["--quick", "--actors", "1", "2", "--chunks", "64", "--capacity", "2e5", "--seconds", "0.3",
            "--workloads", str(needs), "--duration", "0.5", "--unpaced-duration", "0.5", "--max-bytes", "32M",
            "--dir", str(data), "--shm-dir", str(data), "--out", str(out), "--name", "smoke",
            "--shared-rows", "SAC"]  # fmt: skip
    assert bench.main(argv) == 0

    results = json.loads((out / "storage-smoke.json").read_text())
    assert results["start_method"] == "fork" and results["machine"]["cores"] >= 1
    actors = results["actors"]
    cells = {(c["actors"], c["chunk"], c["label"]): c for c in actors["cells"]}
    assert set(cells) == {(n, 64, label) for n in (1, 2) for label in bench.CONTENDERS}
    for cell in cells.values():
        assert cell["errors"] == [] and len(cell["repeats"]) == 1
        assert cell["inserts_per_s"] > 0 and cell["samples_per_s"] > 0
    assert [(r["actors"], r["target"]) for r in actors["ratios"]] == [(1, False), (2, True)]
    assert all(r["insert_ratio"] > 0 and r["sample_ratio"] > 0 for r in actors["ratios"])

    rows = results["workloads"]["rows"]
    assert [(r["label"], r["storage"]) for r in rows] == [
        ("SAC/Mujoco-Hopper", "disk"),
        ("MASAC/SMAC-3s5z", "disk"),
        ("SAC/Mujoco-Hopper", "shared"),
    ]
    assert rows[2]["segment_bytes"] > 0 and rows[2]["rss_bytes"] > 0 and rows[2]["disk_bytes"] == 0
    for row in rows:
        assert row["depth"] >= bench.MIN_DEPTH and row["batch_probe_s"] > 0
        assert "error" not in row, row["error"]
        assert row["scale"] < 1 and row["capacity"] * row["item_bytes"] <= 32 << 20
        assert row["prefill"]["items_per_s"] > 0
        assert 0 < row["ram_cache_share"] <= 1 if row["storage"] == "disk" else row["ram_cache_share"] == 0
        for name in ("paced", "unpaced"):
            phase = row[name]
            assert "error" not in phase, phase["error"]
            assert phase["torn_rows"] == 0 and phase["unwritten_rows"] == 0
            assert phase["sample_calls"] > 0 and phase["insert_items_per_s"] > 0
            assert 0 < phase["latency_ms"]["p50"] <= phase["latency_ms"]["p99"] <= phase["latency_ms"]["max"]
            assert phase["primed"] and phase["startup_s"] > 0  # the clock started once the pipeline was full
        assert {"insert_met", "sample_met", "insert_required", "sample_required"} <= set(row["paced"])

    text = (out / "storage-smoke.md").read_text()
    assert "## Actors" in text and "## Workloads" in text and "| MASAC/SMAC-3s5z |" in text
    assert (out / "storage-smoke.png").stat().st_size > 0
    assert list(data.iterdir()) == []  # segments, ring files and the run's folder are gone


def test_torn_rows_checks_every_copy_of_the_id() -> None:
    chunk = bench.rows_of(200, 5, np.random.default_rng(0))
    bench.stamp(chunk, np.arange(1, 6, dtype=np.int64))
    assert bench.torn_rows(chunk) == (0, 0)
    chunk["tail"][0] = 9
    for row, offset in zip((1, 2, 3), bench._stamp_offsets(200 - bench.ROW_OVERHEAD)):
        chunk["obs"][row, offset] ^= 1
    chunk["head"][4] = chunk["tail"][4] = 0
    chunk["obs"][4] = 0
    assert bench.torn_rows(chunk) == (4, 1)


def test_rows_filter_scale_and_sizes() -> None:
    table = [bench.Workload("DQN", "Atari-Qbert", 400_000, "priority", 110_000, 400, 1650),
             bench.Workload("DQN", "GoBigger", 100_000, "priority", 400_000, 30, 83),
             bench.Workload("SAC", "Mujoco-Hopper", 1_000_000, "none", 3000, 71, 138)]  # fmt: skip
    assert [w.label for w in bench.select(table, ["dqn"])] == ["DQN/Atari-Qbert", "DQN/GoBigger"]
    assert [w.label for w in bench.select(table, ["DQN/GoBigger", "mujoco-hopper"])] == [
        "DQN/GoBigger",
        "SAC/Mujoco-Hopper",
    ]
    assert bench.select(table, None) == table
    with pytest.raises(SystemExit, match="PPO"):
        bench.select(table, ["PPO"])
    assert bench.plan(table[0], 44_000_000_000) == (400_000, 1.0)
    assert bench.plan(table[0], 11_000_000_000) == (100_000, 0.25)
    assert bench.plan(table[1], 1) == (bench.MIN_CAPACITY, bench.MIN_CAPACITY / 100_000)
    assert bench.plan(table[0], 11_000_000_000, stored_item_bytes=5_000) == (400_000, 1.0)
    assert bench.plan(table[0], 1_000_000_000, stored_item_bytes=5_000) == (200_000, 0.5)
    assert bench._size("2G") == 2 << 30 and bench._size("512MiB") == 512 << 20 and bench._size("1e9") == 10**9


def test_the_default_workload_table_is_in_the_repository() -> None:
    # The default --workloads path resolves inside the checkout, so a fresh clone runs the benchmark as is.
    root = Path(__file__).resolve().parents[1]
    assert bench.WORKLOADS_CSV.resolve().is_relative_to(root)
    table = bench.read_workloads(bench.WORKLOADS_CSV)
    assert len(table) == 8 and {"DQN/Atari-Qbert", "R2D2/Atari-Qbert", "IMPALA/Atari-Qbert"} <= {w.label for w in table}


def test_pipeline_depth_covers_a_batch_and_a_stall_within_the_memory_cap() -> None:
    # DQN/Atari: 19 ms periods, a cold batch of 10 ms and a 0.3 s stall: 16 batches ahead.
    assert bench.pipeline_depth(0.010, 32 / 1650, 32 * 110_000, 0.3) == 16
    assert bench.pipeline_depth(0.010, 1.0, 32 * 3_000, 0.0) == bench.MIN_DEPTH  # slow learner: the minimum
    # R2D2: 320 MB batches; a 7 s cold batch would ask for 11, the memory cap allows 6.
    assert bench.pipeline_depth(7.0, 32 / 45, 32 * 10_000_000, 0.3) == bench.PIPELINE_BYTES // (32 * 10_000_000)


def test_codec_and_atari_content_apply_to_atari_rows_only() -> None:
    args = bench._parse(["--part", "workloads", "--codec", "lz4", "--content", "atari", "--max-bytes", "1G"])
    atari = bench.Workload("R2D2", "Atari-Qbert", 10_000, "priority", 10_000_000, 3, 45)
    sac = bench.Workload("SAC", "Mujoco-Hopper", 1_000_000, "none", 3000, 71, 138)
    assert bench.payload_of(atari, args) == ("atari", "lz4")
    assert bench.payload_of(sac, args) == ("random", None)
    assert args.min_calls == bench.MIN_CALLS and args.staleness is None and args.shared_rows == []
