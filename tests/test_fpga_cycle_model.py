"""The FPGA cycle model: its formulas, the C simulation's counts, the parts' capacity, and the advisor's use of it.

The model's counts are checked against the C simulation of the RMM
(``hetero_replay._rmm_emu``, the HLS source compiled with g++): every stage's
firings, the words and the ``cycles`` estimate must be equal, not close, over
command streams of several B, N and K. The advisor tests build profiles by
hand (as tests/test_advisor.py does): nothing here depends on this machine's
speed.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetero_replay.advisor import Candidate, ReplayConfig, Timing, devices, explore, validation
from hetero_replay.advisor.advice import Advice
from hetero_replay.advisor.profile import MODELLED, Profile
from hetero_replay.fpga import cycle_model as cm
from hetero_replay.fpga import protocol as P
from hetero_replay.fpga.reference import level_sizes
from tests.test_advisor import NATIVE, NUMPY, US, entry, make_profile, spec

FANOUTS = (2, 4, 16, 64)
CAPACITIES = (1, 5, 16, 17, 1000, 4097, 100_000)


# -- the formulas ------------------------------------------------------------------------------------


def test_the_cycle_formulas_by_hand():
    # K = 16, N = 100,000: D = 5 levels; a build for exactly N has MAX_DEPTH = 5.
    # header 2, trailer 3 + 4 = 7; a level stage 2 + 4 + 1 = 7; fill 1 + 4 + 5 * 7 + 1 = 41.
    assert cm.tree_depth(100_000, 16) == 5
    assert cm.fill_latency(16, 5) == 41
    assert cm.sample_cycles(256, 100_000) == 2 + 256 + 41 - 1 + 7
    # UPDATE of 256: leaf loop 256 + 2, then 4 levels of 256 + refresh (2 + 4 + 1).
    assert cm.update_cycles(256, 100_000) == 2 + (256 + 2) + 4 * (256 + 7) + 7
    # UPDATE of 1500: two chunks (1024, 476), each with its own leaf loop and refreshes.
    assert cm.update_cycles(1500, 100_000) == 2 + (1024 + 2) + 4 * (1024 + 7) + (476 + 2) + 4 * (476 + 7) + 7
    # INSERT of 20 leaves from slot 10: parents [0, 1] at level 1, [0] above.
    assert cm.insert_counts(10, 20, 100_000)["cycles"] == 2 + (20 + 2) + (2 + 7) + 3 * (1 + 7) + 7
    # ... and wrapping at the end (N = 1000): two ranges per level.
    wrapped = cm.insert_counts(990, 20, 1000)
    assert wrapped["fire:insert_refresh"] == (2 + 1) + (1 + 1)  # level 1: [61, 62] and [0]; level 2: [3] and [0]
    assert wrapped["cycles"] == 2 + (20 + 2) + (2 + 7) + (1 + 7) + (1 + 7) + (1 + 7) + 7
    assert cm.get_cycles(8, 100_000) == 2 + 8 + 3 + 7
    assert cm.clear_counts(100_000, 16)["cycles"] == 2 + 6256 + 1 + 7  # rows: level 1's 6,256 groups


def test_a_sample_fires_every_stage_once_per_draw_and_every_built_level():
    counts = cm.sample_counts(300, 1000, fanout=4, max_depth=9)
    assert cm.tree_depth(1000, 4) == 5
    for stage in ("fire:read_draws", "fire:scale", "fire:write_results"):
        assert counts[stage] == 300
    assert [counts[f"fire:level{level}"] for level in range(9)] == [300] * 9  # levels above D pass through
    assert counts["words_in"] == 1 + 300 and counts["words_out"] == 300 + 2
    with pytest.raises(ValueError, match="max_depth"):
        cm.sample_counts(1, 1000, fanout=4, max_depth=4)


@pytest.mark.parametrize("fanout", FANOUTS)
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_the_depth_is_the_trees_layout(fanout, capacity):
    assert cm.tree_depth(capacity, fanout) == len(level_sizes(capacity, fanout))


def test_cycles_and_seconds_grow_with_batch_capacity_and_depth():
    batches = [1, 32, 256, 4096, 10_000]
    for fanout in FANOUTS:
        for cycles in (cm.sample_cycles, cm.update_cycles, cm.get_cycles):
            series = [cycles(b, 100_000, fanout) for b in batches]
            assert series == sorted(series) and len(set(series)) == len(series)
        by_n = [cm.sample_cycles(256, n, fanout) for n in (10, 1000, 100_000, 10**7)]
        assert by_n == sorted(by_n)  # deeper tree, longer fill (a build sized for N)
        by_n = [cm.update_cycles(256, n, fanout) for n in (10, 1000, 100_000, 10**7)]
        assert by_n == sorted(by_n)  # one more refresh loop per level
    assert cm.sample_cycles(256, 1000, 16, max_depth=4) < cm.sample_cycles(256, 1000, 16, max_depth=7)
    for part in cm.parts():
        times = [cm.call_time(part, "sample", b, 100_000).total_s for b in batches]
        assert times == sorted(times)
        kernel, end_to_end = zip(*(cm.samples_per_s(part, b, 100_000) for b in batches))
        assert list(kernel) == sorted(kernel) and list(end_to_end) == sorted(end_to_end)
        assert all(k > e for k, e in zip(kernel, end_to_end))  # the link and the host cost something
        assert kernel[-1] < part.clock_hz  # never more than one draw per cycle


def test_a_call_is_kernel_plus_link_plus_overhead():
    part = cm.PARTS["zcu104"]
    t = cm.call_time(part, "sample", 256, 100_000)
    assert t.cycles == cm.sample_cycles(256, 100_000, max_depth=cm.part_max_depth(part))
    assert t.words == (1 + 256) + (256 + 2)
    assert t.kernel_s == pytest.approx(t.cycles / 250e6)
    assert t.link_s == pytest.approx(8 * t.words / part.link_bytes_per_s)
    assert t.total_s == pytest.approx(t.kernel_s + t.link_s + part.call_overhead_s)
    with pytest.raises(ValueError, match="op must be one of"):
        cm.call_time(part, "delete", 1, 100)
    with pytest.raises(ValueError, match="n must be"):
        cm.call_time(part, "sample", -1, 100)


# -- the C simulation ---------------------------------------------------------------------------------


def random_stream(rng: np.random.Generator, capacity: int, commands: int = 40) -> np.ndarray:
    """Back-to-back commands of every kind, some of them refused (indices out of range, too long an INSERT)."""
    words = [P.pack_clear()]
    for _ in range(commands):
        n = int(rng.choice([0, 1, 3, 32, 256, 1500]))
        op = int(rng.integers(0, 8))
        if op == 0:
            idx = rng.integers(0, capacity + capacity // 10 + 2, n)
            words.append(P.pack_update(idx, rng.integers(1, 2**32, n)))
        elif op in (1, 2):
            words.append(P.pack_insert(int(rng.integers(0, capacity)), min(n, capacity)))
        elif op in (3, 4):
            words.append(P.pack_sample(rng.integers(0, 2**32, n, dtype=np.uint64)))
        elif op == 5:
            words.append(P.pack_get(rng.integers(0, capacity, n)))
        elif op == 6:
            words.append(P.pack_find(rng.integers(0, 2**40, n, dtype=np.uint64)))
        else:
            words.append(P.pack_insert(0, capacity + 1))  # refused: header, payload and trailer only
    words.append(np.array([P.header(9, 3)], np.uint64))  # an unknown opcode: its header only
    return np.concatenate(words).astype(np.uint64)


def simulate(stream: np.ndarray, capacity: int, fanout: int) -> dict[str, int]:
    emu = pytest.importorskip("hetero_replay._rmm_emu", reason="the emulation module is not built")
    rmm = emu.Rmm(capacity, fanout)
    rmm.reset_counters()  # construction CLEARs
    rmm.run(stream)
    return {str(k): int(v) for k, v in rmm.counters().items()}


def assert_same_counts(model: dict[str, int], sim: dict[str, int]) -> None:
    """Every counter the model predicts equals the simulation's; every firing the simulation counts is predicted."""
    differ = {k: (v, sim.get(k)) for k, v in model.items() if sim.get(k, 0) != v}
    assert not differ, f"model vs C simulation (model, sim): {differ}"
    unpredicted = {k: v for k, v in sim.items() if k.startswith(("fire:", "cycles")) and k not in model and v}
    assert not unpredicted, f"counted by the C simulation, not by the model: {unpredicted}"


