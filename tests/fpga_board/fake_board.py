"""A fake PYNQ board: a ``pynq.Device`` whose AXI DMA and RMM are simulated, the RMM by ``hetero_replay._rmm_emu``.

What is real here: every pynq class the driver touches. ``pynq.Overlay`` loads
the "bitstream" through :meth:`FakeBoard.get_bitfile_metadata` and
:meth:`FakeBoard.download`; ``pynq.MMIO`` maps register windows through
:meth:`FakeBoard.mmap` (capability ``MEMORY_MAPPED``, what a Zynq board's
``EmbeddedDevice`` has: MMIO reads and writes one ``uint32`` element of a NumPy
view of ``/dev/mem``) or through :meth:`FakeBoard.read_registers` /
:meth:`FakeBoard.write_registers` (capability ``REGISTER_RW``, the XRT path);
``pynq.allocate`` returns real ``PynqBuffer`` objects, whose ``flush``,
``invalidate`` and ``freebuffer`` call back into this device.

What is simulated, at the level of the AXI DMA's registers (PG021, direct
register mode) and the RMM's AXI-Stream and AXI-Lite ports:

* **memory**: every buffer has host memory (what the CPU sees) and a separate
  "DDR" copy (what the DMA sees), filled with ``0xA5`` at allocation. Only
  ``flush`` copies host -> DDR and only ``invalidate`` DDR -> host, so a driver
  that skips either reads or sends stale bytes. DMA addresses must fall inside
  one live buffer (else DMADecErr), 8-byte aligned (else DMAIntErr).
* **the DMA**: soft reset (the reset bit reads back set for a few reads),
  run/stop, Halted / Idle / IOC and the error bits, W1C interrupt bits,
  LENGTH writes that start a transfer (ignored while halted; zero length is
  DMAIntErr), S2MM_LENGTH reading back the bytes a packet held, a packet longer
  than the transfer is DMAIntErr. Address high words count only with
  ``addr_width > 32``; LENGTH keeps ``length_width`` bits.
* **the RMM's streams**: an input FIFO of ``in_fifo_words`` words; the RMM
  frames commands itself (header ``opcode << 56 | n``, payload per the spec),
  runs each whole command on the engine (an ``_rmm_emu.Rmm``) and queues its
  response as one packet (TLAST on its last word); with ``out_packets`` packets
  waiting it stops reading its input, so the MM2S side stalls: a driver that
  waits for MM2S before draining S2MM dead-locks, as on hardware.
* **time**: the hardware advances one step per register read (the driver's
  polling), moving up to ``beats_per_step`` words per channel, so transfers
  are in flight across several polls.

Faults to inject: :meth:`FakeBoard.inject_error`, :attr:`FakeBoard.stall`,
:meth:`FakeBoard.corrupt_next_packet`, :attr:`FakeBoard.register_overrides`.
"""

from __future__ import annotations

import types
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from pynq import Device
from pynq.buffer import PynqBuffer

# DMA register offsets and bits (PG021), written out here independently of the driver.
MM2S, S2MM = "MM2S", "S2MM"
CHANNEL_BASE = {MM2S: 0x00, S2MM: 0x30}
CR, SR, ADDR, ADDR_MSB, LENGTH = 0x00, 0x04, 0x18, 0x1C, 0x28  # relative to the channel's base
RS, RESET = 1 << 0, 1 << 2
HALTED, IDLE, SG_INCLD = 1 << 0, 1 << 1, 1 << 3
INT_ERR, SLV_ERR, DEC_ERR = 1 << 4, 1 << 5, 1 << 6
IOC_IRQ, DLY_IRQ, ERR_IRQ = 1 << 12, 1 << 13, 1 << 14
W1C = IOC_IRQ | DLY_IRQ | ERR_IRQ

#: Opcodes whose payload is ``n`` words (INSERT has 1, everything else none): the RMM's own framing.
_PAYLOAD_N = (1, 3, 4, 5)

RMM_TYPE = "hetero-replay.org:hls:rmm_top:1.0"
DMA_TYPE = "xilinx.com:ip:axi_dma:7.1"


