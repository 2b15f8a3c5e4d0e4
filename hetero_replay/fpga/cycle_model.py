r"""The RMM's cycle model: cycles and seconds per command, and how many leaves each FPGA part holds.

The advisor ranks an FPGA it cannot measure with this model (a *predicted
only* device, :mod:`hetero_replay.advisor.devices`), and the board driver
refuses a capacity above :func:`max_leaves` of its part. Everything here is
derived from the design in ``hls/src/rmm_core.hpp`` (every loop pipelined at
II = 1) and checked, count for count and cycle for cycle, against the
C-simulation's counters (``hetero_replay._rmm_emu``; ``tests/test_fpga_cycle_model.py``).

**Cycles per command** (``B`` entries, capacity ``N``, fanout ``K``, tree depth
``D`` = levels at ``N``, ``M`` = the build's compile-time ``MAX_DEPTH``, the
depth at its ``MAX_LEAVES``; ``[x]`` is 0 when the loop has no iteration)::

    every command  = HEADER + <its body> + TRAILER               TRAILER = 3 + log2 K
    SAMPLE / FIND  = B + FILL - 1                                FILL = READ_DRAW + SCALE + M * LEVEL + WRITE_RESULT
                                                                 LEVEL = MEMORY_READ + log2 K + ENCODE
    UPDATE         = per chunk of c <= 1024 entries (v of them in range):
                     c + LEAF_WRITE + (D - 1) * [v + REFRESH]    REFRESH = MEMORY_READ + log2 K + REFRESH_WRITE
    INSERT         = [n + LEAF_WRITE] + sum over levels l = 1..D-1 and over the one or two
                     (wrapped) leaf ranges r of (P_l(r) + REFRESH), P_l(r) = parents of r at level l
    GET            = [n + GET]
    CLEAR          = [rows + CLEAR]                               rows = leaf slots / K

SAMPLE is a DATAFLOW chain: read the draws, scale them (``m = r * total >> 32``),
one stage per level from the top down (``M`` of them: levels at or above the
run-time depth pass their items through, with the same pipeline depth), write
the results; each stage takes one item per cycle, so the first draw leaves
after ``FILL`` cycles and the last ``B - 1`` cycles later, as long as the
response stream takes a word per cycle (the DMA's S2MM side does). ``M`` is
``tree_depth(max_leaves(part))`` for a board build (:func:`part_max_depth`)
and ``tree_depth(2**28)`` for the emulation (:func:`emulation_max_depth`): 7
at K = 16, so a pass-through level costs ``LEVEL`` cycles of fill, once per
command, nothing per draw. UPDATE writes the
leaves, then refreshes every touched parent level by level, one level after the
other (a level reads what the one below wrote). The latencies are the
design's intent at a 4 ns clock (the constants below say why each), the same
numbers the C-simulation's ``cycles`` counter adds (``Latency`` in
``rmm_core.hpp``); they are not a synthesis report.

**Seconds per call**, as a host sees them::

    t = cycles / clock + bytes moved / link bandwidth + per-call overhead

``bytes`` are the command and response words (8 bytes each); the link term is
counted serially, which over-states a call by at most ``bytes / bandwidth``
where the DMA overlaps the kernel. Clocks, bandwidths and overheads per board
are in :data:`PARTS`; they are estimates from the boards' documentation and
the driver's structure, not measurements (no board was at hand).

**Capacity**: each level is its own memory, cyclically partitioned into ``K``
banks (``N/K`` rows of the leaf level per bank): 32-bit leaves; per internal
node a 64-bit sum and a 32-bit minimum, two arrays. Each array goes to
distributed RAM (at most :data:`LUTRAM_MAX_ROWS` rows a bank), UltraRAM or
block RAM, each bank rounded up to whole blocks (:func:`plan_memory`), within
:data:`USABLE_FRACTION` of the part's blocks less :data:`RESERVED_BRAM36`.
:func:`max_leaves` is the largest ``MAX_LEAVES`` a build for the part holds;
asking for more raises :class:`FpgaCapacityError`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from hetero_replay.checks import check_int
from hetero_replay.fpga.protocol import (
    FANOUTS,
    MAX_LEAVES,
    OP_CLEAR,
    OP_FIND,
    OP_GET,
    OP_INSERT,
    OP_SAMPLE,
    OP_UPDATE,
    TRAILER_WORDS,
)
from hetero_replay.fpga.reference import level_sizes

# -- pipeline latencies (cycles at the 4 ns target clock; II = 1 everywhere) -------------------------

#: Read the command header from the stream and decode opcode and count (one stream read, one compare).
HEADER_LATENCY = 2
#: SAMPLE's first stage: one stream read into the draw FIFO.
READ_DRAW_LATENCY = 1
#: ``m = (r * total) >> 32``: a 32 x 64-bit product is a cascade of DSP48E2 slices (27 x 18 each); at
#: 250 MHz the tool pipelines it in about 4 stages.
SCALE_LATENCY = 4
#: Read one node's K children, one per bank: block RAM with its output register is 2 cycles; UltraRAM
#: needs 2-3 at 250+ MHz (its cascade pipeline register). The design budgets 2; one cycle more per
#: level would add ``M`` cycles to a SAMPLE (under 0.1 us), nothing per draw.
MEMORY_READ_LATENCY = 2
#: Compare the K prefix sums with the mass and priority-encode the first one above it (one cycle),
#: after ``log2 K`` stages of the prefix adder tree (64-bit adds fit a 4 ns cycle in carry chains).
ENCODE_LATENCY = 1
#: SAMPLE's last stage: pack index | q into a response word.
WRITE_RESULT_LATENCY = 1
#: UPDATE / INSERT leaf loop: decode the entry and write its bank.
LEAF_WRITE_LATENCY = 2
#: A parent refresh writes the reduced sum and minimum back (after the read and ``log2 K`` adder/min stages).
REFRESH_WRITE_LATENCY = 1
#: GET: read the index word, then the leaf bank (``MEMORY_READ_LATENCY``).
GET_LATENCY = 1 + MEMORY_READ_LATENCY
#: CLEAR: one row of every level zeroed per cycle; one cycle to leave the loop.
CLEAR_LATENCY = 1
#: Per command, the trailer: read the top level's K nodes (registers: one cycle), reduce them in
#: ``log2 K`` adder / min stages into total and minimum, write the two trailer words.
TRAILER_READ_LATENCY = 1
#: UPDATE entries buffered before their parents are refreshed (``RMM_UPDATE_CHUNK``).
UPDATE_CHUNK = 1024


def log2_fanout(fanout: int) -> int:
    """``log2 K``: the adder-tree stages of one node's K children."""
    return _check_fanout(fanout).bit_length() - 1


