"""The board port: the RMM overlay on a PYNQ board, driven through its AXI DMA and AXI-Lite block (device ``"fpga:N"``).

:class:`BoardRmm` is an :class:`~hetero_replay.fpga.protocol.RmmPort`: the
command words :class:`~hetero_replay.trees.fpga_tree.FpgaSumTree` builds go to
the RMM's command stream through the AXI DMA's MM2S channel, and the response
packets come back through its S2MM channel. The overlay (``hls/``'s Vivado
script) wires::

    DDR --MM2S--> AXI DMA --AXI-Stream--> RMM --AXI-Stream (TLAST per command)--> AXI DMA --S2MM--> DDR
                  ^ AXI-Lite (its registers)   ^ AXI-Lite (CAPACITY, FANOUT, TOTAL, ...)

Why the DMA is programmed here, register by register (AXI DMA product guide
PG021, "Direct Register Mode"), rather than with ``pynq.lib.dma``: the framing
is the protocol. The RMM ends every command's response with TLAST, so the
driver arms one S2MM transfer per command, of exactly the length that command
must answer (its ``n`` entries for SAMPLE / GET / FIND, plus the 2-word
trailer), and checks the length the DMA reports back: a packet that ends early
or runs long is an error here, not silently misaligned words in the next call.
It also lets the driver keep both channels moving at once (a long command
stream would otherwise dead-lock against a response stream nobody drains), split
transfers longer than the DMA's length register, and name the channel and its
status bits when something stalls.

What needs pynq (the ``fpga`` extra; pynq 4.0 pins
``numpy<2``, so it lives in an environment of its own) is imported when a port
is opened, never at import time.

Not exercised on hardware here: ``tests/fpga_board/`` runs this driver
against a fake ``pynq.Device`` whose DMA and registers are served by the
emulation module (``hetero_replay._rmm_emu``), which checks the byte-level
protocol, the DMA programming sequence and cache maintenance, but not a real
board's timing or its bitstream.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

import numpy as np

from hetero_replay.checks import check_int, check_real
from hetero_replay.fpga import protocol as P
from hetero_replay.fpga.fixed_point import FRAC_BITS
from hetero_replay.fpga.reference import level_sizes, payload_words
from hetero_replay.registry import install_hint

#: Environment variable naming the overlay's bitfile (its ``.hwh`` must sit beside it).
BITFILE_ENV = "HETERO_REPLAY_FPGA_BITFILE"
#: Environment variables naming the RMM's and the AXI DMA's cells in the overlay (else found by their IP type).
RMM_IP_ENV = "HETERO_REPLAY_FPGA_RMM_IP"
DMA_IP_ENV = "HETERO_REPLAY_FPGA_DMA_IP"
#: How to get pynq.
INSTALL_HINT = install_hint("fpga")

# -- AXI DMA registers, direct register mode (PG021) -----------------------------------------------

MM2S_DMACR = 0x00
MM2S_DMASR = 0x04
MM2S_SA = 0x18
MM2S_SA_MSB = 0x1C
MM2S_LENGTH = 0x28
S2MM_DMACR = 0x30
S2MM_DMASR = 0x34
S2MM_DA = 0x48
S2MM_DA_MSB = 0x4C
S2MM_LENGTH = 0x58

#: DMACR bits: run/stop, and soft reset (of the whole core, from either channel; self-clearing).
DMACR_RS = 1 << 0
DMACR_RESET = 1 << 2
#: DMASR bits.
DMASR_HALTED = 1 << 0
DMASR_IDLE = 1 << 1
DMASR_SG_INCLD = 1 << 3
DMASR_INT_ERR = 1 << 4
DMASR_SLV_ERR = 1 << 5
DMASR_DEC_ERR = 1 << 6
DMASR_SG_INT_ERR = 1 << 8
DMASR_SG_SLV_ERR = 1 << 9
DMASR_SG_DEC_ERR = 1 << 10
DMASR_IOC_IRQ = 1 << 12
DMASR_DLY_IRQ = 1 << 13
DMASR_ERR_IRQ = 1 << 14
#: Any of these stops the channel.
DMASR_ERRORS = DMASR_INT_ERR | DMASR_SLV_ERR | DMASR_DEC_ERR | DMASR_SG_INT_ERR | DMASR_SG_SLV_ERR | DMASR_SG_DEC_ERR
#: Names of the DMASR bits, and what an error bit means here.
DMASR_BITS = {
    DMASR_HALTED: ("Halted", "the channel is stopped"),
    DMASR_IDLE: ("Idle", "the last transfer finished"),
    DMASR_SG_INCLD: ("SGIncld", "the DMA was built with scatter-gather; this driver needs direct register mode"),
    DMASR_INT_ERR: (
        "DMAIntErr",
        "internal error: a zero length, or (S2MM) a packet longer than the transfer, i.e. no TLAST where expected",
    ),
    DMASR_SLV_ERR: ("DMASlvErr", "the memory answered SLVERR: the buffer is not accessible"),
    DMASR_DEC_ERR: ("DMADecErr", "decode error: the buffer address maps to no memory"),
    DMASR_SG_INT_ERR: ("SGIntErr", "scatter-gather internal error"),
    DMASR_SG_SLV_ERR: ("SGSlvErr", "scatter-gather slave error"),
    DMASR_SG_DEC_ERR: ("SGDecErr", "scatter-gather decode error"),
    DMASR_IOC_IRQ: ("IOC_Irq", "a transfer completed"),
    DMASR_DLY_IRQ: ("Dly_Irq", "delay interrupt"),
    DMASR_ERR_IRQ: ("Err_Irq", "an error occurred"),
}

#: Width of the DMA's length register when the overlay does not say (our Vivado script sets 26: 64 MiB - 1).
DEFAULT_LENGTH_WIDTH = 26
#: Width of the DMA's addresses when the overlay does not say.
DEFAULT_ADDR_WIDTH = 32
#: Register window mapped for each block when the overlay gives no address range.
DEFAULT_WINDOW = 0x1000
#: Words of the command and response buffers at first; they grow (doubling) as commands need.
INITIAL_BUFFER_WORDS = 1024
#: Polls before the wait loops start to sleep between register reads.
_SPIN_POLLS = 200
_WORD = 8  # bytes of a stream word

_LOOKUPS = (P.OP_SAMPLE, P.OP_GET, P.OP_FIND)


def describe_dmasr(status: int) -> str:
    """A DMASR value with its bits named: ``"0x00001002 (Idle, IOC_Irq)"``; error bits say what they mean."""
    names = []
    for bit, (name, meaning) in DMASR_BITS.items():
        if status & bit:
            names.append(f"{name}: {meaning}" if bit & DMASR_ERRORS else name)
    if not status & (DMASR_HALTED | DMASR_IDLE):
        names.append("running, not idle: a transfer is in flight")
    return f"{status:#010x} ({'; '.join(names)})"


class BoardError(RuntimeError):
    """The board did something the protocol does not allow; the port must be :meth:`BoardRmm.reset` before use."""


class DmaError(BoardError):
    """The AXI DMA set an error bit in a channel's status register (the message names the channel and bits)."""


