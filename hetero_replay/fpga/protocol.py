"""The RMM's stream protocol and register map, shared by every port (reference, emulation, board).

Commands and responses are streams of 64-bit words (``uint64`` arrays here).
A command is a header word ``opcode << 56 | n`` (bits 55..32 zero) followed by
its payload; the RMM answers with its response words, then a two-word trailer:

* word A: bits 62..0 the total (the exact ``uint64`` sum of all leaves), bit 63
  the error flag of this command;
* word B: bits 63..32 the smallest positive leaf (``0xFFFFFFFF`` when there is
  none), bits 31..0 the running max leaf.

=========  ======================================  ==========================================
opcode     payload (``n`` words unless noted)      response words
=========  ======================================  ==========================================
UPDATE 1   ``index << 32 | q``                     none
INSERT 2   1 word: first slot ``s`` (``n`` slots)  none (slots ``s..s+n-1`` mod capacity := max)
SAMPLE 3   ``r`` (a uniform 32-bit fraction)       ``index << 32 | q`` per draw
GET 4      ``index``                               ``index << 32 | q``
FIND 5     a mass ``m < total`` (``uint64``)       ``index << 32 | q``
CLEAR 6    none (``n = 0``)                        none
=========  ======================================  ==========================================

NumPy only: this is the layer the board driver and the C
simulation test bench share with the tree.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from hetero_replay.checks import check_int

OP_UPDATE = 1
OP_INSERT = 2
OP_SAMPLE = 3
OP_GET = 4
OP_FIND = 5
OP_CLEAR = 6
#: Every opcode the kernel knows; any other sets the error flag.
OPCODES = (OP_UPDATE, OP_INSERT, OP_SAMPLE, OP_GET, OP_FIND, OP_CLEAR)
OPCODE_NAMES = {
    OP_UPDATE: "UPDATE",
    OP_INSERT: "INSERT",
    OP_SAMPLE: "SAMPLE",
    OP_GET: "GET",
    OP_FIND: "FIND",
    OP_CLEAR: "CLEAR",
}

#: Largest capacity the index field and the kernel's memories allow.
MAX_LEAVES = 2**28
#: Fanouts the kernel is built for.
FANOUTS = (2, 4, 8, 16, 32, 64)
#: Running max after CLEAR unless INIT_MAX is written: priority 1.0.
INIT_MAX = 1 << 22
#: What the min field and a failed lookup's index hold when there is nothing.
NONE32 = 0xFFFFFFFF
#: Words of the trailer every command ends with.
TRAILER_WORDS = 2
#: Bit 63 of trailer word A.
ERROR_BIT = 1 << 63
TOTAL_MASK = ERROR_BIT - 1
#: Largest count a header holds.
MAX_COUNT = 0xFFFFFFFF

# AXI-Lite registers (byte offsets of 32-bit registers), where Vitis HLS puts the top's ports: every scalar
# port takes a data word and a reserved (or ap_vld control) word after it, so ports sit 8 bytes apart and
# TOTAL/MIN/MAX are one 128-bit port (hls/src/rmm_top.cpp pins the same offsets).
REG_CAPACITY = 0x10  # rw: runtime capacity, 1..MAX_LEAVES (write, then CLEAR)
REG_FANOUT = 0x18  # ro
REG_MAX_LEAVES = 0x20  # ro
REG_TOTAL_LO = 0x28  # ro
REG_TOTAL_HI = 0x2C  # ro
REG_MIN = 0x30  # ro
REG_MAX = 0x34  # ro
REG_INIT_MAX = 0x40  # rw, default INIT_MAX
REG_FRAC_BITS = 0x48  # ro
REG_DEPTH = 0x50  # ro: levels of the tree at the current capacity
REG_ERRORS = 0x58  # ro: commands the kernel flagged since reset
REG_STATUS = 0x5C  # ro; bit 0: an error since the last read (the ERRORS port's ap_vld, cleared on read)
REGISTERS = {
    "CAPACITY": REG_CAPACITY,
    "FANOUT": REG_FANOUT,
    "MAX_LEAVES": REG_MAX_LEAVES,
    "TOTAL_LO": REG_TOTAL_LO,
    "TOTAL_HI": REG_TOTAL_HI,
    "MIN": REG_MIN,
    "MAX": REG_MAX,
    "INIT_MAX": REG_INIT_MAX,
    "FRAC_BITS": REG_FRAC_BITS,
    "DEPTH": REG_DEPTH,
    "ERRORS": REG_ERRORS,
    "STATUS": REG_STATUS,
}
WRITABLE_REGISTERS = (REG_CAPACITY, REG_INIT_MAX)


@runtime_checkable
class RmmPort(Protocol):
    """Where an RMM is: something that runs command words and has the register block.

    Implemented by :class:`~hetero_replay.fpga.reference.ReferenceRmm` (NumPy),
    :class:`~hetero_replay.fpga.emulator.EmulatedRmm` (the HLS source compiled
    with g++) and :class:`~hetero_replay.fpga.board.BoardRmm` (a PYNQ board).
    """

    @property
    def capacity(self) -> int: ...

    @property
    def fanout(self) -> int: ...

    @property
    def device(self) -> str:
        """``"fpga:emu"``, ``"fpga:0"``, ..."""
        ...

    def run(self, commands: np.ndarray) -> np.ndarray:
        """Back-to-back command words (``uint64``) in, all response words (``uint64``) out."""
        ...

    def read_register(self, offset: int) -> int: ...

    def write_register(self, offset: int, value: int) -> None: ...


class Trailer(NamedTuple):
    """The two words after each command's responses."""

    total: int
    #: Smallest positive leaf, ``None`` when every leaf is 0.
    min_q: int | None
    max_q: int
    error: bool


