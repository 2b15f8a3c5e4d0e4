"""The way in: what a user's ``pip install .`` fetches, what ``info`` reports, and how messages say to install an extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hetero_replay.registry import install_hint

ROOT = Path(__file__).resolve().parents[1]
FETCH = ROOT / "hls" / "fetch_ap_types.py"
#: No network: a proxy nobody listens on, and pip without an index.
OFFLINE = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "PIP_NO_INDEX": "1"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _installed_hls4ml(site: Path, version: str) -> None:
    """An installed hls4ml as pip leaves one: the package (only the headers' folder) and its dist-info."""
    headers = site / "hls4ml" / "templates" / "vivado" / "ap_types"
    headers.mkdir(parents=True)
    (site / "hls4ml" / "__init__.py").write_text("raise ImportError('the build must not import hls4ml')\n")
    for name in ("ap_int.h", "hls_stream.h", "ap_fixed.h"):
        (headers / name).write_text(f"// {name}\n")
    info = site / f"hls4ml-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hls4ml\nVersion: {version}\n")


def _fetch(dest: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(site)}
    env.pop("HETERO_REPLAY_HLS4ML_WHEEL", None)
    return subprocess.run([sys.executable, str(FETCH), str(dest)], capture_output=True, text=True, env=env, timeout=120)


def test_the_headers_come_from_the_build_requirement_offline(tmp_path: Path) -> None:
    """In ``pip install .`` hls4ml is a build requirement pip installed: the script copies, and downloads nothing."""
    requires = _pyproject()["tool"]["scikit-build"]["build"]["requires"]
    assert requires == ["hls4ml==1.3.0", "blosc2==4.14.1"]  # blosc2: the codecs' static C-Blosc2
    _installed_hls4ml(tmp_path / "site", "1.3.0")
    proc = _fetch(tmp_path / "ap_types", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ap_types" / "ap_int.h").read_text() == "// ap_int.h\n"
    assert (tmp_path / "ap_types" / "hls_stream.h").is_file()


def test_another_hls4ml_release_is_not_used_and_nothing_bypasses_pip(tmp_path: Path) -> None:
    """Only the pinned release counts; without it the one other route is pip (offline here: it fails, and says how)."""
    _installed_hls4ml(tmp_path / "site", "1.2.0")
    proc = _fetch(tmp_path / "ap_types", tmp_path / "site")
    assert proc.returncode == 1
    assert not (tmp_path / "ap_types").exists()
    assert "HETERO_REPLAY_FPGA_EMU=OFF pip install ." in proc.stderr
    assert "urllib" not in FETCH.read_text()  # no download that ignores pip's index settings


def test_user_builds_leave_werror_and_the_emulation_to_options() -> None:
    """``-Werror`` only where asked (dev, CI); HETERO_REPLAY_FPGA_EMU=OFF drops the emulation and its requirement (hls4ml)."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    skbuild = cmake[cmake.index("if(DEFINED SKBUILD)") :]
    assert re.search(r'option\(HETERO_REPLAY_WERROR "[^"]*" OFF\)', skbuild.split("else()")[0])
    assert "-C cmake.define.HETERO_REPLAY_WERROR=ON" in (ROOT / "Makefile").read_text()
    (override,) = _pyproject()["tool"]["scikit-build"]["overrides"]
    pattern = override["if"]["env"]["HETERO_REPLAY_FPGA_EMU"]
    assert [v for v in ("OFF", "0", "false", "on", "1", "") if re.search(pattern, v)] == ["OFF", "0", "false"]
    # Without the emulation, hls4ml is no longer required; the codecs' blosc2 still is.
    assert override["build"]["requires"] == ["blosc2==4.14.1"]
    assert override["cmake"]["define"] == {"HETERO_REPLAY_FPGA_EMU": "OFF"}


def _info(*, without_emulation: bool) -> str:
    block = "import sys; sys.modules['hetero_replay._rmm_emu'] = None; " if without_emulation else ""
    code = block + "from hetero_replay.apps.cli import main; main(['info'])"
    env = {k: v for k, v in os.environ.items() if k != "HETERO_REPLAY_FPGA_BITFILE"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.strip().startswith("fpga ")]
    return line


def test_info_reports_the_emulation_only_when_it_was_built() -> None:
    """A build without ``_rmm_emu`` (HETERO_REPLAY_FPGA_EMU=OFF) does not claim that tree='fpga' runs it."""
    pytest.importorskip("hetero_replay._rmm_emu")
    assert "tree='fpga' runs the emulation" in _info(without_emulation=False)
    line = _info(without_emulation=True)
    assert "built without the emulation" in line
    assert "runs the emulation" not in line


def test_install_hints_name_a_command_that_runs() -> None:
    """hetero-replay is not on PyPI: every hint installs the extra from a checkout, and names an extra that exists."""
    assert install_hint("ray") == "pip install '.[ray]' in a hetero-replay source checkout (the 'ray' extra)"
    extras = set(_pyproject()["project"]["optional-dependencies"])
    sources = [p for d in ("hetero_replay", "adapters", "apps") for p in (ROOT / d).rglob("*.py")]
    named = set()
    for path in sources:
        text = path.read_text()
        if path.name != "registry.py":
            assert "hetero-replay[" not in text, (
                f"{path.relative_to(ROOT)} tells users to install an unpublished package"
            )
        named |= set(re.findall(r"install_hint\(['\"](\w+)['\"]\)", text))
    assert named and named <= extras, named - extras