class FramingError(BoardError):
    """A response packet (one per command, ended by TLAST) was not the length its command must answer."""


@dataclass(frozen=True)
class _Channel:
    """One DMA channel's registers."""

    name: str
    dmacr: int
    dmasr: int
    address: int
    length: int


MM2S = _Channel("MM2S", MM2S_DMACR, MM2S_DMASR, MM2S_SA, MM2S_LENGTH)
S2MM = _Channel("S2MM", S2MM_DMACR, S2MM_DMASR, S2MM_DA, S2MM_LENGTH)


@dataclass(frozen=True)
class _Command:
    """A command as the host framed it: where it is, and what it answers."""

    position: int  # first word in the caller's array
    opcode: int
    count: int
    end: int  # one past its last word
    entries: int  # response entries before the trailer

    def describe(self) -> str:
        name = P.OPCODE_NAMES.get(self.opcode, f"opcode {self.opcode}")
        return f"command at word {self.position} ({name}, count {self.count})"


@dataclass(frozen=True)
class _Plan:
    """What goes over the DMA for one :meth:`BoardRmm.run`: words, MM2S chunks, S2MM packets, and how to merge."""

    words: np.ndarray  # the device's command words (the caller's, or with oversized lookups split)
    chunks: list[tuple[int, int]]  # MM2S transfers: [start, end) word ranges of ``words``
    packets: list[int]  # S2MM transfers: the words each response packet must hold, in order
    parts: list[tuple[_Command, int]]  # each caller command and the number of packets it became


def _import_pynq() -> Any:
    """pynq, or an ImportError that says how to get it."""
    try:
        import pynq
    except ImportError as e:
        raise ImportError(
            f"the FPGA board driver (device 'fpga:N') needs pynq: {INSTALL_HINT} "
            f"(pynq 4.0 pins numpy<2, so install it in an environment of its own); importing it failed: {e}"
        ) from e
    return pynq


def overlay_part(bitfile: str | os.PathLike[str] | None) -> str | None:
    """The FPGA part an overlay was built for (``"xck26-sfvc784-2LV-c"``), read from the ``.hwh`` beside it.

    ``None`` when there is no readable ``.hwh`` or it names no part.
    """
    if bitfile is None:
        return None
    hwh = os.path.splitext(os.fspath(bitfile))[0] + ".hwh"
    try:
        info = ElementTree.parse(hwh).getroot().find(".//SYSTEMINFO")
    except (OSError, ElementTree.ParseError):
        return None
    if info is None or not info.get("DEVICE"):
        return None
    part = str(info.get("DEVICE"))
    if info.get("PACKAGE"):
        part += f"-{info.get('PACKAGE')}"
    return part + str(info.get("SPEEDGRADE") or "")


def _find_ip(ip_dict: dict[str, Any], wanted: str | None, what: str, env: str, matches: Callable[[str], bool]) -> str:
    """The name of the overlay's cell for ``what``: ``wanted``, else ``$env``, else the one cell whose type matches."""
    wanted = wanted or os.environ.get(env) or None
    listing = ", ".join(f"{name} ({desc.get('type', '?')})" for name, desc in ip_dict.items()) or "none"
    if wanted is not None:
        if wanted not in ip_dict:
            raise ValueError(f"the overlay has no IP named {wanted!r} for the {what}; its IP: {listing}")
        return wanted
    found = [name for name, desc in ip_dict.items() if matches(str(desc.get("type", "")))]
    if len(found) != 1:
        how = "no IP" if not found else f"several IP ({', '.join(found)})"
        raise ValueError(
            f"the overlay has {how} that looks like the {what}; name it with the argument or ${env}. Its IP: {listing}"
        )
    return found[0]