@pytest.mark.parametrize("fanout", FANOUTS)
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_the_model_counts_what_the_c_simulation_counts(fanout, capacity):
    stream = random_stream(np.random.default_rng(capacity * 64 + fanout), capacity)
    sim = simulate(stream, capacity, fanout)
    assert sim["max_depth"] == cm.emulation_max_depth(fanout)
    assert_same_counts(cm.command_counts(stream, capacity, fanout, cm.emulation_max_depth(fanout)), sim)


@pytest.mark.parametrize("fanout", (2, 16, 64))
@pytest.mark.parametrize("capacity", (1000, 100_000, 1_000_000))
@pytest.mark.parametrize("batch", (1, 32, 256, 4096))
def test_each_primitive_matches_the_c_simulation(batch, capacity, fanout):
    rng = np.random.default_rng(batch + capacity + fanout)
    depth = cm.emulation_max_depth(fanout)
    first = int(rng.integers(0, capacity))
    rows = min(batch, capacity)
    cases = {
        "insert": (P.pack_insert(first, rows), cm.insert_counts(first, rows, capacity, fanout, depth)),
        "update": (
            P.pack_update(rng.integers(0, capacity, batch), rng.integers(1, 2**32, batch)),
            cm.update_counts(batch, capacity, fanout, depth),
        ),
        "sample": (
            P.pack_sample(rng.integers(0, 2**32, batch, dtype=np.uint64)),
            cm.sample_counts(batch, capacity, fanout, depth),
        ),
    }
    for op, (words, model) in cases.items():
        sim = simulate(words, capacity, fanout)
        assert_same_counts(model, sim)
        assert sim[f"cycles:{op}"] == model["cycles"]
    levels = cm.tree_depth(capacity, fanout)
    assert cases["update"][1]["fire:update_refresh"] == (levels - 1) * batch  # every level, every entry