class RegisterWindow(np.ndarray):
    """What :meth:`FakeBoard.mmap` returns: a ``uint32`` array whose element reads and writes are bus accesses.

    ``pynq.MMIO`` on a ``MEMORY_MAPPED`` device reads ``int(array[i])`` and
    writes ``array[i] = np.uint32(v)``; on a board those go to ``/dev/mem``.
    """

    board: FakeBoard
    bus_base: int

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            return np.uint32(self.board.bus_read(self.bus_base + 4 * int(key)))
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, (int, np.integer)):
            self.board.bus_write(self.bus_base + 4 * int(key), int(value))
            return
        super().__setitem__(key, value)


class _Allocation:
    """One buffer: its device address, the CPU's view and the DDR copy the DMA sees."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.address = address
        self.nbytes = nbytes
        self.host = np.zeros(nbytes, np.uint8)
        self.ddr = np.full(nbytes, 0xA5, np.uint8)
        self.freed = False
        self.buffer: weakref.ref[PynqBuffer] | None = None


class _Channel:
    """One DMA channel's registers and its transfer in flight."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cr = 0
        self.sr = HALTED
        self.addr = self.addr_msb = 0
        self.length = 0  # as written; S2MM: the bytes received, after completion
        self.active: dict[str, int] | None = None  # {"address", "nbytes", "done"}
        self.started = 0  # transfers started (for tests)

    def fail(self, bits: int) -> None:
        """An error: the bits, Err_Irq, and the channel halts (its run bit drops), as PG021 describes."""
        self.sr = (self.sr | bits | ERR_IRQ | HALTED) & ~IDLE
        self.cr &= ~RS
        self.active = None

    def complete(self) -> None:
        self.sr |= IDLE | IOC_IRQ
        self.active = None


class _StreamRmm:
    """The RMM's stream side: input FIFO, its own command framing, whole commands run on the engine, packets out."""

    def __init__(self, engine: Any, in_fifo_words: int, out_packets: int) -> None:
        self.engine = engine
        self.in_fifo_words = in_fifo_words
        self.out_packets = out_packets
        self.fifo: deque[int] = deque()
        self.current: list[int] = []
        self.need = 0
        self.out: deque[np.ndarray] = deque()
        self.commands = 0

    def room(self) -> int:
        return self.in_fifo_words - len(self.fifo)

    def step(self) -> None:
        """Read input words while there is room to answer; run each command as soon as it is whole."""
        while self.fifo and len(self.out) < self.out_packets:
            word = self.fifo.popleft()
            self.current.append(word)
            if len(self.current) == 1:
                opcode, n = word >> 56, word & 0xFFFFFFFF
                self.need = 1 + (n if opcode in _PAYLOAD_N else 1 if opcode == 2 else 0)
            if len(self.current) == self.need:
                self.out.append(np.asarray(self.engine.run(np.array(self.current, np.uint64)), np.uint64))
                self.current = []
                self.commands += 1