@dataclass(frozen=True)
class _Blocks:
    """Where the RMM's and the DMA's register blocks are, and what the overlay says of them."""

    overlay: Any  # the pynq.Overlay, or None when only addresses were given
    device: Any  # the pynq.Device
    bitfile: str | None
    rmm_base: int
    dma_base: int
    rmm: dict[str, Any]  # the overlay's ip_dict entries ({} without an overlay)
    dma: dict[str, Any]

    @staticmethod
    def window(desc: dict[str, Any]) -> int:
        """Bytes of a block's register window to map."""
        return int(desc.get("addr_range", DEFAULT_WINDOW))


def _locate(
    pynq: Any,
    index: int,
    bitfile: str | os.PathLike[str] | None,
    overlay: Any,
    rmm_ip: str | None,
    dma_ip: str | None,
    rmm_base: int | None,
    dma_base: int | None,
    device: Any,
) -> _Blocks:
    """Load the overlay unless it is given or both addresses are, and find the two blocks (see BoardRmm's Args)."""
    if overlay is None and (rmm_base is None or dma_base is None):
        path = bitfile if bitfile is not None else os.environ.get(BITFILE_ENV)
        if not path:
            raise ValueError(
                f"BoardRmm needs the overlay: pass bitfile= (the .bit with its .hwh beside it) or set "
                f"${BITFILE_ENV}; or pass overlay=, or both rmm_base= and dma_base="
            )
        overlay = pynq.Overlay(os.fspath(path), device=device if device is not None else _pynq_device(pynq, index))
    rmm: dict[str, Any] = {}
    dma: dict[str, Any] = {}
    if overlay is not None:
        ip_dict = dict(overlay.ip_dict)
        if rmm_base is None:
            rmm = ip_dict[_find_ip(ip_dict, rmm_ip, "RMM (an HLS core rmm*)", RMM_IP_ENV, _is_rmm)]
            rmm_base = int(rmm["phys_addr"])
        if dma_base is None:
            dma = ip_dict[_find_ip(ip_dict, dma_ip, "AXI DMA (axi_dma)", DMA_IP_ENV, _is_dma)]
            dma_base = int(dma["phys_addr"])
        device = overlay.device if device is None else device
    elif device is None:
        device = _pynq_device(pynq, index)
    assert rmm_base is not None and dma_base is not None
    bitfile_name = str(getattr(overlay, "bitfile_name", "") or "") or None
    return _Blocks(overlay, device, bitfile_name, int(rmm_base), int(dma_base), rmm, dma)


def _pynq_device(pynq: Any, index: int) -> Any:
    """pynq's device ``index`` (0: the active device)."""
    try:
        if index == 0:
            return pynq.Device.active_device
        devices = pynq.Device.devices
    except RuntimeError as e:  # pynq: "No Devices Found"
        raise RuntimeError(
            f"pynq finds no FPGA for device 'fpga:{index}' ({e}): on a PYNQ board, run as root "
            "with the board's environment set up"
        ) from e
    if index >= len(devices):
        raise ValueError(f"device 'fpga:{index}': pynq finds {len(devices)} device(s)")
    return devices[index]


def _is_rmm(ip_type: str) -> bool:
    """An HLS core named ``rmm...`` (VLNV ``vendor:hls:rmm_top:1.0``)."""
    parts = ip_type.split(":")
    return len(parts) == 4 and parts[1] == "hls" and parts[2].startswith("rmm")


def _is_dma(ip_type: str) -> bool:
    return ip_type.startswith("xilinx.com:ip:axi_dma:")


def _int_parameter(desc: dict[str, Any], name: str, default: int) -> int:
    """An integer parameter of an IP's description (HWH parameters are strings), or ``default``."""
    value = desc.get("parameters", {}).get(name)
    try:
        return int(str(value), 0) if value is not None else default
    except ValueError:
        return default


