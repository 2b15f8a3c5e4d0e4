"""The on-disk format of a replay buffer: a ZIP of ``.npy`` arrays plus a JSON header.

One format for every file a buffer writes: ``PrioritizedReplay.save`` (the
whole buffer), and the durable points of the ``"disk"`` storage and of the
Tianshou buffers (:mod:`hetero_replay.storage.durable`). It is part of the
storage layer, below every buffer that writes it.

* Not pickle: loading a file never runs code from it.
* Atomic: written to a temporary file in the same directory, flushed to disk,
  then renamed over the target, so a crash mid-save leaves the previous file.
  The temporary is named ``.{target}.{pid}.{random}.tmp`` and ``flock``-ed by
  its writer; the next save of the same target removes the temporaries that
  no live writer holds (left behind by a save that was killed).
* Permissions: the file gets ``0o666 & ~umask``, like any file ``open()`` creates.
* Checked: :func:`read` trusts nothing in the file. Members must be stored
  (not compressed, not encrypted), lie inside the file and not overlap; the
  header must be JSON of bounded size and nesting, of the expected types and
  within the format's bounds; every array's ``.npy`` header must match the
  manifest, and its declared bytes must be exactly what its member holds, so
  reading allocates no more than the file's own size; the arrays must agree
  with the header's size and schema. ZIP CRCs catch changed bytes. Whatever is
  wrong raises :class:`ReplayFileError`.
* Compressed fields (format version 2, :data:`COMPRESSED`): a storage's
  compressed records are saved as they are, as arrays (one of the records back
  to back and one of their offsets per field, or the distinct frames and each
  row's references to them), with the codec settings in the header. Here they
  are checked like any array (the manifest, dtypes, shapes); their values
  (offsets, references, every record's CRC-32C and chunk) where they are read
  into a storage (:meth:`~hetero_replay.storage.codec.CompressedFields.adopt`),
  which a state dict goes through too; ``PrioritizedReplay.load`` raises those
  errors as :class:`ReplayFileError`. A file without compressed fields is
  written as version 1, which older readers read.

What :func:`read` does not bound is the memory of the buffer the header
describes: capacity 10**9 with ten transitions stored is a valid 2 KB file,
and its sum tree takes gigabytes when the buffer is built. Capacities beyond
:data:`MAX_CAPACITY` (and storage beyond :data:`MAX_STORAGE_BYTES`) are
refused, being beyond any machine; below that, a buffer too big for this
machine fails when it is built, with ``MemoryError``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import reprlib
import secrets
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from hetero_replay.checks import is_int, is_real
from hetero_replay.storage.codec import packed_layout, parse_settings
from hetero_replay.storage.files import check_parents
from hetero_replay.storage.schema import PLAIN_KINDS, Schema
from hetero_replay.trees.base import MAX_CAPACITY

try:
    import fcntl
except ImportError:  # not POSIX: no locks, so abandoned temporaries are left alone
    fcntl = None  # type: ignore[assignment]

FORMAT = "hetero-replay"
#: The format's version. Version 2 added compressed fields (:data:`COMPRESSED`); a file without
#: them is written as version 1, which it is, so that older readers read it.
VERSION = 2
_VERSIONS = (1, 2)
_HEADER = "header.json"

# Bounds on what a file may declare. They are far beyond any real buffer, so
# they only refuse files that no machine could have written, before the
# numbers reach an allocation. (MAX_CAPACITY, 2**40, is the trees' own bound:
# a sum tree of 2**40 float32 leaves alone is 4 TiB.)
#: Largest ``header.json``, in bytes; :func:`write` refuses to write a bigger one.
MAX_HEADER_BYTES = 16 << 20
#: Largest ``capacity * bytes per transition``: 128 TiB, all the address space x86-64 and
#: arm64 give a process, so also the largest any array dimension may be.
MAX_STORAGE_BYTES = 1 << 47
#: Most dimensions of one transition field (NumPy allows 64 per array, storage adds one).
MAX_FIELD_DIMS = 32

#: ``header["rows"]`` of a ring storage's durable state: rows are in the ring's files, the
#: arrays are every slot's priority and stamp (see :mod:`hetero_replay.storage.disk`).
RING_ROWS = "ring"
#: The header section of a file whose storage keeps fields compressed: their codec settings
#: (:meth:`~hetero_replay.storage.codec.CompressedFields.settings`); their records are the arrays
#: ``compressed/{name}`` (:func:`~hetero_replay.storage.codec.packed_layout`), kept as they are.
COMPRESSED = "compressed"
#: The header section of a durable point: its schedule's settings and counts
#: (see :class:`hetero_replay.storage.durable.FlushSchedule`); absent from a saved buffer.
DURABLE = "durable"
_CONFIG_KEYS = ("capacity", "alpha", "beta", "eps", "fanout", "priority_dtype", "stratified", "schema")
_READ_CHUNK = 16 << 20
# A ZIP entry's general-purpose flags that this reader must refuse: encrypted (bit 0),
# compressed patch data (bit 5), strong encryption (bit 6).
_UNSUPPORTED_FLAGS = 0x01 | 0x20 | 0x40


class ReplayFileError(ValueError):
    """A replay file that is corrupt, truncated, hostile, of another format or version."""


# -- writing ------------------------------------------------------------------------------


def write(path: str | os.PathLike[str], header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Atomically write ``header`` (JSON-serialisable) and ``arrays`` to ``path``.

    Before writing, removes the temporaries of earlier saves of ``path`` that
    were killed mid-write (see :func:`remove_stale_temporaries`).

    Raises:
        ValueError: the header would be larger than :data:`MAX_HEADER_BYTES`
            (:func:`read` would refuse the file), or a directory above ``path``
            is another user's to change (:func:`~hetero_replay.storage.files.check_parents`).
    """
    path = Path(path)
    check_parents(path, "path")
    manifest = {name: {"dtype": a.dtype.str, "shape": list(a.shape)} for name, a in arrays.items()}
    version = VERSION if COMPRESSED in header else 1
    full_header = {"format": FORMAT, "version": version, **header, "arrays": manifest}
    header_bytes = json.dumps(full_header, indent=1).encode()
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise ValueError(f"replay header of {len(header_bytes)} bytes; a file may hold at most {MAX_HEADER_BYTES}")
    remove_stale_temporaries(path)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as raw:
            with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
                zf.writestr(_HEADER, header_bytes)
                for name, arr in arrays.items():
                    with zf.open(f"arrays/{name}.npy", "w", force_zip64=True) as f:
                        np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
            raw.flush()
            os.fsync(raw.fileno())
            if fcntl is not None:
                # Renamed while still open, so still locked: between a close and a
                # rename, another save would take this temporary for abandoned.
                os.replace(tmp, path)
        if fcntl is None:
            os.replace(tmp, path)  # (Windows cannot rename an open file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _temporary_pattern(path: Path) -> re.Pattern[str]:
    """Names of ``path``'s temporaries: ``.{name}.{pid}.{16 hex digits}.tmp``; group 1 is the pid."""
    return re.compile(rf"\.{re.escape(path.name)}\.(\d{{1,10}})\.[0-9a-f]{{16}}\.tmp")


