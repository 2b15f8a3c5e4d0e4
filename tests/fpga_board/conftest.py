"""Fixtures of the board-driver tests: a fake PYNQ board served by the RMM emulation, and an overlay for it.

These tests run in their own environment (``make test-fpga-board``: ``.venv-fpga``
with ``pynq==4.0.0``, which pins ``numpy<2``), on their own: the main
``tests/conftest.py`` is neither needed nor loaded (``--confcutdir``, and the
main suite's ``collect_ignore``); ``test_isolation.py`` checks that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynq  # the fpga environment has it; a missing pynq must fail here, loudly
import pytest
from fake_board import FakeBoard
from pynq import Device

from hetero_replay.fpga.board import BITFILE_ENV

#: The .hwh of the fake overlay: only what the driver reads from it (the part).
HWH = """<?xml version="1.0" encoding="UTF-8"?>
<EDKSYSTEM EDWVERSION="1.2" TIMESTAMP="Thu Jan  1 00:00:00 2026" VIVADOVERSION="2024.2">
  <SYSTEMINFO ARCH="zynquplus" BOARD="xilinx.com:kv260_som:part0:1.4" DEVICE="xck26" NAME="rmm"
              PACKAGE="sfvc784" SPEEDGRADE="-2LV"/>
</EDKSYSTEM>
"""
#: The part the driver must name (DEVICE-PACKAGE plus SPEEDGRADE of the .hwh above).
PART = "xck26-sfvc784-2LV"


def emulation_engine(capacity: int, fanout: int) -> Any:
    """The RMM engine of the fake board: the HLS source compiled with g++ (``hetero_replay._rmm_emu``)."""
    from hetero_replay import _rmm_emu

    return _rmm_emu.Rmm(capacity, fanout)


@pytest.fixture
def bitfile(tmp_path: Path) -> Path:
    """An overlay on disk: a (dummy) ``rmm.bit`` with its ``rmm.hwh``."""
    bit = tmp_path / "rmm.bit"
    bit.write_bytes(b"\x00" * 16)
    (tmp_path / "rmm.hwh").write_text(HWH)
    return bit


@pytest.fixture
def make_board(monkeypatch: pytest.MonkeyPatch, bitfile: Path) -> Iterator[Callable[..., FakeBoard]]:
    """``make_board(**kwargs)``: a :class:`FakeBoard` set as pynq's active device, ``$HETERO_REPLAY_FPGA_BITFILE`` set.

    pynq's previous active device is restored afterwards.
    """
    had = "_active_device" in vars(Device)
    previous = vars(Device).get("_active_device")
    monkeypatch.setenv(BITFILE_ENV, str(bitfile))

    def make(**kwargs: Any) -> FakeBoard:
        kwargs.setdefault("engine_factory", emulation_engine)
        board = FakeBoard(**kwargs)
        Device.active_device = board
        return board

    yield make
    if had:
        Device.active_device = previous
    elif "_active_device" in vars(Device):
        del Device._active_device


@pytest.fixture
def board(make_board: Callable[..., FakeBoard]) -> FakeBoard:
    """A fake board with the default overlay (fanout 16, MEMORY_MAPPED registers)."""
    return make_board()


assert pynq.__version__ == "4.0.0", f"the board tests pin pynq 4.0.0, found {pynq.__version__}"