def level_latency(fanout: int) -> int:
    """One SAMPLE level stage: bank read + prefix adder tree + encoder (``3 + log2 K``)."""
    return MEMORY_READ_LATENCY + log2_fanout(fanout) + ENCODE_LATENCY


def refresh_latency(fanout: int) -> int:
    """One parent refresh: K-bank read + adder / min tree + write (``3 + log2 K``)."""
    return MEMORY_READ_LATENCY + log2_fanout(fanout) + REFRESH_WRITE_LATENCY


def trailer_latency(fanout: int) -> int:
    """The trailer: top-level read + adder / min tree + two words (``3 + log2 K``)."""
    return TRAILER_READ_LATENCY + log2_fanout(fanout) + TRAILER_WORDS


def fill_latency(fanout: int, max_depth: int) -> int:
    """SAMPLE's pipeline depth: read_draws + scale + ``max_depth`` level stages + write_results."""
    return READ_DRAW_LATENCY + SCALE_LATENCY + max_depth * level_latency(fanout) + WRITE_RESULT_LATENCY


# -- tree geometry -------------------------------------------------------------------------------------


def tree_depth(capacity: int, fanout: int) -> int:
    """Levels of a tree of ``capacity`` leaves (1 for up to ``fanout`` leaves)."""
    return len(level_sizes(_check_capacity_arg(capacity), _check_fanout(fanout)))


def emulation_max_depth(fanout: int) -> int:
    """``MAX_DEPTH`` of the emulation module: it is built for the protocol's largest capacity, 2**28 leaves."""
    return tree_depth(MAX_LEAVES, fanout)


# -- counts per command (the C-simulation's counters) -------------------------------------------------

#: Counter names of the C simulation this model predicts (``counters()`` of ``hetero_replay._rmm_emu``).
STAGES = (
    "fire:header",
    "fire:read_draws",
    "fire:scale",
    "fire:write_results",
    "fire:update_leaf",
    "fire:update_refresh",
    "fire:insert_leaf",
    "fire:insert_refresh",
    "fire:get",
    "fire:clear_rows",
    "fire:trailer",
)
_OP_NAMES = {OP_UPDATE: "update", OP_INSERT: "insert", OP_SAMPLE: "sample", OP_GET: "get", OP_FIND: "find",
             OP_CLEAR: "clear"}  # fmt: skip


