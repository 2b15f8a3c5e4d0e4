"""The quantised NumPy reference of the RMM: the same words in, the same words out.

:class:`ReferenceRmm` spells out, in readable NumPy on exact integers, what the
HLS kernel computes (``hls/src/rmm_core.hpp``), independently of the C++. The C
simulation test bench and the emulation backend are checked against it bit for
bit, on traces from :func:`random_trace`; written to a file by::

    python -m hetero_replay.fpga.reference --out trace.bin --ops 100000 --capacity 1000 --fanout 16 --seed 0

The file is little-endian ``uint64`` words: the magic :data:`TRACE_MAGIC`,
capacity, fanout, the number of command words, the number of response words,
the command words, then the expected response words (from a fresh, CLEARed RMM
of that capacity and fanout).

The arithmetic (see ``hetero_replay/fpga/protocol.py`` for the word layout):

* leaves are ``uint32``, every internal node the exact ``uint64`` sum of its
  ``K`` children, recomputed from them (never adjusted by a delta); a second
  tree keeps per node the smallest positive leaf below it (``0xFFFFFFFF``: none);
* a descent for mass ``m < total`` takes at each node the first child ``j``
  with ``c_0 + ... + c_j > m`` and goes on with ``m - (c_0 + ... + c_{j-1})``;
  SAMPLE's mass is ``(r * total) >> 32``, a 96-bit product;
* the running max register is the max of ``INIT_MAX`` and every leaf written
  since the last CLEAR; INSERT writes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hetero_replay.checks import check_int
from hetero_replay.fpga.fixed_point import FRAC_BITS
from hetero_replay.fpga.protocol import (
    ERROR_BIT,
    FANOUTS,
    INIT_MAX,
    MAX_LEAVES,
    NONE32,
    OP_CLEAR,
    OP_FIND,
    OP_GET,
    OP_INSERT,
    OP_SAMPLE,
    OP_UPDATE,
    OPCODE_NAMES,
    REG_CAPACITY,
    REG_DEPTH,
    REG_ERRORS,
    REG_FANOUT,
    REG_FRAC_BITS,
    REG_INIT_MAX,
    REG_MAX,
    REG_MAX_LEAVES,
    REG_MIN,
    REG_STATUS,
    REG_TOTAL_HI,
    REG_TOTAL_LO,
    check_register,
    check_register_write,
    check_shape,
    command_words,
    header,
)
from hetero_replay.storage.files import read_regular_file, replace_file

#: The largest trace file read (the test bench's default trace is a few MB).
MAX_TRACE_BYTES = 1 << 30
#: First word of a trace file ("RMMTRACE" read as little-endian ASCII backwards).
TRACE_MAGIC = 0x45434152544D4D52

_U32 = np.uint64(NONE32)
_SHIFT32 = np.uint64(32)
_PAYLOAD_IS_N = (OP_UPDATE, OP_SAMPLE, OP_GET, OP_FIND)


def level_sizes(capacity: int, fanout: int) -> list[int]:
    """Allocated nodes per level, leaves first, as :class:`~hetero_replay.trees.base.TreeBase` lays them out.

    Each level is padded to whole groups of ``fanout`` and covers the children
    of its parent level's padding; the top level has exactly ``fanout`` nodes.
    """
    k = fanout

    def round_up(n: int) -> int:
        return max(k, -(-n // k) * k)

    sizes = [round_up(capacity)]
    while sizes[-1] != k:
        sizes.append(round_up(sizes[-1] // k))
    return [sizes[level + 1] * k for level in range(len(sizes) - 1)] + [k]


def payload_words(opcode: int, n: int) -> int:
    """Payload words after a header: ``n`` for UPDATE/SAMPLE/GET/FIND, 1 for INSERT, none otherwise."""
    if opcode in _PAYLOAD_IS_N:
        return n
    return 1 if opcode == OP_INSERT else 0


def scale_draws(r: np.ndarray, total: int) -> np.ndarray:
    """SAMPLE's masses ``(r * total) >> 32`` for 32-bit ``r`` and ``total < 2**63``, exact in uint64.

    The 96-bit product is split at bit 32 of the total:
    ``r * (hi * 2**32 + lo) >> 32 = r * hi + (r * lo >> 32)``; with ``r, lo < 2**32``
    and ``hi < 2**31`` no term overflows 64 bits.
    """
    r = r.astype(np.uint64)
    hi, lo = np.uint64(total >> 32), np.uint64(total & NONE32)
    return r * hi + ((r * lo) >> _SHIFT32)


class ReferenceRmm:
    """An RMM in NumPy, driven through the same command words and registers as the hardware.

    Args:
        capacity: leaves in use, ``1..max_leaves`` (the CAPACITY register).
        fanout: children per node, one of :data:`~hetero_replay.fpga.protocol.FANOUTS`.
        max_leaves: the MAX_LEAVES register (the hardware's memory size).

    The state starts CLEARed. It is an :class:`~hetero_replay.fpga.protocol.RmmPort`
    (device ``"fpga:ref"``).
    """

    device = "fpga:ref"

    def __init__(self, capacity: int, fanout: int = 16, max_leaves: int = MAX_LEAVES) -> None:
        self._max_leaves = check_int(max_leaves, "max_leaves", 1, MAX_LEAVES)
        capacity, self._k = check_shape(capacity, fanout, self._max_leaves)
        self._init_max = INIT_MAX
        self._sticky = False
        self._errors = 0
        self._resize(capacity)

    # -- RmmPort ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def fanout(self) -> int:
        return self._k

    @property
    def depth(self) -> int:
        return len(self._sums)

    def run(self, commands: Any) -> np.ndarray:
        """Execute back-to-back commands; all their response words (each command's ending in its trailer).

        Raises:
            ValueError: the words end inside a command (its payload is cut
                short); nothing is executed then.
        """
        words = command_words(commands)
        spans = []  # (opcode, n, first payload word, end) of every command, checked before any runs
        pos = 0
        while pos < len(words):
            opcode, n = int(words[pos]) >> 56, int(words[pos]) & NONE32
            end = pos + 1 + payload_words(opcode, n)
            if end > len(words):
                name = OPCODE_NAMES.get(opcode, f"opcode {opcode}")
                raise ValueError(
                    f"truncated command at word {pos}: {name} with count {n} needs {end - pos - 1} payload words, "
                    f"only {len(words) - pos - 1} follow; nothing was run"
                )
            spans.append((opcode, n, pos + 1, end))
            pos = end
        out = []
        for opcode, n, start, end in spans:
            responses, error = self._execute(opcode, n, words[start:end])
            self._sticky |= error
            self._errors += int(error)
            out += [responses, self._trailer(error)]
        return np.concatenate(out) if out else np.zeros(0, np.uint64)

    def read_register(self, offset: int) -> int:
        """The 32-bit register at byte ``offset`` (reading STATUS clears its sticky error bit)."""
        offset = check_register(offset)
        total, (min_q, max_q) = self._total(), self._min_max()
        if offset == REG_STATUS:
            status, self._sticky = int(self._sticky), False
            return status
        values = {
            REG_CAPACITY: self._capacity,
            REG_FANOUT: self._k,
            REG_MAX_LEAVES: self._max_leaves,
            REG_TOTAL_LO: total & NONE32,
            REG_TOTAL_HI: total >> 32,
            REG_MIN: min_q,
            REG_MAX: max_q,
            REG_INIT_MAX: self._init_max,
            REG_FRAC_BITS: FRAC_BITS,
            REG_DEPTH: self.depth,
            REG_ERRORS: self._errors,
        }
        return values[offset]

    def write_register(self, offset: int, value: int) -> None:
        """Write CAPACITY (re-sizes the tree, which is then CLEARed) or INIT_MAX (used by the next CLEAR)."""
        offset, value = check_register_write(offset, value)
        if offset == REG_CAPACITY:
            self._resize(value)
        else:
            self._init_max = value

    # -- the state ---------------------------------------------------------------------------

    def leaves(self) -> np.ndarray:
        """All ``capacity`` leaves (``uint32``; for tests)."""
        return self._sums[0][: self._capacity].astype(np.uint32)

    def _resize(self, capacity: int) -> None:
        self._capacity = check_int(capacity, "capacity", 1, self._max_leaves)
        sizes = level_sizes(self._capacity, self._k)
        self._sums = [np.zeros(n, np.uint64) for n in sizes]  # [0]: the leaves, held as uint64
        self._mins = [np.full(n, NONE32, np.uint64) for n in sizes]  # [0] unused
        self._max = self._init_max

    def _clear(self) -> None:
        for s, m in zip(self._sums, self._mins):
            s[:] = 0
            m[:] = NONE32
        self._max = self._init_max

    def _total(self) -> int:
        return int(self._sums[-1].sum(dtype=np.uint64))

    def _min_max(self) -> tuple[int, int]:
        top = self._sums[0] if self.depth == 1 else None
        if top is not None:
            positive = top[top > 0]
            min_q = int(positive.min()) if positive.size else NONE32
        else:
            min_q = int(self._mins[-1].min())
        return min_q, self._max

    def _trailer(self, error: bool) -> np.ndarray:
        min_q, max_q = self._min_max()
        return np.array([self._total() | (ERROR_BIT if error else 0), (min_q << 32) | max_q], np.uint64)

    # -- the operations ------------------------------------------------------------------------

    def _execute(self, opcode: int, n: int, payload: np.ndarray) -> tuple[np.ndarray, bool]:
        """One command: its response words and its error flag."""
        none = np.zeros(0, np.uint64)
        if opcode == OP_UPDATE:
            return none, self._update(payload)
        if opcode == OP_INSERT:
            return none, self._insert(int(payload[0]) & NONE32, n)
        if opcode == OP_SAMPLE:
            total = self._total()
            if total == 0:
                return self._failed(n), n > 0
            return self._descend(scale_draws(payload & _U32, total)), False
        if opcode == OP_GET:
            idx = payload & _U32
            inside = idx < np.uint64(self._capacity)
            q = np.zeros(n, np.uint64)
            q[inside] = self._sums[0][idx[inside].astype(np.int64)]
            return (idx << _SHIFT32) | q, not inside.all()
        if opcode == OP_FIND:
            total = self._total()
            ok = payload < np.uint64(total)
            out = np.full(n, NONE32 << 32, np.uint64)
            if ok.any():
                out[ok] = self._descend(payload[ok])
            return out, not ok.all()
        if opcode == OP_CLEAR:
            self._clear()
            return none, False
        return none, True  # unknown opcode: its header only, flagged

    def _failed(self, n: int) -> np.ndarray:
        """``0xFFFFFFFF << 32 | 0`` per entry: a lookup that found nothing."""
        return np.full(n, NONE32 << 32, np.uint64)

    def _update(self, payload: np.ndarray) -> bool:
        idx = payload >> _SHIFT32
        q = payload & _U32
        inside = idx < np.uint64(self._capacity)
        idx, q = idx[inside].astype(np.int64), q[inside]
        if idx.size:
            # Last write wins: each leaf takes the value of its last entry.
            leaves, first_in_reversed = np.unique(idx[::-1], return_index=True)
            self._sums[0][leaves] = q[::-1][first_in_reversed]
            self._max = max(self._max, int(q.max()))
            self._refresh(leaves)
        return not inside.all()

    def _insert(self, first: int, n: int) -> bool:
        if n > self._capacity or first >= self._capacity:
            return True
        if n:
            slots = (first + np.arange(n, dtype=np.int64)) % self._capacity
            self._sums[0][slots] = self._max
            self._refresh(slots)
        return False

    def _refresh(self, leaves: np.ndarray) -> None:
        """Recompute every ancestor of ``leaves`` from its children, level by level."""
        k = self._k
        nodes = np.unique(leaves // k)
        for level in range(1, self.depth):
            children = nodes[:, None] * k + np.arange(k)
            below = self._sums[level - 1][children]
            self._sums[level][nodes] = below.sum(axis=1, dtype=np.uint64)
            if level == 1:
                mins = np.where(below > 0, below, np.uint64(NONE32))
            else:
                mins = self._mins[level - 1][children]
            self._mins[level][nodes] = mins.min(axis=1)
            nodes = np.unique(nodes // k)

    def _descend(self, mass: np.ndarray) -> np.ndarray:
        """``index << 32 | q`` of the leaf holding each mass (every mass below the total)."""
        k = self._k
        node = np.zeros(len(mass), np.int64)
        m = mass.astype(np.uint64, copy=True)
        rows = np.arange(len(mass))
        for level in range(self.depth - 1, -1, -1):
            prefix = np.cumsum(self._sums[level][node[:, None] * k + np.arange(k)], axis=1, dtype=np.uint64)
            j = (prefix <= m[:, None]).sum(axis=1)  # the first child whose prefix sum exceeds m
            m -= np.where(j > 0, prefix[rows, np.maximum(j - 1, 0)], np.uint64(0))
            node = node * k + j
        return (node.astype(np.uint64) << _SHIFT32) | self._sums[0][node]


# -- random traces for the C simulation test bench ---------------------------------------------


def _random_q(rng: np.random.Generator, n: int) -> np.ndarray:
    """Leaf values across the whole 32-bit range: zeros, small, log-uniform, huge and the maximum."""
    kind = rng.integers(0, 6, n)
    q = rng.integers(0, 2**32, n, dtype=np.uint64)  # kind 0: uniform
    q[kind == 1] = 0
    q[kind == 2] = rng.integers(1, 64, int((kind == 2).sum()), dtype=np.uint64)
    q[kind == 3] = np.exp2(rng.uniform(0, 32, int((kind == 3).sum()))).astype(np.uint64).clip(1, NONE32)
    q[kind == 4] = rng.integers(2**31, 2**32, int((kind == 4).sum()), dtype=np.uint64)
    q[kind == 5] = NONE32
    return q


def _cmd(opcode: int, payload: np.ndarray) -> np.ndarray:
    """Header and payload as one uint64 array (a plain concatenate would go through float64)."""
    out = np.empty(1 + len(payload), np.uint64)
    out[0] = header(opcode, len(payload))
    out[1:] = payload
    return out


def _command(rng: np.random.Generator, rmm: ReferenceRmm) -> np.ndarray:
    """One random command (occasionally a deliberately bad one) for the RMM's current state."""
    cap = rmm.capacity
    n = int(rng.integers(0, 65)) if rng.random() < 0.9 else int(rng.integers(65, 513))
    roll = rng.random()
    if roll < 0.32:  # UPDATE, duplicates and shared parents included
        if rng.random() < 0.5:
            idx = rng.integers(0, cap, n, dtype=np.uint64)
        else:  # a narrow window: many entries under the same parents, repeats
            lo = int(rng.integers(0, cap))
            idx = (lo + rng.integers(0, 3 * rmm.fanout, n, dtype=np.uint64)) % np.uint64(cap)
        if n and rng.random() < 0.03:  # a bad index, past the capacity
            idx[int(rng.integers(0, n))] = cap + int(rng.integers(0, 1000))
        return _cmd(OP_UPDATE, (idx << _SHIFT32) | _random_q(rng, n))
    if roll < 0.45:  # INSERT, often wrapping around the end
        n = min(n, cap)
        first = int(rng.integers(max(0, cap - max(n, 1)), cap)) if rng.random() < 0.5 else int(rng.integers(0, cap))
        if rng.random() < 0.03:
            first, n = (cap + int(rng.integers(0, 10)), n) if rng.random() < 0.5 else (first, cap + 1)
        return np.array([header(OP_INSERT, n), first], np.uint64)
    if roll < 0.70:
        r = rng.integers(0, 2**32, n, dtype=np.uint64)
        if n:
            r[rng.random(n) < 0.05] = NONE32  # the largest draw: mass just below the total
            r[rng.random(n) < 0.05] = 0
        return _cmd(OP_SAMPLE, r)
    if roll < 0.82:
        total = rmm._total()
        m = rng.integers(0, max(total, 1), n, dtype=np.uint64)
        if n and rng.random() < 0.05:  # at or past the total: flagged
            m[int(rng.integers(0, n))] = total + int(rng.integers(0, 3))
        if n and total and rng.random() < 0.2:
            m[int(rng.integers(0, n))] = total - 1
        return _cmd(OP_FIND, m)
    if roll < 0.95:
        idx = rng.integers(0, cap, n, dtype=np.uint64)
        if n and rng.random() < 0.03:
            idx[int(rng.integers(0, n))] = cap + int(rng.integers(0, 1000))
        return _cmd(OP_GET, idx)
    if roll < 0.97:
        return np.array([header(OP_CLEAR, 0)], np.uint64)
    if roll < 0.985:  # an unknown opcode: the header alone
        return np.array([header(int(rng.choice([0, 7, 9, 255])), int(rng.integers(0, 5)))], np.uint64)
    return np.array([header(OP_GET, 0)], np.uint64)  # an empty command still answers its trailer


def random_trace(rng: np.random.Generator, capacity: int, fanout: int, n_ops: int) -> tuple[np.ndarray, np.ndarray]:
    """``n_ops`` random commands and the responses a fresh RMM of ``capacity`` and ``fanout`` gives.

    The mix: UPDATE (duplicates, entries sharing parents), INSERT (wrapping
    around the end), SAMPLE (incl. draws 0 and ``2**32 - 1``), FIND (incl.
    ``total - 1``), GET, a rare CLEAR, and a few deliberately bad commands
    (an index past the capacity, INSERT of more than the capacity or from a
    slot past it, FIND at or past the total, unknown opcodes), whose error
    flags are part of the expected responses. Leaf values span ``0..2**32 - 1``,
    so the ``uint64`` sums and the 96-bit SAMPLE product are exercised.

    Returns:
        ``(commands, responses)``, both ``uint64``.
    """
    rmm = ReferenceRmm(capacity, fanout)
    commands, responses = [], []
    for _ in range(n_ops):
        cmd = _command(rng, rmm)
        commands.append(cmd)
        responses.append(rmm.run(cmd))
    if not commands:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    return np.concatenate(commands), np.concatenate(responses)


def write_trace(path: str | Path, capacity: int, fanout: int, commands: np.ndarray, responses: np.ndarray) -> None:
    """Write a trace file (the layout in this module's docstring), never through a link planted at ``path``."""
    head = np.array([TRACE_MAGIC, capacity, fanout, len(commands), len(responses)], np.uint64)
    replace_file(path, np.concatenate([head, commands, responses]).astype("<u8").tobytes(), "--out")


def read_trace(path: str | Path) -> tuple[int, int, np.ndarray, np.ndarray]:
    """``(capacity, fanout, commands, responses)`` of a trace file (``ValueError`` if it is not one)."""
    data = read_regular_file(path, MAX_TRACE_BYTES, "trace")
    if len(data) % 8:
        raise ValueError(f"{path} is not an RMM trace (its {len(data)} bytes are not whole 64-bit words)")
    words = np.frombuffer(data, "<u8").astype(np.uint64)
    if len(words) < 5 or int(words[0]) != TRACE_MAGIC:
        raise ValueError(f"{path} is not an RMM trace (no magic {TRACE_MAGIC:#x})")
    capacity, fanout, n_cmd, n_resp = (int(w) for w in words[1:5])
    if len(words) != 5 + n_cmd + n_resp:
        raise ValueError(f"{path}: header says {n_cmd} + {n_resp} words, the file holds {len(words) - 5}")
    return capacity, fanout, words[5 : 5 + n_cmd], words[5 + n_cmd :]


def main(argv: list[str] | None = None) -> int:
    """The command line: write a random trace for the C simulation test bench."""
    parser = argparse.ArgumentParser(
        prog="python -m hetero_replay.fpga.reference",
        description="Write a random RMM trace (commands and the expected responses) for the C-sim test bench.",
    )
    parser.add_argument("--out", required=True, type=Path, help="trace file to write")
    parser.add_argument("--ops", type=int, default=100_000, help="number of commands (default 100000)")
    parser.add_argument("--capacity", type=int, default=1000, help="leaves (default 1000)")
    parser.add_argument("--fanout", type=int, default=16, choices=FANOUTS, help="children per node (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    if not 1 <= args.capacity <= MAX_LEAVES:
        parser.error(f"--capacity must be in [1, 2**28], got {args.capacity}")
    if args.ops < 0:
        parser.error(f"--ops must be >= 0, got {args.ops}")
    commands, responses = random_trace(np.random.default_rng(args.seed), args.capacity, args.fanout, args.ops)
    write_trace(args.out, args.capacity, args.fanout, commands, responses)
    print(f"{args.out}: {args.ops} commands, {len(commands)} command words, {len(responses)} response words")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["TRACE_MAGIC", "ReferenceRmm", "level_sizes", "random_trace", "read_trace", "scale_draws", "write_trace"]
