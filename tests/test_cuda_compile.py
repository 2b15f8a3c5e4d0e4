"""The CUDA kernels compile (no GPU needed): every .cu file with nvcc for sm_80
and sm_90 with every template instance, and through NVRTC with the options CuPy
uses at run time; and their sources ship with the installed package."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hetero_replay._native as native
from hetero_replay.trees.base import FANOUTS
from hetero_replay.trees.cupy_tree import _KERNELS, KERNEL_FILES, kernel_name, kernel_source_dir, nvrtc_options

ROOT = kernel_source_dir()
CU_FILES = sorted((ROOT / "cuda").glob("*.cu"))
NVCC = shutil.which("nvcc")
ARCHS = ("80", "90")


def test_every_kernel_file_is_loaded():
    """A new .cu file must be listed in KERNEL_FILES, or CuPy would never load it."""
    assert sorted(p.name for p in CU_FILES) == sorted(KERNEL_FILES.values())


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the CUDA kernels cannot be compile-checked here")
def test_every_kernel_file_compiles_with_nvcc(tmp_path):
    """All template instances (HR_INSTANTIATE_ALL), sm_80 and sm_90, nvcc warnings as errors."""
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]

    def compile_one(src: Path) -> subprocess.CompletedProcess:
        cmd = [
            NVCC,
            "-std=c++17",
            "-Werror",
            "all-warnings",
            "-DHR_INSTANTIATE_ALL",
            f"-I{ROOT}",
            *gencode,
            "-c",
            str(src),
            "-o",
            str(tmp_path / f"{src.stem}.o"),
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(CU_FILES, pool.map(compile_one, CU_FILES), strict=True))
    for src, result in results.items():
        assert result.returncode == 0, f"{src.name} does not compile:\n{result.stderr[-4000:]}"
        assert (tmp_path / f"{src.stem}.o").stat().st_size > 0


def _libnvrtc() -> ctypes.CDLL | None:
    """NVRTC from the system or from the nvidia-cuda-nvrtc wheel, if either is installed."""
    candidates = [ctypes.util.find_library("nvrtc")]
    for site in sys.path:
        candidates += sorted(glob.glob(f"{site}/nvidia/cuda_nvrtc/lib/libnvrtc.so*"))
        candidates += sorted(glob.glob(f"{site}/nvidia/cu*/lib/libnvrtc.so*"))
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    for path in filter(None, candidates):
        if "builtins" in path or ".alt." in path:
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


NVRTC = _libnvrtc()


def nvrtc_compile(source: Path, names: list[str]) -> tuple[int, str, list[str]]:
    """Compile like CuPy's RawModule does: returns (result code, log, lowered names)."""
    prog = ctypes.c_void_p()
    code = source.read_text().encode()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(prog), code, source.name.encode(), 0, None, None) == 0
    try:
        for name in names:
            assert NVRTC.nvrtcAddNameExpression(prog, name.encode()) == 0
        options = [*nvrtc_options(ROOT), "-arch=compute_80", "--device-as-default-execution-space"]
        argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        result = NVRTC.nvrtcCompileProgram(prog, len(options), argv)
        size = ctypes.c_size_t()
        NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        NVRTC.nvrtcGetProgramLog(prog, log)
        lowered = []
        if result == 0:
            for name in names:
                out = ctypes.c_char_p()
                NVRTC.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out))
                lowered.append(out.value.decode())
        return result, log.value.decode(), lowered
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.skipif(
    NVRTC is None, reason="libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12): the run-time compile is not checked"
)
@pytest.mark.parametrize("module, filename", sorted(KERNEL_FILES.items()))
def test_kernels_compile_with_nvrtc_as_cupy_loads_them(module, filename):
    """NVRTC has no standard headers: this is what catches a kernel that only nvcc can build."""
    names = [
        kernel_name(k, dtype, k_)
        for k, (m, _) in _KERNELS.items()
        if m == module
        for dtype in ("float32", "float64")
        for k_ in FANOUTS
    ]
    names = sorted(set(names))
    result, log, lowered = nvrtc_compile(ROOT / "cuda" / filename, names)
    assert result == 0, log
    assert len(lowered) == len(names) and all(lowered)


def test_kernel_sources_ship_with_the_package():
    """The install rule puts the sources next to the extension, where CuPy is pointed at them."""
    installed = Path(native.__file__).resolve().parent / "_csrc"
    for rel in [
        *(f"cuda/{f}" for f in KERNEL_FILES.values()),
        "cuda/common.cuh",
        "cuda/nvrtc_std/cmath",
        "cuda/nvrtc_std/cstdint",
        "hetero_replay/batch_items.hpp",
        "hetero_replay/descent.hpp",
    ]:
        assert (installed / rel).is_file(), f"{rel} is not installed under {installed}"
