"""The board driver (``hetero_replay.fpga.board.BoardRmm``) against a fake PYNQ board served by the RMM emulation.

Every response is checked bit for bit against the NumPy reference
(``hetero_replay.fpga.reference.ReferenceRmm``) fed the same words; the fake
board (``fake_board.py``) checks the driver's DMA programming, framing and
cache maintenance on the way.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import PART, emulation_engine
from fake_board import DEC_ERR, INT_ERR, MM2S, S2MM, SLV_ERR, FakeBoard
from pynq.buffer import PynqBuffer

from hetero_replay.fpga import protocol as P
from hetero_replay.fpga.board import (
    BoardError,
    BoardRmm,
    DmaError,
    FramingError,
    describe_dmasr,
)
from hetero_replay.fpga.fixed_point import FRAC_BITS
from hetero_replay.fpga.reference import ReferenceRmm, level_sizes, random_trace


def mixed_commands(rng: np.random.Generator, capacity: int) -> list[np.ndarray]:
    """One of every command, in an order that exercises each (insert, update, sample, get, find, clear)."""
    idx = rng.integers(0, capacity, 50)
    q = rng.integers(1, 2**32, 50, dtype=np.uint64)
    return [
        P.pack_insert(0, capacity // 2),
        P.pack_update(idx, q),
        P.pack_update(np.array([3, 3, 4]), np.array([10, 20, 0])),  # repeats: the last write wins
        P.pack_sample(rng.integers(0, 2**32, 64, dtype=np.uint64)),
        P.pack_get(np.arange(capacity)),
        P.pack_find(np.array([0, 1, 2**20, 2**33], np.uint64)),
        P.pack_insert(capacity - 3, 7),  # wraps around the end
        P.pack_sample(np.array([0, 2**32 - 1], np.uint64)),
        P.pack_clear(),
        P.pack_sample(np.array([5], np.uint64)),  # empty tree: flagged
        P.pack_get(np.array([capacity + 5])),  # past the capacity: flagged
    ]


@pytest.mark.parametrize("capability", ["MEMORY_MAPPED", "REGISTER_RW"])
def test_every_command_matches_the_reference(make_board, capability):
    board = make_board(capability=capability)
    port = BoardRmm(1000, 16)
    ref = ReferenceRmm(1000, 16)
    for cmd in mixed_commands(np.random.default_rng(0), 1000):
        np.testing.assert_array_equal(port.run(cmd), ref.run(cmd))
    # Back-to-back commands in one run: one S2MM packet each, in order.
    batch = np.concatenate(mixed_commands(np.random.default_rng(1), 1000))
    before = board.transfers()
    np.testing.assert_array_equal(port.run(batch), ref.run(batch))
    assert board.transfers()[1] - before[1] == len(mixed_commands(np.random.default_rng(1), 1000))


def test_open_loads_the_overlay_and_sizes_the_rmm(board):
    port = BoardRmm(1000, 16)
    assert (port.capacity, port.fanout, port.device, port.part) == (1000, 16, "fpga:0", PART)
    assert board.downloads == 1
    assert port.read_register(P.REG_CAPACITY) == 1000
    assert port.read_register(P.REG_DEPTH) == len(level_sizes(1000, 16)) == 3
    assert port.read_register(P.REG_FANOUT) == 16
    assert port.read_register(P.REG_FRAC_BITS) == FRAC_BITS
    # The DMA was soft-reset, then both channels set running (run bit only: the driver polls).
    writes = [(a - board.dma_base, v) for op, a, v in board.bus_log if op == "w" and a >= board.dma_base]
    assert writes[0] == (0x00, 0x4)
    assert (0x00, 0x1) in writes and (0x30, 0x1) in writes


def command_ends(words: np.ndarray) -> list[int]:
    """Where each command of ``words`` ends (the spec's framing, restated)."""
    ends, pos = [], 0
    while pos < len(words):
        opcode, n = int(words[pos]) >> 56, int(words[pos]) & P.NONE32
        pos += 1 + (n if opcode in (P.OP_UPDATE, P.OP_SAMPLE, P.OP_GET, P.OP_FIND) else int(opcode == P.OP_INSERT))
        ends.append(pos)
    return ends


def test_random_trace_through_the_board(make_board):
    """400 random commands (bad ones included: their error flags too) give exactly the reference's responses."""
    commands, expected = random_trace(np.random.default_rng(7), 300, 4, 400)
    make_board(fanout=4)
    np.testing.assert_array_equal(BoardRmm(300, 4).run(commands), expected)
    # The same in three runs, cut at command ends.
    ends = command_ends(commands)
    cuts = [0, ends[len(ends) // 3], ends[2 * len(ends) // 3], len(commands)]
    port = BoardRmm(300, 4)
    got = np.concatenate([port.run(commands[a:b]) for a, b in zip(cuts, cuts[1:])])
    np.testing.assert_array_equal(got, expected)


def test_small_dma_length_register_splits_transfers(make_board):
    """With 12-bit DMA lengths (4095 bytes), long commands span several MM2S transfers and lookups are split."""
    board = make_board(length_width=12, fanout=8)
    port = BoardRmm(5000, 8)
    ref = ReferenceRmm(5000, 8)
    assert port.max_transfer_bytes == 4088
    rng = np.random.default_rng(3)
    cmds = [
        P.pack_update(np.arange(5000), rng.integers(1, 2**20, 5000, dtype=np.uint64)),  # 5001 words: 10 MM2S
        P.pack_sample(rng.integers(0, 2**32, 1200, dtype=np.uint64)),  # 1202 response words: 3 packets
        P.pack_get(np.array([1, 2, 9999])),  # an error in a split command is still reported
    ]
    batch = np.concatenate(cmds)
    before = board.transfers()
    np.testing.assert_array_equal(port.run(batch), ref.run(batch))
    mm2s, s2mm = (a - b for a, b in zip(board.transfers(), before))
    assert mm2s >= 10 and s2mm == 1 + 3 + 1
    big_get = P.pack_get(np.concatenate([np.arange(600), [5000], np.arange(600)]))  # error in part 2 of 3
    np.testing.assert_array_equal(port.run(big_get), ref.run(big_get))


def test_a_stream_of_many_commands_does_not_deadlock(make_board):
    """Tiny FIFOs: the RMM stops reading commands until its answers are taken, so both channels must move."""
    board = make_board(in_fifo_words=4, out_packets=1, beats_per_step=3)
    port = BoardRmm(64, 16)
    ref = ReferenceRmm(64, 16)
    rng = np.random.default_rng(5)
    batch = np.concatenate(
        [P.pack_insert(0, 64)] + [P.pack_sample(rng.integers(0, 2**32, 9, dtype=np.uint64)) for _ in range(200)]
    )
    np.testing.assert_array_equal(port.run(batch), ref.run(batch))
    # The model has that backpressure: with S2MM stuck, the RMM stops reading and MM2S cannot finish either.
    board = make_board(in_fifo_words=4, out_packets=1, beats_per_step=3)
    port = BoardRmm(64, 16, timeout=0.05)
    board.stall.add(S2MM)
    with pytest.raises(
        TimeoutError, match=r"MM2S channel .*did not finish sending command words \[0, 32\).*; AXI DMA S2MM"
    ):
        port.run(batch[:32])  # INSERT and 3 SAMPLEs: more than the FIFOs hold


def test_registers(board):
    port = BoardRmm(100, 16)
    ref = ReferenceRmm(100, 16)
    cmd = np.concatenate([P.pack_insert(0, 10), P.pack_update(np.array([4]), np.array([7]))])
    port.run(cmd)
    ref.run(cmd)
    for name, offset in P.REGISTERS.items():
        assert port.read_register(offset) == ref.read_register(offset), name
    # STATUS: sticky error bit, cleared on read.
    port.run(P.pack_get(np.array([100])))
    assert port.read_register(P.REG_STATUS) & 1
    assert port.read_register(P.REG_STATUS) == 0
    # INIT_MAX is what CLEAR leaves in the running max.
    port.write_register(P.REG_INIT_MAX, 12345)
    trailer = P.parse_trailer(port.run(P.pack_clear()))
    assert trailer.max_q == 12345 == port.read_register(P.REG_MAX)
    with pytest.raises(ValueError, match="no RMM register at offset 0x4"):
        port.read_register(0x4)
    with pytest.raises(ValueError, match="not writable"):
        port.write_register(P.REG_FANOUT, 8)
    with pytest.raises(ValueError, match="register value"):
        port.write_register(P.REG_INIT_MAX, 2**32)


def test_capacity_write_resizes_and_clears(board):
    port = BoardRmm(100, 16)
    port.run(P.pack_insert(0, 100))
    port.write_register(P.REG_CAPACITY, 5000)
    assert port.capacity == 5000
    assert port.read_register(P.REG_DEPTH) == len(level_sizes(5000, 16))
    assert P.parse_trailer(port.run(P.pack_get(np.zeros(0)))).total == 0


def test_buffers_grow_and_the_old_ones_are_freed(board):
    port = BoardRmm(20000, 16)
    assert port.buffer_words == (1024, 1024)
    live = len(board.live_buffers())
    ref = ReferenceRmm(20000, 16)
    cmd = np.concatenate([P.pack_insert(0, 20000), P.pack_get(np.arange(0, 20000, 3))])
    np.testing.assert_array_equal(port.run(cmd), ref.run(cmd))
    cmd_words, resp_words = port.buffer_words
    assert (cmd_words, resp_words) == (6670, 6671)  # just what it needs: more than doubling
    assert len(board.live_buffers()) == live  # the two old buffers went back
    port.close()
    assert len(board.live_buffers()) == live - 2


def test_bad_input_is_refused_before_any_dma(board):
    port = BoardRmm(100, 16)
    before = board.transfers(), list(board.bus_log)
    truncated = P.pack_update(np.arange(5), np.arange(5))[:-1]
    with pytest.raises(ValueError, match="truncated command at word 0: UPDATE with count 5"):
        port.run(truncated)
    with pytest.raises(ValueError, match="truncated command at word 2"):
        port.run(np.concatenate([P.pack_insert(0, 1), P.pack_get(np.arange(3))[:2]]))
    with pytest.raises(ValueError, match="1-D"):
        port.run(P.pack_clear().reshape(1, 1))
    with pytest.raises(TypeError, match="uint64"):
        port.run(np.array([1.0]))
    with pytest.raises(ValueError, match="negative"):
        port.run(np.array([-1]))
    with pytest.raises(ValueError, match="not writable"):
        port.write_register(P.REG_TOTAL_LO, 1)
    with pytest.raises(ValueError, match=r"capacity must be in \[1, "):
        port.write_register(P.REG_CAPACITY, 0)
    assert (board.transfers(), board.bus_log) == before
    assert port.run(np.zeros(0, np.uint64)).shape == (0,)


@pytest.mark.parametrize(
    ("channel", "bits", "name"),
    [(S2MM, SLV_ERR, "DMASlvErr"), (MM2S, DEC_ERR, "DMADecErr"), (S2MM, INT_ERR, "DMAIntErr")],
)
def test_a_dma_error_bit_is_a_clear_error_and_reset_recovers(board, channel, bits, name):
    port = BoardRmm(100, 16)
    port.run(P.pack_insert(0, 100))
    board.inject_error(channel, bits)
    with pytest.raises(DmaError, match=rf"AXI DMA {channel} channel .*DMASR = 0x[0-9a-f]{{8}} \(.*{name}"):
        port.run(P.pack_get(np.arange(4)))
    with pytest.raises(BoardError, match=r"state is unknown .* call reset\(\)"):
        port.run(P.pack_get(np.arange(4)))
    port.reset()
    ref = ReferenceRmm(100, 16)
    cmd = np.concatenate([P.pack_get(np.arange(4)), P.pack_insert(0, 3), P.pack_get(np.arange(4))])
    np.testing.assert_array_equal(port.run(cmd), ref.run(cmd))  # every leaf was cleared by reset()


def test_a_stalled_channel_times_out_naming_it(board):
    port = BoardRmm(100, 16, timeout=0.05)
    board.stall.add(S2MM)
    with pytest.raises(TimeoutError, match=r"S2MM channel .*no packet \(TLAST\) for the command at word 0 \(SAMPLE"):
        port.run(P.pack_sample(np.arange(3)))
    try:
        port.run(P.pack_sample(np.arange(3)))
    except BoardError as e:
        assert "TimeoutError" in str(e)
    # The RMM's answer is still queued; reset() drains it, so the next answers line up again.
    board.stall.clear()
    port.reset()
    ref = ReferenceRmm(100, 16)
    cmd = np.concatenate([P.pack_insert(0, 100), P.pack_sample(np.arange(0, 2**32, 2**28, dtype=np.uint64))])
    np.testing.assert_array_equal(port.run(cmd), ref.run(cmd))


def test_timeout_message_shows_the_status_bits(board):
    port = BoardRmm(100, 16, timeout=0.02)
    board.stall.add(MM2S)
    with pytest.raises(TimeoutError) as info:
        port.run(P.pack_get(np.arange(3)))
    msg = str(info.value)
    assert "MM2S channel" in msg and "running, not idle" in msg and "waited 0.02 s" in msg


@pytest.mark.parametrize(
    ("extra", "error", "match"),
    [(-1, FramingError, "ended .TLAST. after 32 bytes; expected 40"), (1, DmaError, "DMAIntErr")],
)
def test_a_packet_of_the_wrong_length_is_refused(board, extra, error, match):
    port = BoardRmm(100, 16)
    board.corrupt_next_packet(extra)
    with pytest.raises(error, match=match):
        port.run(P.pack_get(np.arange(3)))


def test_cache_maintenance_is_needed_and_done(board, monkeypatch):
    """The fake's DDR is not the CPU's view: without flush the kernel reads garbage, without invalidate stale words."""
    port = BoardRmm(100, 16)
    ref = ReferenceRmm(100, 16)
    cmd = np.concatenate([P.pack_insert(0, 100), P.pack_get(np.arange(10))])
    np.testing.assert_array_equal(port.run(cmd), ref.run(cmd))
    with monkeypatch.context() as m:
        m.setattr(PynqBuffer, "invalidate", lambda self: None)
        stale = port.run(P.pack_get(np.arange(20, 30)))
    assert not np.array_equal(stale, ref.run(P.pack_get(np.arange(20, 30))))
    with monkeypatch.context() as m:
        m.setattr(PynqBuffer, "flush", lambda self: None)
        with pytest.raises((BoardError, TimeoutError)):
            BoardRmm(100, 16, timeout=0.05)  # its CLEAR never reaches the DDR the DMA reads


def test_open_refuses_an_overlay_the_host_cannot_drive(make_board):
    board = make_board()
    board.register_overrides[P.REG_MAX_LEAVES] = 1000
    with pytest.raises(ValueError, match=rf"capacity 1001 exceeds the on-chip limit .*part {PART}.*MAX_LEAVES = 1000"):
        BoardRmm(1001, 16)
    assert BoardRmm(1000, 16).max_leaves == 1000
    with pytest.raises(ValueError, match="built with FANOUT = 16; asked for fanout 8"):
        BoardRmm(100, 8)
    board.register_overrides[P.REG_FRAC_BITS] = 20
    with pytest.raises(ValueError, match="FRAC_BITS = 20; this host quantises with 22"):
        BoardRmm(100, 16)
    make_board(scatter_gather=True)
    with pytest.raises(ValueError, match="scatter-gather"):
        BoardRmm(100, 16)
    with pytest.raises(ValueError, match="capacity must be in"):
        BoardRmm(0, 16)
    with pytest.raises(ValueError, match="fanout must be one of"):
        BoardRmm(10, 3)


def test_finding_the_cells_in_the_overlay(make_board, monkeypatch):
    board = make_board(rmm_name="accel/rmm", dma_name="dma")
    assert BoardRmm(10, 16).capacity == 10  # found by their IP types
    board.extra_ip["dma2"] = FakeBoard._ip("xilinx.com:ip:axi_dma:7.1", 0xB000_0000, {})
    with pytest.raises(
        ValueError, match=r"several IP \(dma, dma2\) that looks like the AXI DMA.*HETERO_REPLAY_FPGA_DMA_IP"
    ):
        BoardRmm(10, 16)
    assert BoardRmm(10, 16, dma_ip="dma").capacity == 10
    monkeypatch.setenv("HETERO_REPLAY_FPGA_DMA_IP", "dma")
    assert BoardRmm(10, 16).capacity == 10
    with pytest.raises(ValueError, match=r"no IP named 'rmm_0' for the RMM.*accel/rmm \(hetero-replay.org:hls:rmm_top"):
        BoardRmm(10, 16, rmm_ip="rmm_0")


def test_explicit_base_addresses_load_nothing(board):
    port = BoardRmm(50, 16, rmm_base=board.rmm_base, dma_base=board.dma_base)
    assert board.downloads == 0 and port.part is None
    ref = ReferenceRmm(50, 16)
    cmd = np.concatenate([P.pack_insert(0, 50), P.pack_sample(np.arange(5))])
    np.testing.assert_array_equal(port.run(cmd), ref.run(cmd))


def test_buffers_above_4_gib(make_board):
    make_board(addr_width=64, memory_base=0x8_0000_0000)
    port = BoardRmm(50, 16)
    ref = ReferenceRmm(50, 16)
    cmd = np.concatenate([P.pack_insert(0, 50), P.pack_get(np.arange(50))])
    np.testing.assert_array_equal(port.run(cmd), ref.run(cmd))
    make_board(addr_width=32, memory_base=0x8_0000_0000)
    with pytest.raises(DmaError, match="does not fit the AXI DMA's 32 address bits"):
        BoardRmm(50, 16)


def test_without_a_bitfile(board, monkeypatch):
    monkeypatch.delenv("HETERO_REPLAY_FPGA_BITFILE")
    with pytest.raises(ValueError, match="HETERO_REPLAY_FPGA_BITFILE"):
        BoardRmm(10, 16)


def test_a_missing_pynq_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynq", None)  # "import pynq" raises ImportError
    with pytest.raises(ImportError, match=r"needs pynq: pip install '\.\[fpga\]' in a hetero-replay source checkout"):
        BoardRmm(10, 16, bitfile="rmm.bit")
    # The module itself imports without pynq (the tree registry imports it lazily, but tools may not).
    code = "import sys; sys.modules['pynq'] = None; import hetero_replay.fpga.board"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_port_is_not_picklable_and_closes(board):
    import pickle

    port = BoardRmm(10, 16)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(port)
    with port:
        pass
    with pytest.raises(BoardError, match="closed"):
        port.read_register(P.REG_FANOUT)


def test_describe_dmasr():
    assert describe_dmasr(0x1002) == "0x00001002 (Idle; IOC_Irq)"
    assert "DMADecErr: decode error" in describe_dmasr(0x4041)


def test_the_engine_is_the_emulation():
    """The fake board's RMM is the HLS source compiled with g++, not the reference it is compared with."""
    assert type(emulation_engine(10, 16)).__module__ == "hetero_replay._rmm_emu"


def test_the_register_offsets_are_the_overlays():
    """The offsets the driver reads (protocol.REGISTERS) are where the synthesised top puts them (its pragmas).

    The fake board serves the emulation's register file, which uses protocol's
    offsets; on a board the AXI-Lite map is what Vitis HLS builds from
    ``#pragma HLS INTERFACE s_axilite ... offset=`` in ``hls/src/rmm_top.cpp``.
    """
    import re
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "hls" / "src" / "rmm_top.cpp").read_text()
    pragmas = {
        port: int(offset, 16)
        for port, offset in re.findall(r"s_axilite\s+port\s*=\s*(\w+)\s+offset\s*=\s*(0x[0-9a-fA-F]+)", source)
    }
    # The top's ports and the registers they carry (rmm_top.hpp): `summary` is 128 bits (total, min, max);
    # `errors` is an ap_vld output, whose valid bit (clear on read) Vitis places in the next word.
    hardware = {
        "CAPACITY": pragmas.get("capacity"),
        "FANOUT": pragmas.get("fanout"),
        "MAX_LEAVES": pragmas.get("max_leaves"),
        "TOTAL_LO": pragmas.get("summary"),
        "INIT_MAX": pragmas.get("init_max"),
        "FRAC_BITS": pragmas.get("frac_bits"),
        "DEPTH": pragmas.get("depth"),
    }
    if "summary" in pragmas:
        hardware.update(TOTAL_HI=pragmas["summary"] + 4, MIN=pragmas["summary"] + 8, MAX=pragmas["summary"] + 12)
    if "errors" in pragmas:
        hardware.update(ERRORS=pragmas["errors"], STATUS=pragmas["errors"] + 4)
    wrong = {
        name: (f"{off:#x}", None if hardware.get(name) is None else f"{hardware[name]:#x}")
        for name, off in P.REGISTERS.items()
        if hardware.get(name) != off
    }
    assert not wrong, f"register: (protocol's offset, the synthesised top's offset): {wrong}"
