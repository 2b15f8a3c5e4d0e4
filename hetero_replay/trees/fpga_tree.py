"""The sum tree on the FPGA Replay Management Module (RMM), over any port: emulation, board or reference.

:class:`FpgaSumTree` keeps no tree of its own: every operation becomes the
RMM's command words (``hetero_replay/fpga/protocol.py``), and the total, the
smallest positive leaf and the running max come back in each command's
trailer. The host does what the kernel must not spend logic on: it checks
every argument before a word is sent (so a refused call changes nothing, and
the kernel's error flag is never raised in normal use), turns priorities into
fixed-point leaves (:mod:`hetero_replay.fpga.fixed_point`), draws the
uniforms, and computes the IS weights.

Numerics differ from the float backends by design:

* a leaf holds ``q = round(p * 2**22)`` (``FRAC_BITS = 22``); ``get`` and
  ``leaves`` return ``q / 2**22`` in the tree's dtype. Priorities outside
  ``{0} U [2**-22, (2**32 - 1) / 2**22]`` are refused;
* every sum is exact (``uint64``), so ``total``, ``find`` and ``sample`` depend
  on the leaves only, never on the order of updates, and nothing drifts;
* ``P(i) = q_i / total_q`` is the quantised priority's exact share, within
  ``2**-23 / p_i + 2**-23 / p_min`` (relative) of the float64 formula, and
  the IS weight ``(q_min / q_i) ** beta`` (float64, returned as float32) within
  ``beta * (2**-23 / p_min + 2**-23 / p_i)`` plus float32 rounding
  (``benchmarks/results/fpga-error.md`` has the measured worst cases).

A sample draws 32-bit uniforms ``r`` on the host; the RMM takes the mass
``(r * total) >> 32``. Stratified draw ``j`` of ``B`` uses
``r_j = (j * 2**32 + u_j) // B``, so it lands in the ``j``-th slice of the mass.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hetero_replay import _native
from hetero_replay.checks import check_int
from hetero_replay.fpga import protocol as P
from hetero_replay.fpga.emulator import EMULATED_DEVICE
from hetero_replay.fpga.fixed_point import (
    FRAC_BITS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    SCALE,
    dequantize,
    describe_range,
    largest_priority,
    quantize,
)
from hetero_replay.registry import install_hint
from hetero_replay.trees.base import TreeBase, as_1d
from hetero_replay.trees.numpy_tree import as_indices

#: Environment variable naming a board's overlay (.bit); when set, the default device is the board ``"fpga:0"``.
BITFILE_ENV = "HETERO_REPLAY_FPGA_BITFILE"
#: The NumPy reference's device name (for tests).
REFERENCE_DEVICE = "fpga:ref"
#: Entries per command: bounds the host buffers of one command (a board's DMA buffers).
CHUNK = 1 << 20


def default_device() -> str:
    """``"fpga:0"`` when :data:`BITFILE_ENV` names an overlay, else the emulation ``"fpga:emu"``."""
    return "fpga:0" if os.environ.get(BITFILE_ENV) else EMULATED_DEVICE


def resolve_device(device: Any) -> str:
    """A device name of the fpga tree: ``"fpga:emu"``, ``"fpga:ref"`` or ``"fpga:N"`` (``"fpga"`` is ``"fpga:0"``).

    ``None`` is :func:`default_device`.

    Raises:
        ValueError: anything else.
    """
    if device is None:
        return default_device()
    name = str(device).strip().lower()
    kind, colon, index = name.partition(":")
    if kind == "fpga" and (not colon or index.isdigit()):
        return f"fpga:{int(index or 0)}"
    if name in (EMULATED_DEVICE, REFERENCE_DEVICE):
        return name
    raise ValueError(
        f"device of the fpga tree must be 'fpga:emu' (the emulation), 'fpga' / 'fpga:N' (a board) "
        f"or 'fpga:ref' (the NumPy reference), got {device!r}"
    )


def open_port(device: str, capacity: int, fanout: int) -> P.RmmPort:
    """A port to the RMM on ``device`` (a name from :func:`resolve_device`), sized ``capacity`` x ``fanout``."""
    if device == EMULATED_DEVICE:
        from hetero_replay.fpga.emulator import EmulatedRmm

        return EmulatedRmm(capacity, fanout)
    if device == REFERENCE_DEVICE:
        from hetero_replay.fpga.reference import ReferenceRmm

        return ReferenceRmm(capacity, fanout)
    bitfile = os.environ.get(BITFILE_ENV)
    if not bitfile:
        raise ImportError(
            f"device {device!r} is an FPGA board, and {BITFILE_ENV} does not name its overlay (.bit); "
            f"set it on a PYNQ board, or use the emulation, device {EMULATED_DEVICE!r}"
        )
    try:
        from hetero_replay.fpga.board import BoardRmm
    except ImportError as e:
        raise ImportError(
            f"device {device!r} needs the PYNQ board driver ({install_hint('fpga')}, on the board): {e}"
        ) from e
    return BoardRmm(capacity, fanout, bitfile=bitfile, index=int(device.partition(":")[2]))


class FpgaSumTree(TreeBase):
    """The SumTree protocol on an RMM, with fixed-point leaves and exact integer sums.

    Args:
        capacity: leaves, at most ``2**28`` (and the RMM's MAX_LEAVES register).
        fanout: children per node; must be the RMM's (a board's is fixed when it is built).
        dtype: ``"float32"`` or ``"float64"``: what ``get``, ``leaves`` and ``min``
            return, and what priorities are rounded to before they are quantised.
        device: ``"fpga:emu"`` (the emulation), ``"fpga:N"`` (a board; needs
            ``HETERO_REPLAY_FPGA_BITFILE``), ``"fpga:ref"`` (the NumPy reference)
            or ``None`` (:func:`default_device`). Ignored when ``port`` is given.
        port: an :class:`~hetero_replay.fpga.protocol.RmmPort` to use instead.

    The RMM is CLEARed at construction. Raises ``ValueError`` for arguments
    the RMM cannot take, ``ImportError`` when the device's port is missing.
    """

    def __init__(
        self, capacity: int, fanout: int = 16, dtype: Any = "float32", device: Any = None, port: Any = None
    ) -> None:
        super().__init__(capacity, fanout, dtype)
        if self._capacity > P.MAX_LEAVES:
            raise ValueError(f"capacity must be at most 2**28 for the fpga tree (its index field), got {capacity}")
        # The largest priority of this dtype that a leaf holds: float32 rounds MAX_PRIORITY up to 1024.
        self._max_leaf = largest_priority(self._dtype)
        if port is None:
            port = open_port(resolve_device(device), self._capacity, self._k)
        self._port = port
        self._connect()
        self._command(P.pack_clear())

    # -- the port ----------------------------------------------------------------------------

    @property
    def device(self) -> str:
        """Where the RMM is: ``"fpga:emu"``, ``"fpga:0"``, ..."""
        return str(self._port.device)

    @property
    def port(self) -> P.RmmPort:
        """The RMM port (its registers; the emulation's counters)."""
        return self._port

    def _connect(self) -> None:
        """Check the port is an RMM for this tree, and size it."""
        port = self._port
        if int(port.fanout) != self._k:
            raise ValueError(f"the RMM on {port.device!r} has fanout {port.fanout}, the tree asks for {self._k}")
        frac = port.read_register(P.REG_FRAC_BITS)
        if frac != FRAC_BITS:
            raise ValueError(f"the RMM on {port.device!r} has {frac} fraction bits; this host speaks {FRAC_BITS}")
        max_leaves = port.read_register(P.REG_MAX_LEAVES)
        if self._capacity > max_leaves:
            raise ValueError(
                f"capacity {self._capacity} exceeds the {max_leaves} leaves the RMM on {port.device!r} holds "
                "(its MAX_LEAVES: the on-chip memory it was built with)"
            )
        if int(port.capacity) != self._capacity:
            port.write_register(P.REG_CAPACITY, self._capacity)
        if port.read_register(P.REG_CAPACITY) != self._capacity:
            raise ValueError(f"the RMM on {port.device!r} did not take capacity {self._capacity}")

    def _command(self, words: np.ndarray, n_responses: int = 0) -> np.ndarray:
        """Run one command; its response words. Keeps total, min and the running max from the trailer."""
        responses, trailer = P.split_response(self._port.run(words), n_responses)
        self._total_q, self._min_q, self._max_q = trailer.total, trailer.min_q, trailer.max_q
        self._total = self._total_q / SCALE
        self._min = float("inf") if trailer.min_q is None else float(dequantize(trailer.min_q, self._dtype))
        if trailer.error:
            op = P.OPCODE_NAMES.get(int(words[0]) >> 56, "?")
            raise RuntimeError(
                f"the RMM on {self.device!r} flagged an error on a {op} command the host had checked; "
                "this is a bug in hetero_replay.fpga (please report it)"
            )
        return responses

    def _lookups(self, pack: Any, payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(indices int64, q uint32)`` of a GET / FIND / SAMPLE command over ``payload``, in chunks."""
        idx, q = [], []
        for start in range(0, len(payload), CHUNK):
            part = payload[start : start + CHUNK]
            i, v = P.unpack_entries(self._command(pack(part), len(part)))
            idx.append(i)
            q.append(v)
        if not idx:
            return np.zeros(0, np.int64), np.zeros(0, np.uint32)
        return np.concatenate(idx), np.concatenate(q)

    # -- writes ----------------------------------------------------------------------------------

    def _quantize(self, values: np.ndarray, what: str) -> np.ndarray:
        """``values`` rounded to the tree's dtype, then to leaves; ``ValueError`` naming the first bad position."""
        if values.size and values.dtype.kind not in "fiu":
            raise TypeError(f"{what} must be real numbers, got dtype {values.dtype}")
        with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, refused below
            values = values.astype(self._dtype, copy=False)
        return quantize(values, what)

    def _write(self, idx: np.ndarray, q: np.ndarray) -> None:
        """Write checked leaves: one INSERT when they are a run of slots at the running max, else UPDATEs."""
        n = len(idx)
        if n == 0:
            return
        run = (idx[0] + np.arange(n, dtype=np.int64)) % self._capacity
        if n <= self._capacity and (q == self._max_q).all() and np.array_equal(idx, run):
            self._command(P.pack_insert(int(idx[0]), n))  # new transitions: the kernel writes its max itself
            return
        for start in range(0, n, CHUNK):  # chunks in order: the last write still wins
            self._command(P.pack_update(idx[start : start + CHUNK], q[start : start + CHUNK]))

    def update(self, indices: Any, priorities: Any) -> None:
        idx = as_indices(indices, self._capacity)
        values = as_1d(priorities, "priorities")
        if values.size != idx.size:
            raise ValueError(f"got {idx.size} indices but {values.size} priorities")
        self._write(idx, self._quantize(values, "priorities"))

    def update_td(self, indices: Any, td_errors: Any, alpha: float, eps: float, limit: int | None = None) -> float:
        bound = self._capacity if limit is None else min(limit, self._capacity)
        idx = as_indices(indices, bound)
        td = as_1d(td_errors, "td_errors")
        if td.size and td.dtype.kind not in "fiu":
            raise TypeError(f"td_errors must be real numbers, got dtype {td.dtype}")
        if td.size != idx.size:
            raise ValueError(f"got {idx.size} indices but {td.size} TD errors")
        priorities, max_raw = _native.td_priorities(td, alpha, eps, self._dtype)  # refuses NaN, inf, negative
        p = priorities.astype(np.float64)
        bad = np.flatnonzero(~((p == 0) | ((p >= MIN_PRIORITY) & (p <= MAX_PRIORITY))))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"TD error at position {i} is {float(td[i])!r}: its priority (td + eps) ** alpha = {priorities[i]} "
                f"is outside what the FPGA tree's leaves represent, {describe_range()}"
            )
        self._write(idx, quantize(priorities))
        return max_raw

    def load_leaves(self, leaves: Any) -> None:
        values = as_1d(leaves, "leaves")
        if values.size != self._capacity:
            raise ValueError(f"expected {self._capacity} leaves, got {values.size}")
        self._load(self._quantize(values, "leaves"))

    def _load(self, q: np.ndarray) -> None:
        """CLEAR, then write the nonzero leaves ``q`` (checked)."""
        self._command(P.pack_clear())
        nonzero = np.flatnonzero(q)
        self._write(nonzero, q[nonzero])

    # -- reads -------------------------------------------------------------------------------------

    def get(self, indices: Any) -> np.ndarray:
        idx = as_indices(indices, self._capacity)
        return dequantize(self._lookups(P.pack_get, idx)[1], self._dtype)

    def leaves(self) -> np.ndarray:
        return dequantize(self.leaves_q(), self._dtype)

    def leaves_q(self) -> np.ndarray:
        """Every leaf as its fixed-point integer (``uint32``)."""
        return self._lookups(P.pack_get, np.arange(self._capacity, dtype=np.int64))[1]

    def find(self, mass: Any) -> np.ndarray:
        m = self._checked_masses(mass)
        # Masses in leaf units; rounding of a mass just below the total must not reach it.
        masses = np.minimum(np.floor(m * SCALE).astype(np.uint64), np.uint64(self._total_q - 1))
        return self._lookups(P.pack_find, masses)[0]

    def sample(
        self, batch_size: int, rng: np.random.Generator, beta: float, stratified: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        b = check_int(batch_size, "batch_size", 1, P.MAX_COUNT)  # the command's count field
        self._require_mass()
        u = rng.integers(0, 2**32, b, dtype=np.uint64)
        if stratified:  # draw j in the j-th of b equal slices of [0, 2**32)
            r = ((np.arange(b, dtype=np.uint64) << np.uint64(32)) + u) // np.uint64(b)
        else:
            r = u
        idx, q = self._lookups(P.pack_sample, r)
        return idx, self.is_weights(q, beta)

    def is_weights(self, q: Any, beta: float) -> np.ndarray:
        """IS weights ``(q_min / q) ** beta`` of leaves ``q`` (float64, returned as float32): 1 at the minimum."""
        min_q = float("nan") if self._min_q is None else float(self._min_q)
        return np.power(min_q / np.asarray(q, np.float64), float(beta)).astype(np.float32)

    @property
    def max_q(self) -> int:
        """The RMM's running max leaf (what INSERT writes)."""
        return self._max_q

    # -- pickling: the leaves and the running max, onto a fresh port of the same device ---------------

    def __getstate__(self) -> dict[str, Any]:
        return {
            "capacity": self._capacity,
            "fanout": self._k,
            "dtype": self._dtype.name,
            "device": self.device,
            "leaves_q": self.leaves_q(),
            "max_q": self._max_q,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["capacity"], state["fanout"], state["dtype"], state["device"])  # type: ignore[misc]
        # The running max is the RMM's own: a CLEAR starts it at INIT_MAX, so set that for one CLEAR.
        self._port.write_register(P.REG_INIT_MAX, int(state["max_q"]))
        try:
            self._load(np.asarray(state["leaves_q"], np.uint32))
        finally:
            self._port.write_register(P.REG_INIT_MAX, P.INIT_MAX)

    def __repr__(self) -> str:
        return f"FpgaSumTree(capacity={self._capacity}, fanout={self._k}, dtype={self._dtype.name}, device={self.device!r})"


__all__ = ["BITFILE_ENV", "EMULATED_DEVICE", "REFERENCE_DEVICE", "FpgaSumTree", "default_device", "resolve_device"]