def empty_counts(max_depth: int) -> dict[str, int]:
    """Every counter at zero: commands, words, cycles (in all and per opcode), stage firings per stage and level."""
    counts = {"commands": 0, "words_in": 0, "words_out": 0, "cycles": 0}
    counts.update({f"cycles:{name}": 0 for name in _OP_NAMES.values()})
    counts.update({stage: 0 for stage in STAGES})
    counts.update({f"fire:level{level}": 0 for level in range(max_depth)})
    return counts


def sample_counts(n: int, capacity: int, fanout: int = 16, max_depth: int | None = None) -> dict[str, int]:
    """SAMPLE (or FIND) of ``n`` entries: every dataflow stage fires ``n`` times, every one of ``max_depth`` levels too.

    ``max_depth`` is the build's compile-time depth (default: the depth at
    ``capacity``, a build sized for exactly this capacity); the levels above the
    run-time depth pass the items through.
    """
    depth = _max_depth(capacity, fanout, max_depth)
    counts = _command(depth, fanout)
    for stage in ("fire:read_draws", "fire:scale", "fire:write_results"):
        counts[stage] += n
    for level in range(depth):
        counts[f"fire:level{level}"] += n
    counts["words_in"] += n
    counts["words_out"] += n
    _body(counts, OP_SAMPLE, n + fill_latency(fanout, depth) - 1 if n else 0)
    return counts


def update_counts(indices: Any, capacity: int, fanout: int = 16, max_depth: int | None = None) -> dict[str, int]:
    """UPDATE of the leaves ``indices`` (an int for that many entries, all in range, or the indices themselves).

    Per chunk of :data:`UPDATE_CHUNK` entries: the leaf loop fires once per
    entry, then each level 1..D-1 refreshes once per entry in range (the
    parents are not deduplicated: a refresh recomputes from the children, so a
    repeat is harmless and keeps II = 1 without a hazard check).
    """
    depth = _max_depth(capacity, fanout, max_depth)
    valid = _in_range(indices, capacity)
    levels = tree_depth(capacity, fanout)
    counts = _command(depth, fanout)
    cycles = 0
    for start in range(0, len(valid), UPDATE_CHUNK):
        chunk = valid[start : start + UPDATE_CHUNK]
        ok = int(np.count_nonzero(chunk))
        counts["fire:update_leaf"] += len(chunk)
        counts["words_in"] += len(chunk)
        cycles += len(chunk) + LEAF_WRITE_LATENCY
        if ok:
            counts["fire:update_refresh"] += (levels - 1) * ok
            cycles += (levels - 1) * (ok + refresh_latency(fanout))
    _body(counts, OP_UPDATE, cycles)
    return counts


def insert_counts(
    first: int | None, n: int, capacity: int, fanout: int = 16, max_depth: int | None = None
) -> dict[str, int]:
    """INSERT of ``n`` leaves from slot ``first`` (wrapping at ``capacity``): leaf loop, then each level's parents.

    ``first=None`` is the worst placement of ``n`` leaves that do not wrap
    (every level's range straddles one more parent than ``n`` needs), what the
    advisor assumes when it does not know where the ring stands. A refused
    INSERT (``n > capacity`` or ``first >= capacity``) costs header and trailer only.
    """
    depth = _max_depth(capacity, fanout, max_depth)
    counts = _command(depth, fanout)
    counts["words_in"] += 1  # the payload word: the first slot
    if n > capacity or (first is not None and not 0 <= first < capacity):
        _body(counts, OP_INSERT, 0)
        return counts
    counts["fire:insert_leaf"] += n
    cycles = n + LEAF_WRITE_LATENCY if n else 0
    if n:
        ranges: list[tuple[int | None, int]]
        if first is None:
            ranges = [(None, n)]
        else:
            end = first + n
            ranges = [(first, min(end, capacity))]
            if end > capacity:  # wrapped: the second range starts at slot 0
                ranges.append((0, end - capacity))
        levels = level_sizes(capacity, fanout)
        for level in range(1, len(levels)):
            span = fanout**level
            for lo, hi in ranges:
                if lo is None:  # worst case: a range of n leaves starting at the last leaf of a parent
                    parents = min(math.ceil((hi - 1) / span) + 1, levels[level])
                else:
                    parents = (hi - 1) // span - lo // span + 1
                counts["fire:insert_refresh"] += parents
                cycles += parents + refresh_latency(fanout)
    _body(counts, OP_INSERT, cycles)
    return counts