def test_a_truncated_stream_is_refused():
    words = P.pack_sample(np.arange(5, dtype=np.uint64))[:-1]
    with pytest.raises(ValueError, match="payload words"):
        cm.command_counts(words, 100, 16)


# -- parts and capacity -------------------------------------------------------------------------------


def test_the_parts_and_their_limits():
    assert [p.key for p in cm.parts()] == ["kv260", "zcu104", "u250"]
    kv260, zcu104, u250 = cm.parts()
    assert (kv260.device, kv260.bram36, kv260.uram) == ("xck26", 144, 64)
    assert (zcu104.device, zcu104.bram36, zcu104.uram) == ("xczu7ev", 312, 96)
    assert (u250.device, u250.bram36, u250.uram) == ("xcu250", 2688, 1280)
    assert "PYNQ >= 3.1 dropped Alveo" in u250.note and not kv260.note
    assert kv260.label == "KV260 xck26 @ 250 MHz" and u250.label == "U250 xcu250 @ 300 MHz"
    for fanout in FANOUTS:
        limits = [cm.max_leaves(p, fanout) for p in (kv260, zcu104, u250)]
        assert limits == sorted(limits)
        assert 10**5 <= cm.max_leaves(zcu104, fanout) < 10**6 <= cm.max_leaves(u250, fanout)
    assert cm.part_named("xck26-sfvc784-2LV-c") is kv260  # what an overlay's .hwh names
    assert cm.part_named("ZCU104") is zcu104
    with pytest.raises(ValueError, match="part must be one of"):
        cm.part_named("xc7z020")


