"""The on-disk format of a replay buffer: a ZIP of ``.npy`` arrays plus a JSON header.

* Not pickle: loading a file never runs code from it.
* Atomic: written to a temporary file in the same directory, flushed to disk,
  then renamed over the target, so a crash mid-save leaves the previous file.
* Checked: ZIP CRCs catch corrupted bytes, the header's manifest catches
  missing or reshaped arrays; any of these raises :class:`ReplayFileError`.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

FORMAT = "hetero-replay"
VERSION = 1
_HEADER = "header.json"


class ReplayFileError(ValueError):
    """A replay file that is corrupt, truncated, of another format or version."""


def write(path: str | os.PathLike[str], header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Atomically write ``header`` (JSON-serialisable) and ``arrays`` to ``path``."""
    path = Path(path)
    manifest = {name: {"dtype": a.dtype.str, "shape": list(a.shape)} for name, a in arrays.items()}
    full_header = {"format": FORMAT, "version": VERSION, **header, "arrays": manifest}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as raw:
            with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
                zf.writestr(_HEADER, json.dumps(full_header, indent=1))
                for name, arr in arrays.items():
                    with zf.open(f"arrays/{name}.npy", "w", force_zip64=True) as f:
                        np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and verify a file written by :func:`write`; return ``(header, arrays)``."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path, "r") as zf:
            header = _read_header(zf, path)
            arrays = {name: _read_array(zf, name, spec, path) for name, spec in header["arrays"].items()}
    except zipfile.BadZipFile as e:
        raise ReplayFileError(f"{path}: not a readable replay file (truncated or corrupt: {e})") from e
    return header, arrays


def _read_header(zf: zipfile.ZipFile, path: Path) -> dict[str, Any]:
    try:
        header = json.loads(zf.read(_HEADER))
    except KeyError as e:
        raise ReplayFileError(f"{path}: no {_HEADER}; not a {FORMAT} file") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReplayFileError(f"{path}: unreadable header ({e})") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ReplayFileError(f"{path}: not a {FORMAT} file")
    if header.get("version") != VERSION:
        raise ReplayFileError(
            f"{path}: format version {header.get('version')!r}, this library reads version {VERSION}"
        )
    if not isinstance(header.get("arrays"), dict):
        raise ReplayFileError(f"{path}: header has no array manifest")
    return header


def _read_array(zf: zipfile.ZipFile, name: str, spec: Mapping[str, Any], path: Path) -> np.ndarray:
    member = f"arrays/{name}.npy"
    try:
        with zf.open(member) as f:
            arr = np.lib.format.read_array(f, allow_pickle=False)
    except KeyError as e:
        raise ReplayFileError(f"{path}: array {name!r} is missing") from e
    except (ValueError, EOFError, OSError) as e:
        raise ReplayFileError(f"{path}: array {name!r} is unreadable ({e})") from e
    if arr.dtype.str != spec.get("dtype") or list(arr.shape) != list(spec.get("shape", [])):
        raise ReplayFileError(
            f"{path}: array {name!r} is {arr.dtype.str}{list(arr.shape)}, "
            f"the header says {spec.get('dtype')}{spec.get('shape')}"
        )
    return arr


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories can't be opened."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