def get_counts(n: int, capacity: int, fanout: int = 16, max_depth: int | None = None) -> dict[str, int]:
    """GET of ``n`` leaves: one read loop."""
    depth = _max_depth(capacity, fanout, max_depth)
    counts = _command(depth, fanout)
    counts["fire:get"] += n
    counts["words_in"] += n
    counts["words_out"] += n
    _body(counts, OP_GET, n + GET_LATENCY if n else 0)
    return counts


def clear_counts(capacity: int, fanout: int = 16, max_depth: int | None = None) -> dict[str, int]:
    """CLEAR: one loop over the rows of the leaf level (K slots of every level per row)."""
    depth = _max_depth(capacity, fanout, max_depth)
    rows = level_sizes(capacity, fanout)[0] // fanout
    counts = _command(depth, fanout)
    counts["fire:clear_rows"] += rows
    _body(counts, OP_CLEAR, rows + CLEAR_LATENCY)
    return counts


def command_counts(words: Any, capacity: int, fanout: int = 16, max_depth: int | None = None) -> dict[str, int]:
    """The counters a stream of back-to-back commands leaves in the C simulation (firings, words, cycles).

    What the counts depend on is in the words alone (counts, indices against
    ``capacity``, the INSERT slot), not in the tree's values, so the whole
    stream is predicted without simulating the tree. Not predicted: the
    ``errors`` counter of SAMPLE / FIND (it depends on the total) and the FIFO
    occupancies.

    Raises:
        ValueError: a command whose payload is cut off.
    """
    stream = np.ascontiguousarray(words, dtype=np.uint64).reshape(-1)
    depth = _max_depth(capacity, fanout, max_depth)
    total = empty_counts(depth)
    pos = 0
    while pos < len(stream):
        header = int(stream[pos])
        opcode, n = header >> 56, header & 0xFFFFFFFF
        payload = n if opcode in (OP_UPDATE, OP_SAMPLE, OP_GET, OP_FIND) else 1 if opcode == OP_INSERT else 0
        if pos + 1 + payload > len(stream):
            raise ValueError(
                f"words: the command at word {pos} (opcode {opcode}, n = {n}) needs {payload} payload words, "
                f"{len(stream) - pos - 1} follow"
            )
        body = stream[pos + 1 : pos + 1 + payload]
        if opcode == OP_UPDATE:
            one = update_counts(body >> np.uint64(32), capacity, fanout, depth)
        elif opcode == OP_INSERT:
            one = insert_counts(int(body[0]) & 0xFFFFFFFF, n, capacity, fanout, depth)
        elif opcode in (OP_SAMPLE, OP_FIND):
            one = sample_counts(n, capacity, fanout, depth)
            if opcode == OP_FIND:
                one["cycles:find"], one["cycles:sample"] = one["cycles:sample"], 0
        elif opcode == OP_GET:
            one = get_counts(n, capacity, fanout, depth)
        elif opcode == OP_CLEAR:
            one = clear_counts(capacity, fanout, depth)
        else:  # an unknown opcode: its header only, then the trailer
            one = _command(depth, fanout)
            _body(one, opcode, 0)
        for key, value in one.items():
            total[key] = total.get(key, 0) + value
        pos += 1 + payload
    return total


def _command(max_depth: int, fanout: int) -> dict[str, int]:
    """One command's header and trailer: firings, words and cycles (the body adds its own)."""
    counts = empty_counts(max_depth)
    counts["commands"] = counts["fire:header"] = counts["fire:trailer"] = 1
    counts["words_in"] = 1
    counts["words_out"] = TRAILER_WORDS
    counts["cycles"] = HEADER_LATENCY + trailer_latency(fanout)
    return counts


def _body(counts: dict[str, int], opcode: int, cycles: int) -> None:
    """Add the body's cycles; file the command's cycles under its opcode (as the C simulation does)."""
    counts["cycles"] += cycles
    name = _OP_NAMES.get(opcode, "unknown7" if opcode == 7 else "unknown")  # the C simulation's names
    counts[f"cycles:{name}"] = counts.get(f"cycles:{name}", 0) + counts["cycles"]


