"""Every RMM port refuses a bad argument by the same rule, before anything runs (issue 25).

The reference (NumPy) and the emulation (the HLS source in C++) share the board
driver's checks (:mod:`hetero_replay.fpga.protocol`): a float or bool capacity
was truncated by the emulation (``EmulatedRmm(2.7)`` held 2 leaves), float
command words were cast into other commands, and out-of-range register offsets
escaped as pybind's ``TypeError``. Trace files for the C-sim test bench are
read and written as every other file of the library.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hetero_replay.fpga import protocol as P
from hetero_replay.fpga.emulator import EmulatedRmm, emulation_unavailable
from hetero_replay.fpga.reference import ReferenceRmm, random_trace, read_trace, write_trace

PORTS = [
    ReferenceRmm,
    pytest.param(EmulatedRmm, marks=pytest.mark.skipif(bool(emulation_unavailable()), reason="no _rmm_emu")),
]


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize(
    ("capacity", "fanout", "error", "match"),
    [
        (2.7, 16, TypeError, "capacity must be an integer"),
        (True, 16, TypeError, "capacity must be an integer"),
        (np.float64(8), 16, TypeError, "capacity must be an integer"),
        (0, 16, ValueError, "capacity must be in"),
        (2**70, 16, ValueError, "capacity must be in"),
        (8, 3, ValueError, "fanout must be one of"),
        (8, 16.0, TypeError, "fanout must be an integer"),
    ],
)
def test_a_port_refuses_a_bad_shape_naming_it(port, capacity, fanout, error, match):
    with pytest.raises(error, match=match):
        port(capacity, fanout)


@pytest.mark.parametrize("port", PORTS)
def test_a_port_refuses_bad_words_and_registers_and_is_unchanged(port):
    rmm = port(8, 4)
    rmm.run(P.pack_insert(0, 8))
    before = rmm.read_register(P.REG_TOTAL_LO)
    for words, error in (
        (np.array([float(P.header(P.OP_CLEAR, 0))]), TypeError),  # a float word: truncated into a command
        ([-1], ValueError),
        (np.zeros((2, 2), np.uint64), ValueError),
    ):
        with pytest.raises(error, match="commands must be"):
            rmm.run(words)
    for offset in (2**70, -4, 0x4, 1.5, True):
        with pytest.raises((TypeError, ValueError), match="register offset|no RMM register"):
            rmm.read_register(offset)
    with pytest.raises(ValueError, match="not writable"):
        rmm.write_register(P.REG_FANOUT, 8)
    for value in (2**32, -1, 2.0):
        with pytest.raises((TypeError, ValueError), match="register value"):
            rmm.write_register(P.REG_INIT_MAX, value)
    assert rmm.read_register(P.REG_TOTAL_LO) == before and rmm.read_register(P.REG_CAPACITY) == 8


def test_a_trace_is_never_written_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"the victim's own bytes\n")
    (tmp_path / "trace.bin").symlink_to(victim)
    commands, responses = random_trace(np.random.default_rng(0), 16, 4, 20)
    write_trace(tmp_path / "trace.bin", 16, 4, commands, responses)
    assert victim.read_bytes() == b"the victim's own bytes\n"
    capacity, fanout, got_commands, got_responses = read_trace(tmp_path / "trace.bin")
    assert (capacity, fanout) == (16, 4)
    np.testing.assert_array_equal(got_commands, commands)
    np.testing.assert_array_equal(got_responses, responses)


def test_a_trace_that_is_a_fifo_or_ragged_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_trace(fifo)
    (tmp_path / "ragged").write_bytes(b"\x00" * 41)
    with pytest.raises(ValueError, match="not an RMM trace"):
        read_trace(tmp_path / "ragged")
