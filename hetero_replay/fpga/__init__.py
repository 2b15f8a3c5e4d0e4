"""The FPGA Replay Management Module (RMM): its fixed-point format, stream protocol and ports.

* :mod:`~hetero_replay.fpga.fixed_point`: priorities as 32-bit leaves with 22 fraction bits;
* :mod:`~hetero_replay.fpga.protocol`: the command / response words and the AXI-Lite registers;
* :mod:`~hetero_replay.fpga.reference`: the quantised NumPy reference of the kernel;
* :mod:`~hetero_replay.fpga.emulator`: the HLS source compiled with g++ (device ``"fpga:emu"``);
* :mod:`~hetero_replay.fpga.board`: a PYNQ board (device ``"fpga:0"``; the ``fpga`` extra);
* :mod:`~hetero_replay.fpga.cycle_model`: cycles per command, on-chip capacity per part, time per call
  (the advisor's predicted-only FPGA entries).

:class:`~hetero_replay.trees.fpga_tree.FpgaSumTree` is the sum tree over any of these ports
(``make_tree("fpga")``).
"""