def _in_range(indices: Any, capacity: int) -> np.ndarray:
    if isinstance(indices, (int, np.integer)):
        return np.ones(int(indices), dtype=bool)
    return np.asarray(indices, dtype=np.uint64).reshape(-1) < np.uint64(capacity)


def _max_depth(capacity: int, fanout: int, max_depth: int | None) -> int:
    depth = tree_depth(capacity, fanout)
    if max_depth is None:
        return depth
    if max_depth < depth:
        raise ValueError(f"max_depth {max_depth} is below the depth {depth} of {capacity} leaves at fanout {fanout}")
    return int(max_depth)


# -- cycles per call, for the advisor ---------------------------------------------------------------


def sample_cycles(batch: int, capacity: int, fanout: int = 16, max_depth: int | None = None) -> int:
    """Cycles of one SAMPLE of ``batch`` draws: ``HEADER + batch + FILL - 1 + TRAILER``."""
    return sample_counts(batch, capacity, fanout, max_depth)["cycles"]


def update_cycles(batch: int, capacity: int, fanout: int = 16, max_depth: int | None = None) -> int:
    """Cycles of one UPDATE of ``batch`` leaves (all in range)."""
    return update_counts(batch, capacity, fanout, max_depth)["cycles"]


def insert_cycles(rows: int, capacity: int, fanout: int = 16, first: int | None = None) -> int:
    """Cycles of one INSERT of ``rows`` leaves from ``first`` (``None``: the worst placement that does not wrap)."""
    return insert_counts(first, rows, capacity, fanout)["cycles"]


def get_cycles(n: int, capacity: int, fanout: int = 16) -> int:
    """Cycles of one GET of ``n`` leaves."""
    return get_counts(n, capacity, fanout)["cycles"]


# -- parts, their memory and their links ----------------------------------------------------------------

#: Share of a part's block RAM and UltraRAM the tree may take: Vivado's placement and timing closure at
#: 250 MHz get hard above roughly 80% block-memory use, and the platform shell needs some (rule of thumb).
USABLE_FRACTION = 0.8
#: BRAM36 the rest of the design takes: the UPDATE chunk buffer (1024 x 32 bit: 1) and the AXI DMA's
#: data FIFOs (a few for a 64-bit stream; estimate).
RESERVED_BRAM36 = 4
#: Banks this shallow go to distributed RAM (LUTs, not counted here: at most ``K * 96 * rows / 64``
#: LUT6 per level), as the HLS tool does for small arrays.
LUTRAM_MAX_ROWS = 64
#: BRAM36 aspect ratios (depth, width): 36 Kbit, the simple-dual-port 72-bit mode included.
BRAM36_SHAPES = ((32768, 1), (16384, 2), (8192, 4), (4096, 9), (2048, 18), (1024, 36), (512, 72))
#: UltraRAM: one fixed 4096 x 72-bit shape (cascaded for depth).
URAM_SHAPE = (4096, 72)
#: Bits per leaf, per internal node's sum and per internal node's minimum.
LEAF_BITS, SUM_BITS, MIN_BITS = 32, 64, 32


@dataclasses.dataclass(frozen=True)
class Part:
    """An FPGA part on a board, the RMM's clock there, and how a host reaches it.

    Attributes:
        key: short name (``"kv260"``).
        board: the board (``"Kria KV260"``).
        device: the part number prefix (``"xck26"``), what an overlay's ``.hwh`` names.
        bram36: block RAM tiles of 36 Kbit.
        uram: UltraRAM blocks of 288 Kbit.
        clock_hz: the RMM's clock (the HLS target).
        link: how the host reaches the RMM, and where the numbers come from.
        link_bytes_per_s: that link's bandwidth for the command and response words.
        call_overhead_s: fixed host cost per command (DMA set-up, cache maintenance, the driver's Python).
        note: what is not built for this part (empty when the board path exists).
    """

    key: str
    board: str
    device: str
    bram36: int
    uram: int
    clock_hz: float
    link: str
    link_bytes_per_s: float
    call_overhead_s: float
    note: str = ""

    @property
    def label(self) -> str:
        """``"KV260 xck26 @ 250 MHz"``: board, part and clock, as the advisor names it (short: tables show it)."""
        return f"{self.key.upper()} {self.device} @ {self.clock_hz / 1e6:g} MHz"