class FakeBoard(Device):
    """A PYNQ device in host memory with an AXI DMA and an RMM, enough for ``pynq.Overlay``, ``MMIO`` and ``allocate``.

    Args:
        engine_factory: ``(capacity, fanout) -> engine`` with ``run`` / ``read_register`` /
            ``write_register`` (``_rmm_emu.Rmm``); called at each download (a fresh PL).
        fanout: the RMM's synthesis fanout.
        capability: ``"MEMORY_MAPPED"`` (Zynq boards) or ``"REGISTER_RW"`` (XRT devices).
        rmm_base, dma_base: where the two register blocks are.
        rmm_name, dma_name: their cell names in the overlay's ``ip_dict``.
        length_width, addr_width: the DMA's ``C_SG_LENGTH_WIDTH`` / ``C_ADDR_WIDTH``.
        memory_base: the first buffer's device address (above 4 GiB to need the high words).
        in_fifo_words, out_packets, beats_per_step: the stream model (see the module docstring).
        scatter_gather: build the DMA with scatter-gather (the driver must refuse it).
    """

    def __init__(
        self,
        engine_factory: Callable[[int, int], Any],
        fanout: int = 16,
        *,
        capability: str = "MEMORY_MAPPED",
        rmm_base: int = 0xA000_0000,
        dma_base: int = 0xA001_0000,
        rmm_name: str = "rmm_0",
        dma_name: str = "axi_dma_0",
        length_width: int = 26,
        addr_width: int = 32,
        memory_base: int = 0x3000_0000,
        in_fifo_words: int = 64,
        out_packets: int = 2,
        beats_per_step: int = 256,
        scatter_gather: bool = False,
    ) -> None:
        super().__init__("fake_rmm_board")
        if capability not in ("MEMORY_MAPPED", "REGISTER_RW"):
            raise ValueError(f"capability must be MEMORY_MAPPED or REGISTER_RW, got {capability!r}")
        self.capabilities = {capability: True}
        self.engine_factory = engine_factory
        self.fanout = fanout
        self.rmm_base, self.dma_base = rmm_base, dma_base
        self.rmm_name, self.dma_name = rmm_name, dma_name
        self.length_width, self.addr_width = length_width, addr_width
        self.in_fifo_words, self.out_packets, self.beats_per_step = in_fifo_words, out_packets, beats_per_step
        self.scatter_gather = scatter_gather
        self.extra_ip: dict[str, dict[str, Any]] = {}  # more cells for the overlay's ip_dict
        #: Register values the RMM reports instead of the engine's ({offset: value}).
        self.register_overrides: dict[int, int] = {}
        #: Channels that make no progress (a hung RMM or interconnect): {"MM2S", "S2MM"}.
        self.stall: set[str] = set()
        self._inject: dict[str, int] = {}
        self._corrupt: int = 0
        self._next_address = memory_base
        self.allocations: dict[int, _Allocation] = {}
        self.flushes = self.invalidates = self.downloads = 0
        self.bus_log: list[tuple[str, int, int]] = []  # ("r"/"w", address, value) of every register access
        self._power_on()

    # -- the PL: (re)programmed by a download ------------------------------------------------------

    def _power_on(self) -> None:
        """A freshly programmed PL: the DMA in reset state, a CLEARed RMM of capacity 1."""
        self.engine = self.engine_factory(1, self.fanout)
        self.rmm = _StreamRmm(self.engine, self.in_fifo_words, self.out_packets)
        self.channels = {MM2S: _Channel(MM2S), S2MM: _Channel(S2MM)}
        self._reset_reads = 0

    def get_bitfile_metadata(self, bitfile_name: str) -> Any:
        """The overlay's description, as pynq's HWH parser would give it for our Vivado design."""
        ip_dict = {
            self.rmm_name: self._ip(RMM_TYPE, self.rmm_base, {}),
            self.dma_name: self._ip(
                DMA_TYPE,
                self.dma_base,
                {
                    "C_SG_LENGTH_WIDTH": str(self.length_width),
                    "C_ADDR_WIDTH": str(self.addr_width),
                    "C_INCLUDE_SG": "1" if self.scatter_gather else "0",
                },
            ),
            **self.extra_ip,
        }
        return types.SimpleNamespace(
            ip_dict=ip_dict,
            gpio_dict={},
            interrupt_pins={},
            interrupt_controllers={},
            hierarchy_dict={},
            mem_dict={},
            clock_dict={},
            systemgraph=None,
        )

    @staticmethod
    def _ip(ip_type: str, base: int, parameters: dict[str, str]) -> dict[str, Any]:
        return {
            "type": ip_type,
            "phys_addr": base,
            "addr_range": 0x10000,
            "fullpath": "",
            "parameters": parameters,
            "registers": {},
            "state": None,
            "interrupts": {},
            "gpio": {},
        }

    def download(self, bitstream: Any, parser: Any = None) -> None:
        """Program the PL: everything on it starts over."""
        self.downloads += 1
        self._power_on()
        self.post_download(bitstream, parser)

    # -- memory ------------------------------------------------------------------------------------------

    def allocate(self, shape: Any, dtype: Any, **kwargs: Any) -> PynqBuffer:
        """A contiguous buffer at a fresh device address (4 KiB aligned, a guard page after it)."""
        count = int(np.prod(shape))
        nbytes = max(count * np.dtype(dtype).itemsize, 1)
        alloc = _Allocation(self._next_address, nbytes)
        handle = len(self.allocations) + 1
        self.allocations[handle] = alloc
        self._next_address += (nbytes + 0x1FFF) // 0x1000 * 0x1000  # round up, plus a guard page
        buf = PynqBuffer(
            shape, dtype, buffer=alloc.host, device=self, device_address=alloc.address, bo=handle, coherent=False
        )
        # pynq's buffer-cache hooks: freebuffer() hands the pointer back to return_to.return_pointer().
        buf.memory, buf.pointer, buf.return_to = self, handle, self
        alloc.buffer = weakref.ref(buf)
        return buf

    def return_pointer(self, handle: int) -> None:
        """``PynqBuffer.freebuffer`` of one of ours."""
        alloc = self.allocations[handle]
        alloc.freed = True
        buf = alloc.buffer() if alloc.buffer is not None else None
        if buf is not None:  # else its __del__ would free it again, down pynq's munmap path (board only)
            buf.freed = True

    def live_buffers(self) -> list[_Allocation]:
        return [a for a in self.allocations.values() if not a.freed]

    def flush(self, bo: int, offset: int, ptr: int, size: int) -> None:
        """CPU caches -> DDR for ``size`` bytes at ``offset`` of buffer ``bo``."""
        alloc = self._live(bo)
        alloc.ddr[offset : offset + size] = alloc.host[offset : offset + size]
        self.flushes += 1

    def invalidate(self, bo: int, offset: int, ptr: int, size: int) -> None:
        """DDR -> what the CPU reads, for ``size`` bytes at ``offset`` of buffer ``bo``."""
        alloc = self._live(bo)
        alloc.host[offset : offset + size] = alloc.ddr[offset : offset + size]
        self.invalidates += 1

    def _live(self, bo: int) -> _Allocation:
        alloc = self.allocations[bo]
        assert not alloc.freed, f"cache maintenance on freed buffer {bo}"
        return alloc

    def _ddr(self, address: int, nbytes: int) -> np.ndarray | None:
        """The DDR bytes ``[address, address + nbytes)`` if one live buffer holds them all, else None."""
        for alloc in self.allocations.values():
            if not alloc.freed and alloc.address <= address and address + nbytes <= alloc.address + alloc.nbytes:
                return alloc.ddr[address - alloc.address : address - alloc.address + nbytes]
        return None

    # -- the register buses ----------------------------------------------------------------------------

    def mmap(self, base_addr: int, length: int) -> RegisterWindow:
        """A register window (``MEMORY_MAPPED`` devices): reads and writes of its elements are bus accesses."""
        for base in (self.rmm_base, self.dma_base):
            if base <= base_addr and base_addr + length <= base + 0x10000:
                window = np.zeros(length // 4, np.uint32).view(RegisterWindow)
                window.board, window.bus_base = self, base_addr
                return window
        raise ValueError(f"nothing is mapped at {base_addr:#x} (+{length:#x})")

    def read_registers(self, address: int, length: int) -> bytes:
        """``REGISTER_RW`` devices: a read of ``length`` (4) bytes."""
        assert length == 4, length
        return int(self.bus_read(address)).to_bytes(4, "little")

    def write_registers(self, address: int, data: bytes) -> None:
        """``REGISTER_RW`` devices: a write of whole 32-bit words."""
        assert len(data) % 4 == 0, len(data)
        for i in range(0, len(data), 4):
            self.bus_write(address + i, int.from_bytes(data[i : i + 4], "little"))

    def bus_read(self, address: int) -> int:
        """One 32-bit read; time passes (the hardware steps) on every read, as the driver polls."""
        self._step()
        if self.dma_base <= address < self.dma_base + 0x10000:
            value = self._dma_read(address - self.dma_base)
        else:
            offset = address - self.rmm_base
            value = self.register_overrides.get(offset)
            if value is None:
                value = int(self.engine.read_register(offset))
        self.bus_log.append(("r", address, value))
        return value & 0xFFFFFFFF

    def bus_write(self, address: int, value: int) -> None:
        """One 32-bit write."""
        self.bus_log.append(("w", address, value))
        if self.dma_base <= address < self.dma_base + 0x10000:
            self._dma_write(address - self.dma_base, value & 0xFFFFFFFF)
        else:
            self.engine.write_register(address - self.rmm_base, value & 0xFFFFFFFF)

    # -- the AXI DMA -----------------------------------------------------------------------------------

    def _channel_at(self, offset: int) -> tuple[_Channel, int]:
        name = MM2S if offset < CHANNEL_BASE[S2MM] else S2MM
        return self.channels[name], offset - CHANNEL_BASE[name]

    def _dma_read(self, offset: int) -> int:
        ch, reg = self._channel_at(offset)
        if reg == CR:
            return ch.cr | (RESET if self._reset_reads > 0 else 0)
        if reg == SR:
            return ch.sr | (SG_INCLD if self.scatter_gather else 0)
        if reg == ADDR:
            return ch.addr
        if reg == ADDR_MSB:
            return ch.addr_msb
        if reg == LENGTH:
            return ch.length
        return 0

    def _dma_write(self, offset: int, value: int) -> None:
        ch, reg = self._channel_at(offset)
        if reg == CR:
            if value & RESET:  # a soft reset of either channel resets the whole core
                for c in self.channels.values():
                    c.cr, c.sr, c.active, c.length = 0, HALTED, None, 0
                self._reset_reads = 3
                return
            ch.cr = value
            if value & RS and not ch.sr & (INT_ERR | SLV_ERR | DEC_ERR):
                ch.sr &= ~HALTED
            elif not value & RS and ch.active is None:
                ch.sr |= HALTED
        elif reg == SR:
            ch.sr &= ~(value & W1C)
        elif reg == ADDR:
            ch.addr = value
        elif reg == ADDR_MSB:
            ch.addr_msb = value
        elif reg == LENGTH:
            self._start(ch, value & ((1 << self.length_width) - 1))

    def _start(self, ch: _Channel, nbytes: int) -> None:
        if not ch.cr & RS or ch.sr & HALTED:
            return  # a halted channel ignores LENGTH
        ch.length = nbytes
        ch.started += 1
        address = ch.addr | (ch.addr_msb << 32 if self.addr_width > 32 else 0)
        if nbytes == 0 or address % 8:
            ch.fail(INT_ERR)
            return
        ch.sr &= ~IDLE
        ch.active = {"address": address, "nbytes": nbytes, "done": 0}
        if ch.name in self._inject:
            ch.fail(self._inject.pop(ch.name))

    def _step(self) -> None:
        """One step of the hardware: MM2S feeds the RMM, the RMM runs, S2MM takes one packet."""
        if self._reset_reads:
            self._reset_reads -= 1
        mm2s, s2mm = self.channels[MM2S], self.channels[S2MM]
        if mm2s.active is not None and MM2S not in self.stall:
            t = mm2s.active
            words = min(self.beats_per_step, self.rmm.room(), (t["nbytes"] - t["done"]) // 8)
            if words:
                ddr = self._ddr(t["address"] + t["done"], 8 * words)
                if ddr is None:
                    mm2s.fail(DEC_ERR)
                else:
                    self.rmm.fifo.extend(int(w) for w in ddr.view(np.uint64))
                    t["done"] += 8 * words
            if mm2s.active is not None and t["done"] >= t["nbytes"]:
                mm2s.complete()
        self.rmm.step()
        if s2mm.active is not None and S2MM not in self.stall and self.rmm.out:
            t = s2mm.active
            packet = self.rmm.out.popleft()
            if self._corrupt:
                packet = (
                    packet[: self._corrupt]
                    if self._corrupt < 0
                    else np.concatenate([packet, np.zeros(self._corrupt, np.uint64)])
                )
                self._corrupt = 0
            nbytes = min(8 * len(packet), t["nbytes"])
            ddr = self._ddr(t["address"], nbytes)
            if ddr is None:
                s2mm.fail(DEC_ERR)
            else:
                ddr[:] = packet.view(np.uint8)[:nbytes]
                if 8 * len(packet) > t["nbytes"]:  # no TLAST within the transfer
                    s2mm.fail(INT_ERR)
                else:
                    s2mm.length = 8 * len(packet)
                    s2mm.complete()

    # -- faults ------------------------------------------------------------------------------------------

    def inject_error(self, channel: str, bits: int) -> None:
        """The next transfer ``channel`` starts fails with the DMASR error ``bits`` (e.g. DMASlvErr)."""
        self._inject[channel] = bits

    def corrupt_next_packet(self, words: int) -> None:
        """The next response packet is ``words`` longer (positive) or shorter (negative: TLAST too early)."""
        self._corrupt = words

    def transfers(self) -> tuple[int, int]:
        """Transfers started so far: (MM2S, S2MM)."""
        return self.channels[MM2S].started, self.channels[S2MM].started


__all__ = ["DMA_TYPE", "RMM_TYPE", "FakeBoard", "RegisterWindow"]