class BoardRmm:
    """The RMM on a PYNQ board, as an :class:`~hetero_replay.fpga.protocol.RmmPort` (device ``"fpga:N"``).

    Opening a port loads the overlay, finds the RMM and its AXI DMA, resets the
    DMA, checks that the RMM's synthesis parameters (FANOUT, FRAC_BITS,
    MAX_LEAVES) are the ones this host speaks, sets CAPACITY and CLEARs the
    tree.

    Args:
        capacity: leaves in use, ``1 .. MAX_LEAVES`` of the overlay (its on-chip limit).
        fanout: children per node; must be the overlay's FANOUT (fixed at synthesis).
        bitfile: the overlay (``.bit``, with its ``.hwh`` beside it); default
            ``$HETERO_REPLAY_FPGA_BITFILE``. Not needed with ``overlay`` or
            with both base addresses.
        index: which pynq device: 0 is ``pynq.Device.active_device``, ``N``
            ``pynq.Device.devices[N]``; the port's device is ``"fpga:<index>"``.
        overlay: an overlay already loaded (a ``pynq.Overlay``): its IP and device are used.
        rmm_ip, dma_ip: the overlay's cell names of the RMM and the AXI DMA;
            default ``$HETERO_REPLAY_FPGA_RMM_IP`` / ``$HETERO_REPLAY_FPGA_DMA_IP``,
            else the one HLS core named ``rmm*`` and the one ``axi_dma``.
        rmm_base, dma_base: physical base addresses of the two register blocks,
            for a bitstream loaded by other means (then nothing is loaded).
        pynq_device: the ``pynq.Device`` to use (default: by ``index``, or the overlay's).
        dma_length_width: bits of the DMA's length registers (default: the
            overlay's ``C_SG_LENGTH_WIDTH``, else 26); transfers never exceed
            ``2**width - 1`` bytes.
        dma_addr_width: the DMA's address bits (default: its ``C_ADDR_WIDTH``, else 32).
        timeout: seconds a DMA channel may go without progress before a
            :class:`TimeoutError` (naming the channel and its status bits).

    Raises:
        ImportError: pynq is missing (the message says how to install the ``fpga`` extra).
        ValueError: a bad argument, an overlay without the RMM or its DMA,
            a fanout or fraction width that differs from the overlay's, or a
            capacity above its MAX_LEAVES (the message names the part).
        TimeoutError, DmaError: the DMA does not reset or start.

    A port is not picklable (it holds a board); the tree above it pickles leaves.
    Calls are serialised by a lock, so threads may share a port.
    """

    def __init__(
        self,
        capacity: int,
        fanout: int = 16,
        *,
        bitfile: str | os.PathLike[str] | None = None,
        index: int = 0,
        overlay: Any = None,
        rmm_ip: str | None = None,
        dma_ip: str | None = None,
        rmm_base: int | None = None,
        dma_base: int | None = None,
        pynq_device: Any = None,
        dma_length_width: int | None = None,
        dma_addr_width: int | None = None,
        timeout: float = 5.0,
    ) -> None:
        capacity, fanout = P.check_shape(capacity, fanout)
        self._index = check_int(index, "index", 0, 2**16)
        check_real(timeout, "timeout", positive=True, finite=False)
        self._fanout = int(fanout)
        self._timeout = float(timeout)
        self._lock = threading.RLock()
        self._failure: str | None = None  # why the port must be reset() before use
        self._closed = False
        self._pynq = pynq = _import_pynq()
        blocks = _locate(pynq, self._index, bitfile, overlay, rmm_ip, dma_ip, rmm_base, dma_base, pynq_device)
        self._overlay, self._device, self._bitfile = blocks.overlay, blocks.device, blocks.bitfile
        self._rmm_base, self._dma_base = blocks.rmm_base, blocks.dma_base
        self._part = overlay_part(self._bitfile)
        if dma_length_width is None:
            dma_length_width = _int_parameter(blocks.dma, "C_SG_LENGTH_WIDTH", DEFAULT_LENGTH_WIDTH)
        if dma_addr_width is None:
            dma_addr_width = _int_parameter(blocks.dma, "C_ADDR_WIDTH", DEFAULT_ADDR_WIDTH)
        self._length_width = check_int(dma_length_width, "dma_length_width", 8, 26)
        self._addr_width = check_int(dma_addr_width, "dma_addr_width", 32, 64)
        #: Largest transfer in bytes, a whole number of words.
        self._max_bytes = ((1 << self._length_width) - 1) // _WORD * _WORD
        self._rmm = pynq.MMIO(self._rmm_base, blocks.window(blocks.rmm), device=self._device)
        self._dma = pynq.MMIO(self._dma_base, blocks.window(blocks.dma), device=self._device)
        self._cmd_buf: Any = None
        self._resp_buf: Any = None

        self._reset_dma()
        self._check_rmm()
        self._capacity = 0
        with self._lock:
            self._set_capacity(capacity)

    # -- RmmPort -----------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Leaves in use (the CAPACITY register as last set)."""
        return self._capacity

    @property
    def fanout(self) -> int:
        """Children per node (the overlay's FANOUT)."""
        return self._fanout

    @property
    def device(self) -> str:
        """``"fpga:<index>"``."""
        return f"fpga:{self._index}"

    @property
    def max_leaves(self) -> int:
        """The overlay's on-chip limit (its MAX_LEAVES register)."""
        return self._max_leaves

    @property
    def part(self) -> str | None:
        """The FPGA part of the overlay, from its ``.hwh`` (``None`` when unknown)."""
        return self._part

    @property
    def buffer_words(self) -> tuple[int, int]:
        """Words of the command and the response DMA buffers now allocated (they grow as commands need)."""
        return (
            0 if self._cmd_buf is None else int(self._cmd_buf.shape[0]),
            0 if self._resp_buf is None else int(self._resp_buf.shape[0]),
        )

    @property
    def max_transfer_bytes(self) -> int:
        """The longest single DMA transfer (``2**dma_length_width - 1`` rounded down to whole words)."""
        return self._max_bytes

    def run(self, commands: Any) -> np.ndarray:
        """Send back-to-back command words through MM2S; every response word, through S2MM, in order.

        The commands are framed on the host first (so the words the RMM must
        answer are known exactly); a command whose response would not fit one
        DMA transfer (SAMPLE / GET / FIND of very many entries) is sent as
        several of the same opcode, and its entries and trailer merged back
        (these commands change nothing, so every part's trailer is the same
        but for the error flag, which is ORed).

        The driver frames but does not second-guess the kernel: an index past
        the capacity or an unknown opcode goes to the RMM, which flags it in the
        trailer, as every port does.

        Raises:
            ValueError, TypeError: words that are not 1-D unsigned integers, or
                that end inside a command; nothing is sent.
            TimeoutError: a channel made no progress for ``timeout`` seconds.
            DmaError: a DMA status error bit (the message decodes it).
            FramingError: a response packet of the wrong length.
            BoardError: the port failed before and was not :meth:`reset`.
            After any of the last four the RMM's state is unknown.
        """
        words = P.command_words(commands)
        plan = self._plan(words)
        if not plan.packets:
            return np.zeros(0, np.uint64)
        with self._lock:
            self._check_usable()
            received = self._exchange(plan)
        return self._merge(plan, received)

    def read_register(self, offset: int) -> int:
        """The RMM's 32-bit register at byte ``offset`` (one of ``protocol.REGISTERS``; STATUS clears on read)."""
        offset = P.check_register(offset)
        with self._lock:
            self._check_open()
            return int(self._rmm.read(offset)) & P.NONE32

    def write_register(self, offset: int, value: int) -> None:
        """Write CAPACITY (re-sizes the tree and CLEARs it, as every port does) or INIT_MAX.

        Raises:
            ValueError: another register, a value outside 32 bits, or a capacity
                outside ``1 .. MAX_LEAVES`` (the overlay's on-chip limit).
        """
        offset, value = P.check_register_write(offset, value)
        with self._lock:
            self._check_usable()
            if offset == P.REG_CAPACITY:
                self._set_capacity(value)
            else:
                self._rmm.write(offset, value)
                self._fence()

    # -- recovery and lifetime -----------------------------------------------------------------------

    def reset(self) -> None:
        """Make a failed port usable again: reset the DMA, drain stale response packets, re-size and CLEAR.

        Every leaf is lost. The RMM itself has no reset the host can reach
        (it is free-running); if it was left inside a command whose payload
        never arrived, the CLEAR here is taken as payload and the check of its
        answer fails: then reload the overlay (a PL reset).

        Raises:
            BoardError, TimeoutError: the board did not come back.
        """
        with self._lock:
            self._check_open()
            self._reset_dma()
            self._drain()
            self._failure = None
            try:
                self._set_capacity(self._capacity)
            except (TimeoutError, BoardError) as e:
                self._fail(e)
                raise BoardError(f"the RMM did not recover ({e}); reload the overlay (this resets the PL)") from e

    def close(self) -> None:
        """Free the DMA buffers; the port is unusable afterwards (the overlay stays loaded)."""
        with self._lock:
            for buf in (self._cmd_buf, self._resp_buf):
                if buf is not None:
                    buf.freebuffer()
            self._cmd_buf = self._resp_buf = None
            self._closed = True

    def __enter__(self) -> BoardRmm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> None:
        raise TypeError("a BoardRmm holds a board and cannot be pickled; pickle the tree's leaves instead")

    def __repr__(self) -> str:
        where = self._bitfile or f"rmm at {self._rmm_base:#x}, dma at {self._dma_base:#x}"
        return f"BoardRmm(capacity={self._capacity}, fanout={self._fanout}, device={self.device!r}, {where})"

    # -- opening --------------------------------------------------------------------------------------

    def _check_rmm(self) -> None:
        """The RMM's synthesis parameters against what this host speaks."""
        where = self._where()
        fanout = self._rmm.read(P.REG_FANOUT)
        if fanout != self._fanout:
            raise ValueError(
                f"the RMM in {where} was built with FANOUT = {fanout}; asked for fanout {self._fanout} "
                "(the fanout is fixed at synthesis: use the overlay's, or rebuild it)"
            )
        frac = self._rmm.read(P.REG_FRAC_BITS)
        if frac != FRAC_BITS:
            raise ValueError(
                f"the RMM in {where} has FRAC_BITS = {frac}; this host quantises with {FRAC_BITS} "
                "(the overlay and hetero-replay come from different versions)"
            )
        max_leaves = self._rmm.read(P.REG_MAX_LEAVES)
        if not 1 <= max_leaves <= P.MAX_LEAVES:
            raise ValueError(
                f"the RMM in {where} reports MAX_LEAVES = {max_leaves}, outside [1, 2**28]: is this the RMM overlay?"
            )
        self._max_leaves = int(max_leaves)

    def _where(self) -> str:
        """The overlay and part, for messages."""
        what = self._bitfile or f"the overlay at {self._rmm_base:#x}"
        return f"{what} (part {self._part})" if self._part else what

    def _set_capacity(self, capacity: int) -> None:
        """Write CAPACITY, CLEAR, and check the RMM took it (the depth it reports is the one expected)."""
        if capacity > self._max_leaves:
            raise ValueError(
                f"capacity {capacity} exceeds the on-chip limit of the RMM in {self._where()}: MAX_LEAVES = "
                f"{self._max_leaves} leaves. Its tree lives in the FPGA's block/ultra RAM, so this overlay "
                "cannot hold more: use a smaller buffer, an overlay built with a larger MAX_LEAVES for a part "
                "with more on-chip memory, or another tree backend"
            )
        capacity = check_int(capacity, "capacity", 1, self._max_leaves)
        self._rmm.write(P.REG_CAPACITY, capacity)
        got = self._rmm.read(P.REG_CAPACITY)
        if got != capacity:
            raise self._broken(f"the RMM in {self._where()} did not take CAPACITY = {capacity}: it reads back {got}")
        self._capacity = capacity
        self._fence()
        trailer = P.parse_trailer(self._exchange(self._plan(P.pack_clear())))
        depth = self._rmm.read(P.REG_DEPTH)
        expected_depth = len(level_sizes(capacity, self._fanout))
        if trailer.error or trailer.total != 0 or depth != expected_depth:
            raise self._broken(
                f"the RMM in {self._where()} answered CLEAR at capacity {capacity} with {trailer} and "
                f"DEPTH = {depth} (expected no error, total 0 and depth {expected_depth})"
            )

    def _fence(self) -> None:
        """Make the RMM see a register just written: run one command that changes nothing (GET of 0 entries).

        The kernel is free-running (``ap_ctrl_none``) and samples CAPACITY and
        INIT_MAX when a command starts, which is as soon as the previous one
        ended: the call now waiting for its header has the old values. After
        this no-op command, the next call (the caller's next command) starts
        with the new ones. On the emulation and the reference a write takes
        effect at once, and the fence is harmless.
        """
        if P.parse_trailer(self._exchange(self._plan(P.pack_get(np.zeros(0, np.uint64))))).error:
            raise self._broken(f"the RMM in {self._where()} flagged an error on an empty GET (the register fence)")

    # -- the DMA -----------------------------------------------------------------------------------------

    def _reset_dma(self) -> None:
        """Soft-reset the AXI DMA (both channels), then set both running, interrupts off (this driver polls)."""
        self._dma.write(MM2S.dmacr, DMACR_RESET)  # resets the whole core, both channels
        self._wait(
            lambda: not (self._dma.read(MM2S.dmacr) | self._dma.read(S2MM.dmacr)) & DMACR_RESET,
            lambda: (
                f"the AXI DMA at {self._dma_base:#x} did not finish its soft reset "
                f"(MM2S_DMACR = {self._dma.read(MM2S.dmacr):#x}, S2MM_DMACR = {self._dma.read(S2MM.dmacr):#x})"
            ),
        )
        for channel in (MM2S, S2MM):
            self._dma.write(channel.dmacr, DMACR_RS)
            self._wait(
                functools.partial(self._running, channel),
                functools.partial(self._channel_state, channel, "did not start after reset (Halted stays set)"),
            )
            status = self._dma.read(channel.dmasr)
            if status & DMASR_SG_INCLD:
                raise ValueError(
                    f"the AXI DMA at {self._dma_base:#x} was built with scatter-gather (DMASR {describe_dmasr(status)}); "
                    "the RMM overlay needs it in direct register mode (c_include_sg = 0)"
                )
            if status & DMASR_ERRORS:
                raise DmaError(self._channel_state(channel, "reports an error right after reset"))

    def _running(self, channel: _Channel) -> bool:
        """Whether ``channel`` has left the Halted state."""
        return not self._dma.read(channel.dmasr) & DMASR_HALTED

    def _channel_state(self, channel: _Channel, what: str) -> str:
        """A message about a channel: its name, the DMA's address and its decoded status register."""
        status = self._dma.read(channel.dmasr)
        return f"AXI DMA {channel.name} channel (DMA at {self._dma_base:#x}) {what}: DMASR = {describe_dmasr(status)}"

    def _wait(self, done: Callable[[], bool], message: Callable[[], str]) -> None:
        """Poll ``done()`` until true, else TimeoutError(``message()``) after ``timeout`` seconds."""
        deadline = time.monotonic() + self._timeout
        polls = 0
        while not done():
            polls += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"{message()}; waited {self._timeout} s")
            if polls > _SPIN_POLLS:
                time.sleep(1e-5)

    def _start(self, channel: _Channel, address: int, nbytes: int) -> None:
        """Program one direct-register-mode transfer: address (and its high word), then LENGTH, which starts it."""
        if address >> self._addr_width:
            raise DmaError(
                f"buffer address {address:#x} does not fit the AXI DMA's {self._addr_width} address bits "
                "(set dma_addr_width, or allocate below 4 GiB)"
            )
        self._dma.write(channel.dmasr, DMASR_IOC_IRQ | DMASR_DLY_IRQ | DMASR_ERR_IRQ)  # write-1-to-clear
        self._dma.write(channel.address, address & 0xFFFFFFFF)
        if self._addr_width > 32:
            self._dma.write(channel.address + 4, address >> 32)
        self._dma.write(channel.length, nbytes)

    def _finished(self, channel: _Channel, what: str) -> bool:
        """Whether ``channel``'s transfer is done; DmaError on an error bit or a halt."""
        status = self._dma.read(channel.dmasr)
        if status & DMASR_ERRORS:
            raise DmaError(f"{self._channel_state(channel, f'failed {what}')}")
        if status & DMASR_HALTED:
            raise DmaError(self._channel_state(channel, f"halted {what} (its run bit was cleared, or it was reset)"))
        return bool(status & DMASR_IDLE)

    def _ensure_buffers(self, cmd_words: int, resp_words: int) -> None:
        """Grow the command / response buffers (doubling) to hold the words of one run; free the old ones."""

        def grown(buf: Any, words: int) -> Any:
            if buf is not None and buf.shape[0] >= words:
                return buf
            size = max(words, INITIAL_BUFFER_WORDS, 0 if buf is None else 2 * int(buf.shape[0]))
            new = self._pynq.allocate((size,), dtype=np.uint64, target=self._device)
            if buf is not None:
                buf.freebuffer()
            return new

        self._cmd_buf = grown(self._cmd_buf, cmd_words)
        self._resp_buf = grown(self._resp_buf, resp_words)

    def _plan(self, words: np.ndarray) -> _Plan:
        """Frame ``words`` into commands, split oversized lookups, and lay out the MM2S and S2MM transfers."""
        commands = []
        pos = 0
        while pos < len(words):
            opcode, count = int(words[pos]) >> 56, int(words[pos]) & P.NONE32
            end = pos + 1 + payload_words(opcode, count)
            if end > len(words):
                name = P.OPCODE_NAMES.get(opcode, f"opcode {opcode}")
                raise ValueError(
                    f"truncated command at word {pos}: {name} with count {count} needs {end - pos - 1} payload "
                    f"words, only {len(words) - pos - 1} follow; nothing was sent"
                )
            commands.append(_Command(pos, opcode, count, end, count if opcode in _LOOKUPS else 0))
            pos = end

        max_words = self._max_bytes // _WORD
        per_packet = max_words - P.TRAILER_WORDS  # entries one response packet holds
        pieces: list[np.ndarray] = []
        spans: list[tuple[int, int]] = []  # [start, end) of each device command in the device words
        packets: list[int] = []
        parts: list[tuple[_Command, int]] = []
        split = False
        at = 0
        for cmd in commands:
            if cmd.entries <= per_packet:
                pieces.append(words[cmd.position : cmd.end])
                spans.append((at, at + cmd.end - cmd.position))
                at = spans[-1][1]
                packets.append(cmd.entries + P.TRAILER_WORDS)
                parts.append((cmd, 1))
                continue
            split = True
            payload = words[cmd.position + 1 : cmd.end]
            n_parts = 0
            for start in range(0, cmd.entries, per_packet):
                piece = payload[start : start + per_packet]
                pieces.append(np.concatenate([np.array([P.header(cmd.opcode, len(piece))], np.uint64), piece]))
                spans.append((at, at + 1 + len(piece)))
                at = spans[-1][1]
                packets.append(len(piece) + P.TRAILER_WORDS)
                n_parts += 1
            parts.append((cmd, n_parts))
        device_words = (np.concatenate(pieces) if pieces else words) if split else words

        # MM2S transfers: whole commands up to the length register's limit; a longer command spans several
        # (the RMM reads its commands as one word stream and ignores TLAST on its input).
        chunks: list[tuple[int, int]] = []
        start = 0
        for span_start, span_end in spans:
            if span_end - start > max_words and span_start > start:
                chunks.append((start, span_start))
                start = span_start
            while span_end - start > max_words:
                chunks.append((start, start + max_words))
                start += max_words
        if at > start:
            chunks.append((start, at))
        return _Plan(device_words, chunks, packets, parts)

    def _transfer(self, plan: _Plan) -> np.ndarray:
        """Run ``plan`` over the DMA: both channels kept busy, each S2MM packet checked; the response words."""
        self._check_open()
        offsets = np.concatenate([[0], np.cumsum(plan.packets)]).astype(np.int64)
        total = int(offsets[-1])
        self._ensure_buffers(len(plan.words), total)
        cmd, resp = self._cmd_buf, self._resp_buf
        cmd[: len(plan.words)] = plan.words
        cmd[: len(plan.words)].flush()  # the DMA reads memory, not the CPU's caches
        resp[:total].flush()  # no dirty line of ours may be evicted over what the DMA writes
        cmd_at, resp_at = int(cmd.device_address), int(resp.device_address)

        chunk = packet = 0  # the transfer each channel does now
        # S2MM first: the RMM can answer as soon as its first command is in.
        self._start(S2MM, resp_at, plan.packets[0] * _WORD)
        a, b = plan.chunks[0]
        self._start(MM2S, cmd_at + a * _WORD, (b - a) * _WORD)
        mm2s_busy = s2mm_busy = True
        deadline = time.monotonic() + self._timeout
        polls = 0
        while mm2s_busy or s2mm_busy:
            progress = False
            if mm2s_busy and self._finished(MM2S, f"sending command words {plan.chunks[chunk]}"):
                progress, mm2s_busy = True, False
                chunk += 1
                if chunk < len(plan.chunks):
                    a, b = plan.chunks[chunk]
                    self._start(MM2S, cmd_at + a * _WORD, (b - a) * _WORD)
                    mm2s_busy = True
            if s2mm_busy and self._finished(S2MM, f"receiving {self._packet_name(plan, packet)}"):
                progress, s2mm_busy = True, False
                got = self._dma.read(S2MM.length)
                expected = plan.packets[packet] * _WORD
                if got != expected:
                    raise FramingError(
                        f"the response to {self._packet_name(plan, packet)} ended (TLAST) after {got} bytes; "
                        f"expected {expected} ({plan.packets[packet] - P.TRAILER_WORDS} entries and the "
                        f"{P.TRAILER_WORDS}-word trailer)"
                    )
                packet += 1
                if packet < len(plan.packets):
                    self._start(S2MM, resp_at + int(offsets[packet]) * _WORD, plan.packets[packet] * _WORD)
                    s2mm_busy = True
            now = time.monotonic()
            if progress:
                deadline, polls = now + self._timeout, 0
                continue
            if now > deadline:
                raise self._stalled(plan, chunk if mm2s_busy else None, packet if s2mm_busy else None)
            polls += 1
            if polls > _SPIN_POLLS:
                time.sleep(1e-5)
        resp[:total].invalidate()  # drop stale cache lines: read what the DMA wrote
        return np.array(resp[:total], dtype=np.uint64)

    def _stalled(self, plan: _Plan, chunk: int | None, packet: int | None) -> TimeoutError:
        """The error for channels that finished nothing for ``timeout`` seconds: MM2S on ``chunk``, S2MM on ``packet``."""
        stuck = []
        if chunk is not None:
            a, b = plan.chunks[chunk]
            what = f"did not finish sending command words [{a}, {b}) ({(b - a) * _WORD} bytes)"
            stuck.append(self._channel_state(MM2S, what))
        if packet is not None:
            what = (
                f"received no packet (TLAST) for {self._packet_name(plan, packet)}, "
                f"{plan.packets[packet] * _WORD} bytes expected"
            )
            stuck.append(self._channel_state(S2MM, what))
        return TimeoutError(
            f"{'; '.join(stuck)}; waited {self._timeout} s. Is the RMM running (it is free-running, "
            "ap_ctrl_none) and is this the overlay built from hls/?"
        )

    def _packet_name(self, plan: _Plan, packet: int) -> str:
        """The caller's command that S2MM packet ``packet`` answers (and which part of it)."""
        first = 0
        for cmd, n_parts in plan.parts:
            if packet < first + n_parts:
                part = f", part {packet - first + 1} of {n_parts}" if n_parts > 1 else ""
                return f"the {cmd.describe()}{part}"
            first += n_parts
        return f"packet {packet}"

    def _merge(self, plan: _Plan, received: np.ndarray) -> np.ndarray:
        """The caller's responses from the packets: split commands' entries joined, their trailers' errors ORed."""
        if len(plan.packets) == len(plan.parts):
            return received
        out = []
        at = packet = 0
        for _cmd, n_parts in plan.parts:
            error = 0
            for _ in range(n_parts):
                words = received[at : at + plan.packets[packet]]
                out.append(words[: -P.TRAILER_WORDS])
                trailer = words[-P.TRAILER_WORDS :].copy()
                error |= int(trailer[0]) & P.ERROR_BIT
                at += plan.packets[packet]
                packet += 1
            trailer[0] |= np.uint64(error)
            out.append(trailer)
        return np.concatenate(out)

    # -- failure -----------------------------------------------------------------------------------

    def _exchange(self, plan: _Plan) -> np.ndarray:
        """:meth:`_transfer`; a board error on the way leaves the port failed (unknown state) before it propagates."""
        try:
            return self._transfer(plan)
        except (TimeoutError, BoardError) as e:
            self._fail(e)
            raise

    def _broken(self, message: str) -> BoardError:
        """A :class:`BoardError` for ``message``, with the port marked failed."""
        error = BoardError(message)
        self._fail(error)
        return error

    def _fail(self, error: BaseException) -> None:
        """Remember why the port is unusable, and stop the DMA (best effort) so nothing writes on."""
        self._failure = f"{type(error).__name__}: {error}"
        try:
            self._dma.write(MM2S.dmacr, DMACR_RESET)
        except Exception:  # the board may be gone; the first error is what matters
            pass

    def _check_usable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise BoardError(
                f"the board's state is unknown after an earlier failure ({self._failure}); "
                "call reset() (which clears every leaf) or reload the overlay"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise BoardError("this BoardRmm is closed")

    def _drain(self) -> None:
        """Receive and drop response packets left in the RMM's output stream by a failed run."""
        self._ensure_buffers(0, INITIAL_BUFFER_WORDS)
        nbytes = min(int(self._resp_buf.nbytes), self._max_bytes)
        for _ in range(1 << 16):  # a bound: a run leaves at most one packet per command it sent
            self._start(S2MM, int(self._resp_buf.device_address), nbytes)
            deadline = time.monotonic() + min(self._timeout, 0.05)
            try:
                while not self._finished(S2MM, "draining stale responses"):
                    if time.monotonic() > deadline:
                        self._reset_dma()  # nothing more came: abort the waiting transfer
                        return
            except DmaError:  # a stale packet longer than the buffer: the rest comes as the next one
                self._reset_dma()
        raise BoardError("the RMM keeps sending responses nobody asked for; reload the overlay")


__all__ = [
    "BITFILE_ENV",
    "DMA_IP_ENV",
    "INSTALL_HINT",
    "RMM_IP_ENV",
    "BoardError",
    "BoardRmm",
    "DmaError",
    "FramingError",
    "describe_dmasr",
    "overlay_part",
]