# -- what every port checks at its edge (one rule for the reference, the emulation and the board) ----


def check_shape(capacity: Any, fanout: Any, max_leaves: int = MAX_LEAVES) -> tuple[int, int]:
    """``(capacity, fanout)`` of a port as ints: ``TypeError`` (not an integer; a bool) or
    ``ValueError`` (capacity outside ``1 .. max_leaves``, a fanout not in :data:`FANOUTS`) naming it."""
    capacity = check_int(capacity, "capacity", 1, max_leaves)
    if check_int(fanout, "fanout") not in FANOUTS:
        raise ValueError(f"fanout must be one of {FANOUTS}, got {fanout!r}")
    return capacity, int(fanout)


def command_words(commands: Any) -> np.ndarray:
    """Command words as a 1-D ``uint64`` array; ``TypeError`` / ``ValueError`` before anything runs.

    Integers only (a float word would be truncated into another command), none negative.
    """
    arr = np.asarray(commands)
    if arr.ndim != 1:
        raise ValueError(f"commands must be a 1-D array of uint64 words, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"commands must be uint64 words, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        raise ValueError(f"commands must be uint64 words; the word at position {int(np.argmin(arr))} is negative")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def check_register(offset: Any) -> int:
    """``offset`` as one of :data:`REGISTERS`: ``TypeError`` / ``ValueError`` naming it."""
    offset = check_int(offset, "register offset")
    if offset not in REGISTERS.values():
        listing = ", ".join(f"{name} ({off:#x})" for name, off in REGISTERS.items())
        raise ValueError(f"no RMM register at offset {offset:#x}; the registers are {listing}")
    return offset


def check_register_write(offset: Any, value: Any) -> tuple[int, int]:
    """``(offset, value)`` of a register write: a writable register, a 32-bit value (``TypeError`` / ``ValueError``)."""
    offset = check_register(offset)
    if offset not in WRITABLE_REGISTERS:
        raise ValueError(
            f"register {offset:#x} is not writable; CAPACITY ({REG_CAPACITY:#x}) and INIT_MAX ({REG_INIT_MAX:#x}) are"
        )
    return offset, check_int(value, "register value", 0, NONE32)


# -- packing ---------------------------------------------------------------------------------


def header(opcode: int, n: int) -> int:
    """The header word of a command with ``n`` payload entries."""
    if not 0 <= opcode < 256:
        raise ValueError(f"opcode must fit 8 bits, got {opcode}")
    if not 0 <= n <= MAX_COUNT:
        raise ValueError(f"count must be in [0, 2**32), got {n}")
    return (opcode << 56) | n


def _with_header(opcode: int, payload: np.ndarray, n: int | None = None) -> np.ndarray:
    out = np.empty(1 + len(payload), np.uint64)
    out[0] = header(opcode, len(payload) if n is None else n)
    out[1:] = payload
    return out


def pack_update(indices: Any, q: Any) -> np.ndarray:
    """UPDATE: ``leaf[indices[i]] = q[i]`` in order (indices < 2**32, q uint32)."""
    idx = np.asarray(indices).astype(np.uint64)
    qq = np.asarray(q).astype(np.uint64)
    if idx.shape != qq.shape or idx.ndim != 1:
        raise ValueError(f"indices and q must be 1-D of one length, got shapes {idx.shape} and {qq.shape}")
    return _with_header(OP_UPDATE, (idx << np.uint64(32)) | (qq & np.uint64(NONE32)))


def pack_insert(first: int, n: int) -> np.ndarray:
    """INSERT: slots ``first, first + 1, ..., first + n - 1`` (mod capacity) get the running max."""
    return _with_header(OP_INSERT, np.array([first], np.uint64), n)


def pack_sample(r: Any) -> np.ndarray:
    """SAMPLE: one draw per uniform 32-bit fraction ``r`` (mass ``r * total >> 32``)."""
    return _with_header(OP_SAMPLE, np.asarray(r).astype(np.uint64) & np.uint64(NONE32))


def pack_get(indices: Any) -> np.ndarray:
    """GET: the leaves at ``indices``."""
    return _with_header(OP_GET, np.asarray(indices).astype(np.uint64) & np.uint64(NONE32))


def pack_find(mass: Any) -> np.ndarray:
    """FIND: the leaf whose prefix interval holds each integer mass (``uint64``, below the total)."""
    return _with_header(OP_FIND, np.asarray(mass).astype(np.uint64))


def pack_clear() -> np.ndarray:
    """CLEAR: every leaf 0, the running max back to the INIT_MAX register."""
    return np.array([header(OP_CLEAR, 0)], np.uint64)


# -- unpacking -------------------------------------------------------------------------------


def unpack_entries(words: Any) -> tuple[np.ndarray, np.ndarray]:
    """``index << 32 | q`` words as ``(indices int64, q uint32)``."""
    w = np.asarray(words, np.uint64)
    return (w >> np.uint64(32)).astype(np.int64), (w & np.uint64(NONE32)).astype(np.uint32)


def parse_trailer(words: Any) -> Trailer:
    """``(total, min_q, max_q, error)`` of a two-word trailer.

    ``min_q`` is ``None`` when no leaf is positive. The min field's "none",
    ``0xFFFFFFFF``, is also the largest leaf; a positive total tells them apart
    (then some leaf is positive, and every positive leaf is ``0xFFFFFFFF``).
    """
    w = np.asarray(words, np.uint64)
    if w.shape != (TRAILER_WORDS,):
        raise ValueError(f"a trailer is {TRAILER_WORDS} words, got shape {w.shape}")
    a, b = int(w[0]), int(w[1])
    total = a & TOTAL_MASK
    min_q = b >> 32
    return Trailer(total, None if min_q == NONE32 and total == 0 else min_q, b & NONE32, bool(a >> 63))


def split_response(words: Any, n: int) -> tuple[np.ndarray, Trailer]:
    """One command's response: its ``n`` response words and its parsed trailer.

    Raises:
        ValueError: ``words`` is not ``n + 2`` words long.
    """
    w = np.asarray(words, np.uint64)
    if w.shape != (n + TRAILER_WORDS,):
        raise ValueError(f"expected {n} response words and a {TRAILER_WORDS}-word trailer, got {w.shape[0]} words")
    return w[:n], parse_trailer(w[n:])


__all__ = [
    "check_register",
    "check_register_write",
    "check_shape",
    "command_words",
    "ERROR_BIT",
    "FANOUTS",
    "INIT_MAX",
    "MAX_COUNT",
    "MAX_LEAVES",
    "NONE32",
    "OPCODES",
    "OPCODE_NAMES",
    "OP_CLEAR",
    "OP_FIND",
    "OP_GET",
    "OP_INSERT",
    "OP_SAMPLE",
    "OP_UPDATE",
    "REGISTERS",
    "REG_CAPACITY",
    "REG_DEPTH",
    "REG_ERRORS",
    "REG_FANOUT",
    "REG_FRAC_BITS",
    "REG_INIT_MAX",
    "REG_MAX",
    "REG_MAX_LEAVES",
    "REG_MIN",
    "REG_STATUS",
    "REG_TOTAL_HI",
    "REG_TOTAL_LO",
    "RmmPort",
    "TRAILER_WORDS",
    "Trailer",
    "WRITABLE_REGISTERS",
    "header",
    "pack_clear",
    "pack_find",
    "pack_get",
    "pack_insert",
    "pack_sample",
    "pack_update",
    "parse_trailer",
    "split_response",
    "unpack_entries",
]
