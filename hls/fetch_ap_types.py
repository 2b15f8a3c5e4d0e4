"""Fetch the Xilinx arbitrary-precision headers (ap_int.h, hls_stream.h, ...) into a build directory.

The RMM's HLS source (hls/src/) compiles with g++ against these headers, for the
C-simulation test bench (hls/tb/) and the emulation module hetero_replay._rmm_emu.
They are Apache-2.0 and ship inside the PyPI wheel of hls4ml, under
``hls4ml/templates/vivado/ap_types/``; this script downloads that wheel at a pinned
version, checks its sha256 and extracts only that folder. The headers are never
copied into the repository.

    python hls/fetch_ap_types.py DEST

DEST receives the folder's contents (ap_int.h at DEST/ap_int.h) and a marker file;
a later run with the marker present does nothing. The wheel comes from
``python -m pip download`` when pip is importable, else (e.g. inside
scikit-build-core's isolated build environment) straight from PyPI with urllib;
HETERO_REPLAY_HLS4ML_WHEEL may name an already downloaded copy of the wheel
(offline builds). Any failure exits with status 1 and one paragraph on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

PACKAGE = "hls4ml"
VERSION = "1.3.0"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
#: sha256 of the wheel as PyPI lists it (https://pypi.org/pypi/hls4ml/json, release 1.3.0).
WHEEL_SHA256 = "01bf1de2cd9bca56699b9fe3385cb1735026b022f9580fe1d73faf192dfb90f2"
WHEEL_URL = (
    "https://files.pythonhosted.org/packages/8a/0e/8bd7715acf09fc926facee273ef2d0c21caa3e091b9fb20801efbe4bcfc0/"
    + WHEEL
)
PROJECT_JSON = f"https://pypi.org/pypi/{PACKAGE}/json"
FOLDER = "hls4ml/templates/vivado/ap_types/"
#: Headers the RMM includes; their absence after extraction means the wheel changed layout.
REQUIRED = ("ap_int.h", "hls_stream.h")
MARKER = ".hetero_replay_ap_types"
WHEEL_ENV = "HETERO_REPLAY_HLS4ML_WHEEL"
TIMEOUT_S = 120


class FetchError(Exception):
    """A step of the fetch failed; the message says which and why."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip_download(tmp: Path) -> Path:
    """The wheel through ``python -m pip download`` (honours the user's index, proxy and certificates)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    cmd += ["--dest", str(tmp), f"{PACKAGE}=={VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S * 3)
    wheel = tmp / WHEEL
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(f"`pip download {PACKAGE}=={VERSION}` failed ({' / '.join(tail) or 'no output'})")
    return wheel


def _urlopen_bytes(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 (https URLs only)
        return response.read()


def _url_download(tmp: Path) -> Path:
    """The wheel straight from PyPI: its pinned file URL, else the URL the JSON API lists for the release."""
    wheel = tmp / WHEEL
    errors = []
    urls = [WHEEL_URL]
    try:
        release = json.loads(_urlopen_bytes(PROJECT_JSON))["releases"][VERSION]
        urls += [f["url"] for f in release if f.get("filename") == WHEEL and f["url"] != WHEEL_URL]
    except Exception as e:  # the pinned URL may still work
        errors.append(f"{PROJECT_JSON}: {e}")
    for url in urls:
        try:
            wheel.write_bytes(_urlopen_bytes(url))
            return wheel
        except Exception as e:
            errors.append(f"{url}: {e}")
    raise FetchError("downloading the wheel from PyPI failed (" + "; ".join(errors) + ")")


def _get_wheel(tmp: Path) -> Path:
    local = os.environ.get(WHEEL_ENV)
    if local:
        if not Path(local).is_file():
            raise FetchError(f"{WHEEL_ENV}={local} is not a file")
        return Path(local)
    errors = []
    if importlib.util.find_spec("pip") is not None:
        try:
            return _pip_download(tmp)
        except (FetchError, OSError, subprocess.SubprocessError) as e:
            errors.append(str(e))
    try:
        return _url_download(tmp)
    except FetchError as e:
        errors.append(str(e))
    raise FetchError("; then ".join(errors))


def _extract(wheel: Path, staging: Path) -> None:
    """Only ``FOLDER``'s files, with that prefix stripped; nothing outside ``staging``."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.infolist() if m.filename.startswith(FOLDER) and not m.is_dir()]
        if not members:
            raise FetchError(f"{wheel.name} has no folder {FOLDER}")
        root = staging.resolve()
        for m in members:
            target = (staging / m.filename[len(FOLDER) :]).resolve()
            if root not in target.parents:
                raise FetchError(f"{wheel.name}: refusing the member {m.filename!r} (outside the folder)")
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(m) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    missing = [h for h in REQUIRED if not (staging / h).is_file()]
    if missing:
        raise FetchError(f"{wheel.name}'s {FOLDER} lacks {', '.join(missing)}")


def fetch(dest: Path) -> bool:
    """Populate ``dest``; ``False`` when it already was (marker present). Raises FetchError."""
    marker = dest / MARKER
    if marker.is_file() and marker.read_text().strip() == WHEEL_SHA256 and all((dest / h).is_file() for h in REQUIRED):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ap_types-", dir=dest.parent) as tmp_name:
        tmp = Path(tmp_name)
        wheel = _get_wheel(tmp)
        digest = _sha256(wheel)
        if digest != WHEEL_SHA256:
            raise FetchError(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256} (a different or corrupted file)")
        staging = tmp / "ap_types"
        staging.mkdir()
        _extract(wheel, staging)
        (staging / MARKER).write_text(WHEEL_SHA256 + "\n")
        # Replace DEST in one rename, so an interrupted run never leaves a half folder behind a marker.
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    return True


def main(argv: list[str] | None = None) -> int:
    """Command line: ``fetch_ap_types.py DEST``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="directory to receive the headers (ap_int.h lands at DEST/ap_int.h)")
    args = parser.parse_args(argv)
    try:
        fetched = fetch(args.dest)
    except (FetchError, OSError, zipfile.BadZipFile) as e:
        print(
            f"fetch_ap_types: could not get the Xilinx arbitrary-precision headers (ap_int.h, hls_stream.h) that the "
            f"FPGA emulation and its C-simulation test bench compile against: {e}. They come from the wheel "
            f"{WHEEL} on PyPI, fetched at build time. To fix: give this machine access to PyPI (set HTTPS_PROXY / "
            f"pip's index-url if you are behind a proxy or mirror), or download that wheel elsewhere and point "
            f"{WHEEL_ENV} at it; or build without the emulation: pip install with "
            f'CMAKE_ARGS="-DHETERO_REPLAY_FPGA_EMU=OFF" (cmake: -DHETERO_REPLAY_FPGA_EMU=OFF), which leaves out '
            f"hetero_replay._rmm_emu and the tree backend 'fpga' on device 'fpga:emu'.",
            file=sys.stderr,
        )
        return 1
    print(f"fetch_ap_types: {'extracted' if fetched else 'already present:'} {FOLDER} of {WHEEL} -> {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