@pytest.mark.parametrize("key", list(cm.PARTS))
@pytest.mark.parametrize("fanout", FANOUTS)
def test_max_leaves_is_the_largest_build_that_fits(key, fanout):
    limit = cm.max_leaves(key, fanout)
    plan = cm.plan_memory(key, limit, fanout)
    assert plan.fits and plan.bram36 <= plan.bram36_budget and plan.uram <= plan.uram_budget
    if limit < P.MAX_LEAVES:
        assert not cm.plan_memory(key, limit + 1, fanout).fits
    assert cm.check_capacity(key, limit, fanout) == limit


def test_a_memory_plan_by_hand():
    # KV260, K = 16, 196,608 leaves: 16 leaf banks of 12,288 rows x 32 bit = 3 URAM each (48 of the 51 allowed);
    # level 1: 768 rows, sums 2 BRAM36 and minima 1 per bank; the levels above fit distributed RAM.
    plan = cm.plan_memory("kv260", 196_608, 16)
    where = {(a.name, a.level): (a.memory, a.blocks) for a in plan.arrays}
    assert where[("leaf", 0)] == ("uram", 48)
    assert where[("sum", 1)] == ("bram", 32) and where[("min", 1)] == ("bram", 16)
    assert {where[(n, lv)][0] for n in ("sum", "min") for lv in (2, 3, 4)} == {"lutram"}
    assert (plan.bram36, plan.uram, plan.bram36_budget, plan.uram_budget) == (48, 48, 111, 51)
    assert cm.max_leaves("kv260", 16) == 196_608
    assert cm.bram36_blocks(512, 64) == 1 and cm.bram36_blocks(1024, 64) == 2 and cm.bram36_blocks(1024, 32) == 1
    assert cm.uram_blocks(4096, 72) == 1 and cm.uram_blocks(4097, 32) == 2


def test_a_tree_beyond_the_part_is_a_clear_error():
    limit = cm.max_leaves("kv260", 16)
    with pytest.raises(cm.FpgaCapacityError) as error:
        cm.check_capacity("kv260", 1_000_000, 16)
    message = str(error.value)
    assert isinstance(error.value, ValueError)
    for text in ("Kria KV260", "xck26", "1,000,000", f"{limit:,}", "fanout 16"):
        assert text in message
    with pytest.raises(cm.FpgaCapacityError, match="ZCU104"):
        cm.replay_times("zcu104", 256, 1_000_000)
    assert cm.replay_times("u250", 256, 1_000_000)["sample"].total_s > 0
    with pytest.raises(ValueError, match="fanout"):
        cm.max_leaves("kv260", 3)
    with pytest.raises(ValueError, match="capacity"):
        cm.check_capacity("kv260", 0)


# -- the advisor --------------------------------------------------------------------------------------

#: The C++ tree's own share, as if timed alone: sample 60 us, update 30 us, insert 2 us.
NATIVE_TREE = {"sample": Timing.of(60 * US), "update": Timing.of(30 * US), "insert": Timing.of(2 * US)}


def fpga_profile(buffer_size: int) -> Profile:
    p = make_profile(
        [entry(NATIVE, insert=10, sample=100, update=50), entry(NUMPY, insert=30, sample=400, update=200)],
        workload=spec(buffer_size=buffer_size, batch_size=256),
    )
    devices.add_modelled(p, tree_times=lambda b, n, rows: NATIVE_TREE)
    return p


def tree_bound_profile() -> Profile:
    """One collect step per gradient step, and a C++ tree that takes most of a slow sample and update."""
    p = make_profile(
        [entry(NATIVE, insert=10, sample=1000, update=500), entry(NUMPY, insert=30, sample=4000, update=2000)],
        workload=spec(buffer_size=100_000, batch_size=256, collect_steps=1),
        phase=1800,
    )
    tree = {"sample": Timing.of(950 * US), "update": Timing.of(480 * US), "insert": Timing.of(2 * US)}
    devices.add_modelled(p, tree_times=lambda b, n, rows: tree)
    return p


