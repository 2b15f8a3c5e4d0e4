"""The emulation port: the RMM's HLS source compiled with g++ into ``hetero_replay._rmm_emu``.

:class:`EmulatedRmm` is an :class:`~hetero_replay.fpga.protocol.RmmPort` with
device ``"fpga:emu"``: the same command words a board's DMA carries go
through the same C++ the HLS tool synthesises, so a tree over it computes
what the hardware would, bit for bit (the C simulation test bench and
``tests/test_fpga_tree.py`` check both against
:class:`~hetero_replay.fpga.reference.ReferenceRmm`). It also exposes the
simulation's per-stage firing counters, which the cycle model is checked
against.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np

from hetero_replay.fpga import protocol as P

#: The device name of the emulation.
EMULATED_DEVICE = "fpga:emu"


@functools.lru_cache(maxsize=1)
def _module() -> Any:
    try:
        return importlib.import_module("hetero_replay._rmm_emu")
    except ImportError as e:
        raise ImportError(
            "the FPGA emulation (device 'fpga:emu') needs the extension module hetero_replay._rmm_emu, "
            f"built with the package from hls/ (reinstall hetero-replay from source); importing it failed: {e}"
        ) from e


def emulation_unavailable() -> str | None:
    """``None`` when the emulation module imports here, else why not."""
    try:
        _module()
    except ImportError as e:
        return str(e)
    return None


class EmulatedRmm:
    """An RMM of ``capacity`` leaves and ``fanout`` children per node, simulated in C++ (CLEARed at start).

    Raises:
        ImportError: the emulation module is not built.
        TypeError, ValueError: a capacity or fanout the kernel does not take
            (:func:`~hetero_replay.fpga.protocol.check_shape`).
    """

    device = EMULATED_DEVICE

    def __init__(self, capacity: int, fanout: int = 16) -> None:
        self._rmm = _module().Rmm(*P.check_shape(capacity, fanout))

    @property
    def capacity(self) -> int:
        return int(self._rmm.capacity)

    @property
    def fanout(self) -> int:
        return int(self._rmm.fanout)

    @property
    def depth(self) -> int:
        return int(self._rmm.depth)

    def run(self, commands: Any) -> np.ndarray:
        """Back-to-back command words in, every response word out (the GIL is released meanwhile)."""
        return np.asarray(self._rmm.run(P.command_words(commands)), np.uint64)

    def read_register(self, offset: int) -> int:
        return int(self._rmm.read_register(P.check_register(offset)))

    def write_register(self, offset: int, value: int) -> None:
        self._rmm.write_register(*P.check_register_write(offset, value))

    def counters(self) -> dict[str, int]:
        """Firings per pipeline stage, the ``"cycles"`` estimate and ``"fifo_max:<stream>"`` occupancies."""
        return dict(self._rmm.counters())

    def reset_counters(self) -> None:
        self._rmm.reset_counters()

    def __repr__(self) -> str:
        return f"EmulatedRmm(capacity={self.capacity}, fanout={self.fanout})"


__all__ = ["EMULATED_DEVICE", "EmulatedRmm", "emulation_unavailable"]