def _create_temporary(path: Path) -> tuple[int, str]:
    """Create, open and lock a new temporary beside ``path``; return its descriptor and name."""
    while True:
        tmp = str(path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        # Mode 0o666 through the umask, as open() would; mkstemp's 0o600 would make
        # every saved buffer private whatever the user asked for.
        # Exclusive and not through a link: a name planted in a shared directory is never written through.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(tmp, flags | getattr(os, "O_BINARY", 0), 0o666)
        if fcntl is None:
            return fd, tmp
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (NFS without lockd): no save can lock it either
            return fd, tmp
        # Another save may have taken this file for abandoned between its creation
        # and our lock (it locks, unlinks, then unlocks): if so it is gone, start again.
        if os.fstat(fd).st_nlink > 0:
            return fd, tmp
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries of saves of ``path`` that were killed mid-write; return them.

    A temporary is removed when its name is one :func:`write` gives for this
    very target (``.{name}.{pid}.{random}.tmp``, same directory) and its
    ``flock`` can be taken: the kernel drops a writer's lock when the writer
    dies, however it dies, so a lock that can be taken has no live writer.
    Temporaries named with this process's pid are kept (they may be another
    thread's save: on NFS, locks do not exclude each other within a process).
    Best effort: anything that can't be checked is left alone. Does nothing
    where ``fcntl`` is unavailable.
    """
    path = Path(path)
    removed: list[Path] = []
    if fcntl is None:
        return removed
    pattern = _temporary_pattern(path)
    try:
        entries = [e.name for e in os.scandir(path.parent)]
    except OSError:
        return removed
    for name in entries:
        match = pattern.fullmatch(name)
        if match and int(match.group(1)) != os.getpid() and _remove_if_abandoned(path.parent / name):
            removed.append(path.parent / name)
    return removed


def _remove_if_abandoned(tmp: Path) -> bool:
    """Unlink ``tmp`` if it is a regular file whose lock nobody holds; say whether it was."""
    try:
        # No symlinks followed, and no blocking on a FIFO someone put there.
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        locked = os.fstat(fd)
        if not stat.S_ISREG(locked.st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            return False
        # Still the file we locked under that name (not renamed away meanwhile)?
        now = os.stat(tmp, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (locked.st_dev, locked.st_ino):
            return False
        os.unlink(tmp)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


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


# -- reading ------------------------------------------------------------------------------


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused unless a regular file.

    Opened without blocking: a FIFO (or a device) named by mistake or planted
    would hang ``open`` or never end the read; it is a ``ReplayFileError``. A
    directory stays the ``IsADirectoryError`` ``open`` raises.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        raise ReplayFileError(f"{path}: not a replay file (not a regular file: {stat.filemode(mode)})")
    return os.fdopen(fd, "rb")


def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and verify a file written by :func:`write`; return ``(header, arrays)``.

    The header's types and bounds and its agreement with the arrays are
    checked (see the module docstring), so a buffer can be built from them.
    Memory use is bounded by the file's size, whatever the file declares.

    Raises:
        ReplayFileError: the file is damaged, hostile, inconsistent, or not a
            replay file of this version.
        OSError: ``path`` can't be opened (missing, a directory, no permission).
    """
    path = Path(path)
    with _open_regular(path) as raw:  # not being able to open it is not a damaged file: raised as is
        try:
            archive_size = os.fstat(raw.fileno()).st_size
            with zipfile.ZipFile(raw, "r") as zf:
                header_info = _member(zf, _HEADER, archive_size, path)
                header = _read_header(zf, header_info, path)
                _check_header(header, path)
                infos = {name: _member(zf, f"arrays/{name}.npy", archive_size, path) for name in header["arrays"]}
                _check_no_overlap([header_info, *infos.values()], path)
                arrays = {
                    name: _read_array(zf, infos[name], name, spec, path) for name, spec in header["arrays"].items()
                }
            _check_arrays(header, arrays, path)
        except ReplayFileError:
            raise
        except MemoryError:
            # Allocations are bounded by the file's size: this machine is short of memory,
            # which calling the file corrupt would hide.
            raise
        except Exception as e:
            # zipfile, json and NumPy's .npy header parser raise many types on bad bytes
            # (BadZipFile, NotImplementedError, RuntimeError, OSError, EOFError, struct.error,
            # ValueError, OverflowError, RecursionError, tokenize.TokenError, ...): all mean
            # this file can't be read.
            raise ReplayFileError(f"{path}: not a readable replay file (truncated or corrupt: {e!r})") from e
    return header, arrays


def _member(zf: zipfile.ZipFile, name: str, archive_size: int, path: Path) -> zipfile.ZipInfo:
    """The ZIP entry ``name``, if it is one this reader can read within the file's bytes."""
    try:
        info = zf.getinfo(name)
    except KeyError as e:
        what = f"no {_HEADER}; not a {FORMAT} file" if name == _HEADER else f"member {_short(name)} is missing"
        raise ReplayFileError(f"{path}: {what}") from e
    if info.flag_bits & _UNSUPPORTED_FLAGS:
        raise ReplayFileError(f"{path}: member {_short(name)} is encrypted or patched; replay files are neither")
    if info.compress_type != zipfile.ZIP_STORED:
        # Only stored members are written, and inflating would let a small file claim any size.
        raise ReplayFileError(
            f"{path}: member {_short(name)} is compressed (method {info.compress_type}); replay files are stored"
        )
    if info.file_size != info.compress_size or not 0 <= info.header_offset <= archive_size - info.compress_size:
        raise ReplayFileError(
            f"{path}: member {_short(name)} declares {info.file_size} bytes at offset {info.header_offset}, "
            f"beyond the file's {archive_size}"
        )
    return info


def _check_no_overlap(infos: list[zipfile.ZipInfo], path: Path) -> None:
    """Refuse members whose bytes overlap: with each member's data holding the next one's,
    reading k members would cost k times the file's size (a "zip bomb" without compression)."""
    # A member spans at least its 30-byte local header and its data (its name and extra field are more).
    spans = sorted((i.header_offset, i.header_offset + 30 + i.compress_size, i.filename) for i in infos)
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if end > start:
            raise ReplayFileError(f"{path}: members {_short(name)} and {_short(other)} overlap")


def _read_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> dict[str, Any]:
    if info.file_size > MAX_HEADER_BYTES:
        raise ReplayFileError(f"{path}: {_HEADER} of {info.file_size} bytes; at most {MAX_HEADER_BYTES} are read")
    try:
        header = json.loads(zf.read(info))
    except RecursionError as e:  # JSON nested deeper than the interpreter's stack
        raise ReplayFileError(f"{path}: unreadable header (nested too deeply)") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise ReplayFileError(f"{path}: unreadable header ({e})") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ReplayFileError(f"{path}: not a {FORMAT} file")
    version = header.get("version")
    if version not in _VERSIONS or isinstance(version, bool):
        raise ReplayFileError(
            f"{path}: format version {_short(version)}, this library reads versions {list(_VERSIONS)}"
        )
    if (COMPRESSED in header) != (version == 2):
        raise ReplayFileError(
            f"{path}: a version {version} file {'with' if version == 1 else 'without'} {COMPRESSED} fields"
        )
    if not isinstance(header.get("arrays"), dict):
        raise ReplayFileError(f"{path}: header has no array manifest")
    return header


def _read_array(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, spec: Mapping[str, Any], path: Path
) -> np.ndarray:
    """Read the array ``name`` whose manifest entry ``spec`` was checked by :func:`_check_header`."""
    dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            file_shape, fortran, file_dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            file_shape, fortran, file_dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ReplayFileError(f"{path}: array {_short(name)} has .npy version {version}")
        if file_dtype.str != dtype.str or tuple(file_shape) != shape or fortran:
            raise ReplayFileError(
                f"{path}: array {_short(name)} is {file_dtype.str}{list(file_shape)}"
                f"{' (Fortran order)' if fortran else ''}, the header says {spec['dtype']}{spec['shape']}"
            )
        # The declared size must fit what the member holds before anything is allocated.
        if nbytes > info.file_size:
            raise ReplayFileError(
                f"{path}: array {_short(name)} declares {nbytes} bytes, its member holds {info.file_size}"
            )
        data = np.empty(nbytes, np.uint8)
        filled = 0
        while filled < nbytes:
            chunk = f.read(min(_READ_CHUNK, nbytes - filled))
            if not chunk:
                raise ReplayFileError(f"{path}: array {_short(name)} is truncated")
            data[filled : filled + len(chunk)] = np.frombuffer(chunk, np.uint8)
            filled += len(chunk)
        if f.read(1):  # reading to the member's end also makes zipfile check its CRC
            raise ReplayFileError(f"{path}: array {_short(name)} is followed by unexpected bytes")
    return data.view(dtype).reshape(shape)


# -- validation ---------------------------------------------------------------------------


def _short(value: Any) -> str:
    """A bounded repr of a value from the file, for messages (it may be huge or deeply nested)."""
    return reprlib.repr(value)


def _is_real(value: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    """A finite JSON number (not a bool) in ``[low, high]``."""
    if not is_real(value):
        return False
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        return False
    return math.isfinite(v) and low <= v <= high


def _plain_dtype(value: Any, kinds: str = PLAIN_KINDS) -> np.dtype | None:
    """The dtype ``value`` names if it is a short string naming a plain scalar dtype of ``kinds``."""
    if not isinstance(value, str) or len(value) > 16:
        return None
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        return None
    # kind excludes object, void, string, datetime; subarray and structured dtypes are void.
    return dtype if dtype.kind in kinds and dtype.names is None and dtype.shape == () else None


def _is_shape(value: Any, max_dims: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= max_dims
        and all(is_int(d) and 0 <= d <= MAX_STORAGE_BYTES for d in value)
    )


def _check_header(header: Mapping[str, Any], path: Path) -> None:
    """Check the types and bounds of everything a buffer is built from (before any array is read)."""

    def require(ok: bool, what: str) -> None:
        if not ok:
            raise ReplayFileError(f"{path}: inconsistent replay header ({what})")

    cfg: Any = header.get("config")
    require(isinstance(cfg, dict), "no config")
    missing = [k for k in _CONFIG_KEYS if k not in cfg]
    require(not missing, f"config lacks {missing}")
    capacity = cfg["capacity"]
    require(is_int(capacity) and 1 <= capacity <= MAX_CAPACITY, f"capacity {_short(capacity)} not in [1, 2**40]")
    require(_is_real(cfg["alpha"], 0.0), f"alpha {_short(cfg['alpha'])} is not a finite number >= 0")
    require(_is_real(cfg["beta"], 0.0, 1.0), f"beta {_short(cfg['beta'])} is not a number in [0, 1]")
    require(_is_real(cfg["eps"], 0.0), f"eps {_short(cfg['eps'])} is not a finite number >= 0")
    require(is_int(cfg["fanout"]) and 2 <= cfg["fanout"] <= 1024, f"fanout {_short(cfg['fanout'])}")
    require(_plain_dtype(cfg["priority_dtype"], "f") is not None, f"priority dtype {_short(cfg['priority_dtype'])}")
    require(isinstance(cfg["stratified"], bool), f"stratified {_short(cfg['stratified'])} is not a bool")

    item_bytes = _check_schema(cfg["schema"], require)
    require(capacity * item_bytes <= MAX_STORAGE_BYTES, f"capacity {capacity} x {item_bytes} bytes per transition")
    if COMPRESSED in header:
        try:
            parse_settings(Schema.from_json(cfg["schema"]), header[COMPRESSED])
        except (TypeError, ValueError) as e:
            require(False, f"{COMPRESSED}: {e}")

    size: Any = header.get("size")
    position: Any = header.get("position")
    require(is_int(size) and 0 <= size <= capacity, f"size {_short(size)} for capacity {capacity}")
    require(is_int(position) and 0 <= position < capacity, f"position {_short(position)} for capacity {capacity}")
    if header.get("rows", RING_ROWS) != RING_ROWS:
        require(False, f"rows {_short(header.get('rows'))}")
    if header.get("rows") == RING_ROWS:
        require(is_int(header.get("tickets")) and header["tickets"] >= 0, f"tickets {_short(header.get('tickets'))}")
        require(DURABLE in header, f"a ring's state without its {DURABLE} section")
    if DURABLE in header:
        _check_durable(header[DURABLE], require)
    max_priority: Any = header.get("max_priority")
    require(_is_real(max_priority, 0.0) and max_priority > 0, f"max_priority {_short(max_priority)}")
    require(_is_generator_state(header.get("rng_state")), "rng_state is not a NumPy generator state")

    for name, spec in header["arrays"].items():
        require(
            isinstance(spec, dict)
            and _is_shape(spec.get("shape"), MAX_FIELD_DIMS + 1)
            and _canonical_dtype(spec.get("dtype")),
            f"manifest entry {_short(name)}: {_short(spec)}",
        )


def _check_schema(schema: Any, require: Any) -> int:
    """A schema as JSON (``{name: {"shape": [...], "dtype": "<f4"}}``): its bytes per transition."""
    require(isinstance(schema, dict) and len(schema) > 0, "the schema is not a non-empty mapping")
    item_bytes = 0
    for name, field in schema.items():
        require(
            isinstance(field, dict)
            and name != ""
            and _is_shape(field.get("shape"), MAX_FIELD_DIMS)
            and _canonical_dtype(field.get("dtype")),
            f"field {_short(name)}: {_short(field)} is not a shape and a plain numeric dtype",
        )
        item_bytes += math.prod(field["shape"]) * np.dtype(field["dtype"]).itemsize
    return item_bytes


def read_schema(blob: bytes, where: str) -> Schema:
    """The :class:`Schema` whose JSON is ``blob``, read from a file; ``ReplayFileError`` naming ``where`` otherwise."""

    def require(ok: bool, what: str) -> None:
        if not ok:
            raise ReplayFileError(f"{where}: damaged schema ({what})")

    try:
        value = json.loads(blob)
    except RecursionError as e:
        raise ReplayFileError(f"{where}: damaged schema (nested too deeply)") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ReplayFileError(f"{where}: damaged schema (not JSON: {e})") from e
    _check_schema(value, require)
    try:
        return Schema.from_json(value)
    except (TypeError, ValueError) as e:
        raise ReplayFileError(f"{where}: damaged schema ({e})") from e


def _check_durable(section: Any, require: Any) -> None:
    """The :data:`DURABLE` section: the settings a reopened buffer goes on with, and counts."""
    require(isinstance(section, dict), f"{DURABLE} {_short(section)} is not a mapping")
    every, seconds = section.get("flush_every"), section.get("flush_seconds")
    require(is_int(every) and every >= 1, f"{DURABLE} flush_every {_short(every)}")
    require(_is_real(seconds) and seconds > 0, f"{DURABLE} flush_seconds {_short(seconds)}")
    for count in ("points", "added"):
        value = section.get(count)
        require(is_int(value) and value >= 0, f"{DURABLE} {count} {_short(value)}")


def _canonical_dtype(value: Any) -> bool:
    """``value`` is a plain numeric dtype written as :attr:`numpy.dtype.str` writes it (``"<f4"``)."""
    dtype = _plain_dtype(value)
    return dtype is not None and dtype.str == value


def _is_generator_state(state: Any) -> bool:
    """``state`` can be set on the generator :meth:`PrioritizedReplay.from_state_dict` makes."""
    if not isinstance(state, dict):
        return False
    try:
        np.random.default_rng(0).bit_generator.state = state
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, AttributeError):
        return False
    return True


def _check_arrays(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray], path: Path) -> None:
    """The arrays are the header's: one per schema field with ``size`` rows, and the priorities."""
    size, schema = header["size"], header["config"]["schema"]
    # name -> (dtype string, or None for any float dtype, and shape)
    if header.get("rows") == RING_ROWS:  # the durable state of a ring storage: rows live in its ring file
        capacity = header["config"]["capacity"]
        expected: dict[str, tuple[str | None, tuple[int | None, ...]]] = {
            "priorities": (None, (capacity,)),
            "stamps": ("<i8", (capacity,)),
        }
    else:
        codecs: Mapping[str, Any] = {}
        packed: dict[str, tuple[str | None, tuple[int | None, ...]]] = {}
        if COMPRESSED in header:  # records of any length: their values are checked where they are read
            typed = Schema.from_json(schema)
            codecs, pooled, _ = parse_settings(typed, header[COMPRESSED])
            for name, (dtype_of, dims) in packed_layout(typed, codecs, pooled, size).items():
                packed[f"{COMPRESSED}/{name}"] = (dtype_of.str, dims)
        expected = {
            f"storage/{name}": (field["dtype"], (size, *field["shape"]))
            for name, field in schema.items()
            if name not in codecs
        }
        expected.update(packed)
        expected["priorities"] = (None, (size,))  # any float: the tree casts them to its own dtype
    if set(arrays) != set(expected):
        raise ReplayFileError(
            f"{path}: inconsistent replay file: arrays {sorted(arrays)}, the schema needs {sorted(expected)}"
        )
    for name, (dtype, shape) in expected.items():
        arr = arrays[name]
        dtype_ok = arr.dtype.kind == "f" if dtype is None else arr.dtype.str == dtype
        shape_ok = arr.ndim == len(shape) and all(d is None or d == n for d, n in zip(shape, arr.shape))
        if not shape_ok or not dtype_ok:
            raise ReplayFileError(
                f"{path}: inconsistent replay file: array {_short(name)} is {arr.dtype.str}{list(arr.shape)}, "
                f"size {size} and the schema need {dtype or 'a float dtype'}{list(shape)}"
            )