#: Zynq UltraScale+ MPSoC boards: the AXI DMA reads commands from and writes responses to the PS DDR
#: through a 128-bit HP port at the 250 MHz PL clock (16 B x 250 MHz = 4 GB/s peak; the stream side,
#: 64 bit per cycle, is in the kernel's cycles). Per command, pynq's Python driver on the board's
#: Cortex-A53 programs both DMA channels and polls them (~10 AXI-Lite accesses through pynq.MMIO,
#: ~2-3 us each), flushes the command buffer and invalidates the response buffer (a syscall each,
#: ~5-10 us): ~50 us. Estimates from the PG021 register sequence and pynq's structure, not measured.
ZYNQ_LINK = "AXI DMA on a 128-bit HP port @ 250 MHz (4 GB/s peak); pynq driver on the Cortex-A53 (estimate)"
ZYNQ_LINK_BYTES_PER_S = 16 * 250e6
ZYNQ_CALL_OVERHEAD_S = 50e-6
#: Alveo cards over PCIe Gen3 x16 (15.75 GB/s raw; XRT's DMA test reports ~11 GB/s host to card) with
#: XRT from the host: a kernel start and wait (~10-20 us) and two buffer syncs (~5-10 us each): ~40 us.
ALVEO_LINK = "PCIe Gen3 x16 via XRT (~11 GB/s, ~40 us per kernel call; estimate)"
ALVEO_LINK_BYTES_PER_S = 11e9
ALVEO_CALL_OVERHEAD_S = 40e-6

#: The parts the model knows: block counts from the Zynq UltraScale+ (DS891) and Alveo U250 (DS962)
#: data sheets.
PARTS: dict[str, Part] = {
    "kv260": Part("kv260", "Kria KV260", "xck26", 144, 64, 250e6, ZYNQ_LINK, ZYNQ_LINK_BYTES_PER_S,
                  ZYNQ_CALL_OVERHEAD_S),
    "zcu104": Part("zcu104", "ZCU104", "xczu7ev", 312, 96, 250e6, ZYNQ_LINK, ZYNQ_LINK_BYTES_PER_S,
                   ZYNQ_CALL_OVERHEAD_S),
    "u250": Part("u250", "Alveo U250", "xcu250", 2688, 1280, 300e6, ALVEO_LINK, ALVEO_LINK_BYTES_PER_S,
                 ALVEO_CALL_OVERHEAD_S,
                 note="board path not built: PYNQ >= 3.1 dropped Alveo (an XRT host and a data-mover kernel "
                      "would be needed); modelled at Vitis' default 300 MHz kernel clock with the same cycles"),
}  # fmt: skip


class FpgaCapacityError(ValueError):
    """A tree larger than an FPGA part's on-chip memory holds (the message names the part, N and the limit)."""


def part_named(part: Part | str) -> Part:
    """The :class:`Part` for a key (``"kv260"``), a board name or a part number (``"xck26-sfvc784-2LV-c"``).

    Raises:
        ValueError: no known part matches (the message lists them).
    """
    if isinstance(part, Part):
        return part
    name = str(part).strip().lower()
    for known in PARTS.values():
        if name in (known.key, known.board.lower()) or name.startswith(known.device):
            return known
    choices = ", ".join(f"{p.key} ({p.board}, {p.device})" for p in PARTS.values())
    raise ValueError(f"part must be one of {choices}; got {part!r}")


@dataclasses.dataclass(frozen=True)
class ArrayPlan:
    """Where one level array lives: ``banks`` banks of ``rows`` x ``bits``, in ``memory`` using ``blocks`` blocks."""

    name: str
    level: int
    bits: int
    banks: int
    rows: int
    memory: str  # "lutram", "uram" or "bram"
    blocks: int


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """A tree's arrays placed on a part: per array, and the BRAM36 / URAM totals against the budget."""

    capacity: int
    fanout: int
    arrays: tuple[ArrayPlan, ...]
    bram36: int
    uram: int
    bram36_budget: int
    uram_budget: int

    @property
    def fits(self) -> bool:
        return self.bram36 <= self.bram36_budget and self.uram <= self.uram_budget


def bram36_blocks(rows: int, bits: int) -> int:
    """BRAM36 tiles for one bank of ``rows`` x ``bits``: the cheapest aspect ratio, whole tiles."""
    return min(math.ceil(bits / width) * math.ceil(rows / depth) for depth, width in BRAM36_SHAPES)