def test_the_advisor_adds_one_predicted_entry_per_part_that_holds_n():
    p = fpga_profile(1_000_000)
    modelled = [e for e in p.replay if e.source == MODELLED]
    assert [e.config.label for e in modelled] == [cm.PARTS["u250"].label]
    (fpga,) = modelled
    assert (fpga.config.tree, fpga.config.tree_device, fpga.config.storage, fpga.config.threads) == (
        "fpga", "fpga:0", "host", 1,
    )  # fmt: skip
    device = cm.replay_times("u250", 256, 1_000_000, insert_rows=1)
    # the measured entry, the C++ tree's own share swapped for the model's
    assert fpga["sample"] == pytest.approx(100 * US - 60 * US + device["sample"].total_s)
    assert fpga["update"] == pytest.approx(50 * US - 30 * US + device["update"].total_s)
    assert fpga["insert"] == pytest.approx(10 * US - 2 * US + device["insert"].total_s)
    assert fpga.times["phase_relaxed"] is None
    reasons = {s["config"]["label"]: s["reason"] for s in p.skipped}
    assert set(reasons) == {cm.PARTS["kv260"].label, cm.PARTS["zcu104"].label}
    assert all("FpgaCapacityError" in r and "1,000,000" in r for r in reasons.values())
    assert devices.add_modelled(p, tree_times=lambda *a: pytest.fail("timed again")) == []  # idempotent
    assert len(p.replay) == 3


def test_every_part_that_fits_is_ranked_predicted_only_next_to_the_measured_ones(tmp_path):
    p = tree_bound_profile()
    labels = {e.config.label for e in p.replay if e.source == MODELLED}
    assert labels == {part.label for part in cm.parts()}
    rows = explore.rank(p, staleness=(0, 1))
    assert len(rows) == 2 * len(p.replay)
    fpga_rows = [r for r in rows if r.candidate.replay.tree == "fpga"]
    assert len(fpga_rows) == 6 and all(r.predicted_only for r in fpga_rows)
    assert not any(r.predicted_only for r in rows if r.candidate.replay.tree != "fpga")
    # The FPGA's calls (~45 us each) beat the C++ tree's 950 + 480 us here, so a modelled row is predicted
    # fastest; the best is still one this machine runs.
    assert max(rows, key=lambda r: r.predicted).predicted_only
    assert "best" in rows[0].tags and not rows[0].predicted_only
    assert rows[0].candidate.replay == NATIVE
    assert [r.candidate for r in rows if "baseline" in r.tags] == [Candidate(NUMPY, 0)]
    assert all(f"fpga [{label}]" in r.candidate.label for r in fpga_rows for label in [r.candidate.replay.label])
    advice = Advice(p, rows, (0, 1))
    assert "predicted only" in advice.table()
    assert not any(r.predicted_only for r in validation.choose(advice, everything=True))
    loaded = Profile.load(p.save(tmp_path / "p.json"))  # the label survives the file
    assert loaded.to_dict() == p.to_dict()
    assert {e.config.label for e in loaded.replay if e.source == MODELLED} == labels


def test_a_relaxed_fpga_candidate_runs_inline_with_the_pipelines_bookkeeping():
    p = fpga_profile(100_000)
    fpga = next(e for e in p.replay if e.source == MODELLED)
    from hetero_replay.advisor import model

    strict = model.predict(p, Candidate(fpga.config, 0))
    relaxed = model.predict(p, Candidate(fpga.config, 1))
    assert relaxed.worker == "inline"
    assert relaxed.phase_s - strict.phase_s == pytest.approx(30 * US)  # phase_inline - phase


def test_measured_configurations_keep_their_file_layout():
    assert "label" not in NATIVE.to_dict()
    assert ReplayConfig.from_dict(NATIVE.to_dict()) == NATIVE
    modelled = ReplayConfig("fpga", 1, "host", "fpga:0", "cpu", label="X @ 1 MHz")
    assert ReplayConfig.from_dict(modelled.to_dict()) == modelled
    assert modelled.key == "fpga [X @ 1 MHz] | host | tree fpga:0 | learner cpu"


def test_no_measured_native_entry_means_no_model_entry():
    p = make_profile([entry(NUMPY)], reference=NUMPY)
    assert devices.add_modelled(p, tree_times=lambda *a: NATIVE_TREE) == []
    assert p.skipped and all("no measured entry" in s["reason"] for s in p.skipped)
