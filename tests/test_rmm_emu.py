"""The emulation module hetero_replay._rmm_emu: the RMM's HLS source compiled with g++.

Checked against :class:`~hetero_replay.fpga.reference.ReferenceRmm`, the
independent NumPy reference of the same arithmetic: every response word bit for
bit over random traces (the mix the C-simulation test bench runs), the
registers, a truncated command refused with nothing changed, and the
C-simulation counters the cycle model is checked against.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

rmm_emu = pytest.importorskip("hetero_replay._rmm_emu", reason="the FPGA emulation module is not built")

from hetero_replay.fpga.protocol import (
    INIT_MAX,
    MAX_LEAVES,
    NONE32,
    REG_CAPACITY,
    REG_DEPTH,
    REG_FANOUT,
    REG_INIT_MAX,
    REG_STATUS,
    REG_TOTAL_HI,
    REG_TOTAL_LO,
    REGISTERS,
    header,
    pack_clear,
    pack_find,
    pack_get,
    pack_insert,
    pack_sample,
    pack_update,
    split_response,
)
from hetero_replay.fpga.reference import ReferenceRmm, random_trace

#: (capacity, fanout): one leaf, exactly K, K + 1, not multiples of K, two to five levels, every fanout.
CONFIGS = [
    (1, 2),
    (1, 16),
    (16, 16),
    (17, 16),
    (1000, 16),
    (70000, 16),
    (37, 2),
    (300, 4),
    (100, 8),
    (999, 32),
    (5000, 64),
]


def _registers(port: Any) -> dict[str, int]:
    """Every register but STATUS (reading it clears it)."""
    return {name: port.read_register(off) for name, off in REGISTERS.items() if off != REG_STATUS}


@pytest.mark.parametrize(("capacity", "fanout"), CONFIGS)
def test_bit_exact_against_the_reference(capacity: int, fanout: int) -> None:
    rng = np.random.default_rng(capacity * 131 + fanout)
    commands, expected = random_trace(rng, capacity, fanout, 400)
    emu = rmm_emu.Rmm(capacity, fanout)
    got = emu.run(commands)
    assert got.dtype == np.uint64
    mismatch = np.flatnonzero(got != expected) if got.shape == expected.shape else [min(len(got), len(expected))]
    assert got.shape == expected.shape and len(mismatch) == 0, (
        f"first mismatch at response word {mismatch[0]}: lengths {len(got)} / {len(expected)}"
    )
    ref = ReferenceRmm(capacity, fanout)
    ref.run(commands)
    assert _registers(emu) == _registers(ref)
    assert emu.read_register(REG_STATUS) == ref.read_register(REG_STATUS)


def test_commands_one_at_a_time_equal_back_to_back() -> None:
    commands, expected = random_trace(np.random.default_rng(7), 300, 4, 200)
    emu = rmm_emu.Rmm(300, 4)
    pieces, pos = [], 0
    while pos < len(commands):  # split at the headers the way the framing does
        opcode, n = int(commands[pos]) >> 56, int(commands[pos]) & NONE32
        end = pos + 1 + (n if opcode in (1, 3, 4, 5) else 1 if opcode == 2 else 0)
        pieces.append(emu.run(commands[pos:end]))
        pos = end
    np.testing.assert_array_equal(np.concatenate(pieces), expected)


def test_sums_past_32_bits_and_the_largest_draws() -> None:
    """Every leaf at 2**32 - 1: totals past 2**32 (the 96-bit SAMPLE product), draws 0 and 2**32 - 1."""
    emu, ref = rmm_emu.Rmm(5000, 16), ReferenceRmm(5000, 16)
    words = np.concatenate(
        [
            pack_update(np.arange(5000), np.full(5000, NONE32)),
            pack_sample(np.array([0, 1, 2**31, NONE32 - 1, NONE32])),
            pack_find(np.array([0, 5000 * NONE32 - 1, 5000 * NONE32])),  # the last one is past the total: flagged
        ]
    )
    got = emu.run(words)
    np.testing.assert_array_equal(got, ref.run(words))
    samples, trailer = split_response(got[2:9], 5)
    assert trailer.total == 5000 * NONE32 and not trailer.error
    assert (samples >> np.uint64(32)).tolist() == [0, 0, 2500, 4999, 4999]


def test_truncated_command_is_refused_and_changes_nothing() -> None:
    emu = rmm_emu.Rmm(100, 16)
    emu.run(np.concatenate([pack_update(np.arange(100), np.arange(1, 101) * 7), pack_sample(np.arange(8))]))
    before_regs, before_leaves, before_counters = _registers(emu), emu.run(pack_get(np.arange(100))), emu.counters()
    good = pack_update(np.arange(10), np.zeros(10))  # would zero ten leaves if it ran
    for tail in (
        pack_sample(np.arange(5))[:4],  # SAMPLE of 5 with 3 draws
        pack_insert(0, 3)[:1],  # INSERT without its slot word
        pack_update([1, 2], [3, 4])[:2],
        np.array([header(5, 2**32 - 1)], np.uint64),  # FIND announcing 2**32 - 1 masses
    ):
        with pytest.raises(ValueError, match="truncated command at word 11"):
            emu.run(np.concatenate([good, tail]))
    assert _registers(emu) == before_regs
    assert emu.read_register(REG_STATUS) == 0
    counters = emu.counters()
    np.testing.assert_array_equal(emu.run(pack_get(np.arange(100))), before_leaves)
    assert counters == before_counters  # the refused runs did not touch the kernel


def test_empty_input_runs_nothing() -> None:
    emu = rmm_emu.Rmm(10, 2)
    out = emu.run(np.zeros(0, np.uint64))
    assert out.dtype == np.uint64 and out.shape == (0,)
    assert emu.counters()["commands"] == 0


def test_registers_follow_the_reference() -> None:
    emu, ref = rmm_emu.Rmm(1000, 16), ReferenceRmm(1000, 16)
    assert emu.read_register(REG_FANOUT) == 16
    assert emu.read_register(REGISTERS["MAX_LEAVES"]) == MAX_LEAVES
    assert emu.read_register(REGISTERS["FRAC_BITS"]) == 22
    assert emu.read_register(REG_INIT_MAX) == INIT_MAX
    assert emu.read_register(REG_DEPTH) == emu.depth == ref.depth == 3
    assert emu.read_register(REGISTERS["MIN"]) == NONE32
    steps = [
        pack_update([3, 999, 5], [2**31 + 5, 17, 0]),
        pack_get([1000]),  # past the capacity: flagged, STATUS sticks
        pack_insert(998, 4),
    ]
    for words in steps:
        np.testing.assert_array_equal(emu.run(words), ref.run(words))
        assert _registers(emu) == _registers(ref)
    total = emu.read_register(REG_TOTAL_LO) | emu.read_register(REG_TOTAL_HI) << 32
    assert total == 5 * (2**31 + 5)  # leaf 3 and the four inserted at the max (999's 17 overwritten)
    assert emu.read_register(REG_STATUS) == 1  # the GET past the capacity
    assert emu.read_register(REG_STATUS) == 0  # cleared by the read

    for port in (emu, ref):  # INIT_MAX takes effect at the next CLEAR
        port.write_register(REG_INIT_MAX, 12345)
    np.testing.assert_array_equal(emu.run(pack_clear()), ref.run(pack_clear()))
    assert emu.read_register(REGISTERS["MAX"]) == 12345

    for port in (emu, ref):  # CAPACITY re-sizes and CLEARs
        port.write_register(REG_CAPACITY, 5000)
    assert emu.capacity == 5000 and emu.depth == 4 and _registers(emu) == _registers(ref)
    words = np.concatenate([pack_insert(4990, 20), pack_sample(np.arange(0, 2**32, 2**26))])
    np.testing.assert_array_equal(emu.run(words), ref.run(words))
    emu.write_register(REG_CAPACITY, 5000)  # the same capacity: still CLEARed
    assert emu.read_register(REG_TOTAL_LO) == 0


@pytest.mark.parametrize(
    ("offset", "value", "match"),
    [
        (REG_FANOUT, 4, "not writable"),
        (REG_STATUS, 0, "not writable"),
        (0x4, 0, "no register"),
        (0x1000000, 0, "no register"),
        (-8, 0, "no register"),
        (REG_CAPACITY, 0, "capacity must be in"),
        (REG_CAPACITY, MAX_LEAVES + 1, "capacity must be in"),
        (REG_INIT_MAX, 2**32, "32 bits"),
        (REG_INIT_MAX, -1, "32 bits"),
    ],
)
def test_bad_register_writes_are_refused(offset: int, value: int, match: str) -> None:
    emu = rmm_emu.Rmm(50, 4)
    emu.run(pack_update([1], [9]))
    before = _registers(emu)
    with pytest.raises(ValueError, match=match):
        emu.write_register(offset, value)
    assert _registers(emu) == before


def test_bad_register_read_is_refused() -> None:
    with pytest.raises(ValueError, match="no register at offset 0x24"):
        rmm_emu.Rmm(50, 4).read_register(0x24)


@pytest.mark.parametrize(
    ("capacity", "fanout", "match"),
    [
        (0, 16, "capacity"),
        (MAX_LEAVES + 1, 16, "capacity"),
        (-1, 16, "capacity"),
        (10, 3, "fanout"),
        (10, 128, "fanout"),
    ],
)
def test_bad_construction_is_refused(capacity: int, fanout: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rmm_emu.Rmm(capacity, fanout)


def test_counters_count_every_stage() -> None:
    emu = rmm_emu.Rmm(5000, 16)
    counters = emu.counters()
    max_depth = counters["max_depth"]
    levels = [f"fire:level{lv}" for lv in range(max_depth)]
    for key in ("cycles", "commands", "fire:read_draws", "fire:scale", "fire:write_results", "fire:update_leaf"):
        assert key in counters
    assert all(key in counters for key in levels)
    assert counters["fifo_depth"] == rmm_emu.FIFO_DEPTH

    emu.reset_counters()
    assert not any(v for k, v in emu.counters().items() if k not in ("max_depth", "fifo_depth"))
    batch = 256
    emu.run(np.concatenate([pack_update(np.arange(5000), np.ones(5000)), pack_sample(np.arange(batch))]))
    c = emu.counters()
    assert c["commands"] == 2 and c["fire:update_leaf"] == 5000
    assert c["fire:update_refresh"] == 5000 * (emu.depth - 1)  # each level refreshes every touched parent
    for key in ["fire:read_draws", "fire:scale", "fire:write_results", *levels]:
        assert c[key] == batch, key
    fifos = {k: v for k, v in c.items() if k.startswith("fifo_max:")}
    assert len(fifos) == max_depth + 2 and all(1 <= v <= rmm_emu.FIFO_DEPTH for v in fifos.values()), fifos
    # One draw per cycle once the pipeline is full: B draws take B + a constant.
    emu.reset_counters()
    emu.run(pack_sample(np.arange(batch)))
    short = emu.counters()["cycles:sample"]
    emu.reset_counters()
    emu.run(pack_sample(np.arange(4 * batch)))
    assert emu.counters()["cycles:sample"] - short == 3 * batch


def test_threads_share_nothing_and_agree() -> None:
    commands, expected = random_trace(np.random.default_rng(3), 2000, 8, 300)
    results: list[np.ndarray | None] = [None] * 4

    def work(i: int) -> None:
        results[i] = rmm_emu.Rmm(2000, 8).run(commands)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_one_rmm_from_several_threads_runs_one_stream_at_a_time() -> None:
    """Concurrent runs on one RMM serialise: the final tree is one of the orders' results, never a mix."""
    emu = rmm_emu.Rmm(64, 4)
    a = pack_update(np.arange(64), np.full(64, 5))
    b = pack_update(np.arange(64), np.full(64, 9))
    threads = [threading.Thread(target=emu.run, args=(w,)) for w in (a, b) * 8]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q = emu.run(pack_get(np.arange(64)))[:64] & np.uint64(NONE32)
    assert len(set(q.tolist())) == 1