def uram_blocks(rows: int, bits: int) -> int:
    """UltraRAM blocks for one bank of ``rows`` x ``bits`` (4096 x 72 each, whole blocks)."""
    depth, width = URAM_SHAPE
    return math.ceil(bits / width) * math.ceil(rows / depth)


def budget(part: Part | str) -> tuple[int, int]:
    """``(BRAM36, URAM)`` the tree may use: :data:`USABLE_FRACTION` of each, less :data:`RESERVED_BRAM36`."""
    p = part_named(part)
    return int(p.bram36 * USABLE_FRACTION) - RESERVED_BRAM36, int(p.uram * USABLE_FRACTION)


def plan_memory(part: Part | str, capacity: int, fanout: int = 16) -> MemoryPlan:
    """Place the level arrays of a ``capacity``-leaf build on ``part``.

    Arrays whose banks have at most :data:`LUTRAM_MAX_ROWS` rows go to
    distributed RAM; the others, greedily in order of the BRAM36 each would
    save per UltraRAM block (a 64-bit bank fills a 72-bit URAM row, a 32-bit
    one half of it), to UltraRAM while it lasts, then to block RAM. A bank is
    never split between the two (one array, one ``BIND_STORAGE``).
    """
    capacity, k = _check_capacity_arg(capacity), _check_fanout(fanout)
    bram_budget, uram_budget = budget(part)
    sizes = level_sizes(capacity, k)
    wanted = [("leaf", 0, LEAF_BITS, sizes[0] // k)]
    for level in range(1, len(sizes)):
        rows = sizes[level] // k
        wanted += [("sum", level, SUM_BITS, rows), ("min", level, MIN_BITS, rows)]
    placed: list[ArrayPlan] = []
    big = []
    for name, level, bits, rows in wanted:
        if rows <= LUTRAM_MAX_ROWS:
            placed.append(ArrayPlan(name, level, bits, k, rows, "lutram", 0))
        else:
            big.append((name, level, bits, rows, k * bram36_blocks(rows, bits), k * uram_blocks(rows, bits)))
    big.sort(key=lambda a: (-a[4] / a[5], -a[4]))
    uram_left, bram_used, uram_used = uram_budget, 0, 0
    for name, level, bits, rows, bram, uram in big:
        if uram <= uram_left:
            placed.append(ArrayPlan(name, level, bits, k, rows, "uram", uram))
            uram_left -= uram
            uram_used += uram
        else:
            placed.append(ArrayPlan(name, level, bits, k, rows, "bram", bram))
            bram_used += bram
    placed.sort(key=lambda a: (a.level, a.name != "sum"))
    return MemoryPlan(capacity, k, tuple(placed), bram_used, uram_used, bram_budget, uram_budget)


@functools.cache
def _max_leaves(part: Part, fanout: int) -> int:
    lo, hi = 0, MAX_LEAVES  # plan_memory(lo) fits (0: nothing), find the largest that does
    if plan_memory(part, hi, fanout).fits:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if plan_memory(part, mid, fanout).fits:
            lo = mid
        else:
            hi = mid
    return lo


def max_leaves(part: Part | str, fanout: int = 16) -> int:
    """The largest ``MAX_LEAVES`` a build of the RMM with this fanout holds on ``part`` (at most 2**28).

    The board driver refuses a capacity above it; so does :func:`check_capacity`.
    """
    return _max_leaves(part_named(part), _check_fanout(fanout))


def check_capacity(part: Part | str, capacity: int, fanout: int = 16) -> int:
    """``capacity`` if a tree of that many leaves fits ``part``'s on-chip memory.

    Raises:
        FpgaCapacityError: it does not (names the part, the capacity and the limit).
    """
    p = part_named(part)
    capacity = _check_capacity_arg(capacity)
    limit = max_leaves(p, fanout)
    if capacity > limit:
        bram, uram = budget(p)
        raise FpgaCapacityError(
            f"capacity {capacity:,} does not fit the {p.board} ({p.device}): its on-chip memory "
            f"({p.bram36} BRAM36 + {p.uram} URAM; the tree may use {bram} + {uram}) holds at most "
            f"{limit:,} leaves at fanout {fanout} (32-bit leaves, 64-bit sums and 32-bit minima per node, "
            "banked by the fanout); use a smaller buffer or a larger part"
        )
    return capacity


def part_max_depth(part: Part | str, fanout: int = 16) -> int:
    """``MAX_DEPTH`` of a build for ``part``: the depth at its :func:`max_leaves`."""
    return tree_depth(max_leaves(part, fanout), fanout)


# -- seconds per call ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CallTime:
    """One command as the host sees it: kernel, link and fixed overhead, in seconds, and its words."""

    cycles: int
    words: int
    kernel_s: float
    link_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.kernel_s + self.link_s + self.overhead_s


#: Operations :func:`call_time` models.
OPERATIONS = ("sample", "update", "insert", "get")


def call_time(part: Part | str, op: str, n: int, capacity: int, fanout: int = 16) -> CallTime:
    """Seconds of one ``op`` command of ``n`` entries on a build for ``part`` holding ``capacity`` leaves.

    ``t = cycles / clock + 8 * words / link bandwidth + per-call overhead``
    (the module docstring); an INSERT takes the worst placement that does not wrap.

    Raises:
        FpgaCapacityError: ``capacity`` does not fit ``part``.
        ValueError: an unknown ``op`` or a negative ``n``.
    """
    p = part_named(part)
    check_capacity(p, capacity, fanout)
    check_int(n, "n", low=0)
    depth = part_max_depth(p, fanout)
    if op == "sample":
        counts = sample_counts(n, capacity, fanout, depth)
    elif op == "update":
        counts = update_counts(n, capacity, fanout, depth)
    elif op == "insert":
        counts = insert_counts(None, n, capacity, fanout, depth)
    elif op == "get":
        counts = get_counts(n, capacity, fanout, depth)
    else:
        raise ValueError(f"op must be one of {OPERATIONS}, got {op!r}")
    words = counts["words_in"] + counts["words_out"]
    return CallTime(
        cycles=counts["cycles"],
        words=words,
        kernel_s=counts["cycles"] / p.clock_hz,
        link_s=8 * words / p.link_bytes_per_s,
        overhead_s=p.call_overhead_s,
    )


def replay_times(
    part: Part | str, batch_size: int, capacity: int, insert_rows: int = 1, fanout: int = 16
) -> dict[str, CallTime]:
    """The tree's share of the replay primitives on ``part``: ``sample`` / ``update`` of ``batch_size``, ``insert``.

    ``insert`` writes ``insert_rows`` new leaves (one collect step's rows).

    Raises:
        FpgaCapacityError: ``capacity`` does not fit ``part``.
    """
    return {
        "sample": call_time(part, "sample", batch_size, capacity, fanout),
        "update": call_time(part, "update", batch_size, capacity, fanout),
        "insert": call_time(part, "insert", insert_rows, capacity, fanout),
    }


def samples_per_s(part: Part | str, batch_size: int, capacity: int, fanout: int = 16) -> tuple[float, float]:
    """Predicted draws per second of back-to-back SAMPLE calls: ``(kernel only, end to end)``."""
    t = call_time(part, "sample", batch_size, capacity, fanout)
    return batch_size / t.kernel_s, batch_size / t.total_s


def parts(keys: Iterable[str] | None = None) -> list[Part]:
    """The known parts (or those named), in :data:`PARTS` order."""
    return list(PARTS.values()) if keys is None else [part_named(k) for k in keys]


def _check_fanout(fanout: Any) -> int:
    """``fanout`` as an int in :data:`FANOUTS`."""
    if check_int(fanout, "fanout") not in FANOUTS:
        raise ValueError(f"fanout must be one of {FANOUTS}, got {fanout!r}")
    return int(fanout)


def _check_capacity_arg(capacity: Any) -> int:
    """``capacity`` as an int the protocol's index field holds: ``[1, MAX_LEAVES]``."""
    return check_int(capacity, "capacity", 1, MAX_LEAVES)


__all__ = [
    "PARTS",
    "STAGES",
    "CallTime",
    "FpgaCapacityError",
    "MemoryPlan",
    "Part",
    "call_time",
    "check_capacity",
    "clear_counts",
    "command_counts",
    "emulation_max_depth",
    "fill_latency",
    "get_counts",
    "insert_counts",
    "insert_cycles",
    "level_latency",
    "max_leaves",
    "part_max_depth",
    "part_named",
    "parts",
    "plan_memory",
    "refresh_latency",
    "replay_times",
    "sample_counts",
    "sample_cycles",
    "samples_per_s",
    "trailer_latency",
    "tree_depth",
    "update_counts",
    "update_cycles",
]
