"""Damaged and hostile replay files, abandoned temporaries, file modes (issue 10, item 7).

Every way a file can be broken must end in ``ReplayFileError``: flipped bits
and truncation anywhere (ZIP local headers, central directory, ``.npy``
headers, data), members that are compressed or encrypted, a JSON header
nested too deeply or of the wrong types, sizes that claim more than the file
holds. A damaged file that still loads must load exactly the saved buffer.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetero_replay.replay import PrioritizedReplay
from hetero_replay.storage import checkpoint
from hetero_replay.storage.checkpoint import ReplayFileError
from tests.conftest import SCHEMA, make_batch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
POSIX_ONLY = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals, umask and flock")


# -- helpers -----------------------------------------------------------------------------


def small_buffer() -> PrioritizedReplay:
    b = PrioritizedReplay(64, SCHEMA, alpha=0.7, beta=0.5, tree="numpy", seed=9)
    b.add(make_batch(50))
    s = b.sample(16)
    b.update_priorities(s.indices, np.linspace(0.1, 3.0, 16))
    return b


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, PrioritizedReplay]:
    """A valid replay file and the buffer it holds."""
    b = small_buffer()
    path = tmp_path / "replay.hrz"
    b.save(path)
    return path, b


def load(path: Path) -> PrioritizedReplay:
    return PrioritizedReplay.load(path, tree="numpy")


def assert_same_buffer(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["config"] == sb["config"]
    assert (sa["position"], sa["size"], sa["max_priority"]) == (sb["position"], sb["size"], sb["max_priority"])
    assert sa["rng_state"] == sb["rng_state"]
    np.testing.assert_array_equal(sa["priorities"], sb["priorities"])
    for name in sa["storage"]:
        np.testing.assert_array_equal(sa["storage"][name], sb["storage"][name])


def assert_refused_or_intact(path: Path, original: PrioritizedReplay) -> str:
    """Loading ``path`` raises ``ReplayFileError`` or gives back exactly ``original``."""
    try:
        loaded = load(path)
    except ReplayFileError:
        return "refused"
    assert_same_buffer(loaded, original)  # a "successful" load of changed bytes must change nothing
    return "intact"


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def rezip(path: Path, contents: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> None:
    """Write ``contents`` as a well-formed ZIP (right CRCs): only the validation layer can object."""
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in contents.items():
            zf.writestr(name, data)


def with_header_text(path: Path, text: str) -> None:
    contents = members(path)
    contents["header.json"] = text.encode()
    rezip(path, contents)


def with_header(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    contents = members(path)
    header = json.loads(contents["header.json"])
    change(header)
    contents["header.json"] = json.dumps(header).encode()
    rezip(path, contents)


def npy_bytes(descr: str, shape: tuple[int, ...], data: bytes = b"") -> bytes:
    """An ``.npy`` file whose header says ``descr``/``shape``, followed by ``data``."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
    return f.getvalue() + data


def central_entry(data: bytes, name: str) -> int:
    """Offset of ``name``'s central-directory record in a ZIP's bytes."""
    start = data.find(b"PK\x01\x02")
    while start != -1:
        name_len = struct.unpack_from("<H", data, start + 28)[0]
        if data[start + 46 : start + 46 + name_len] == name.encode():
            return start
        start = data.find(b"PK\x01\x02", start + 4)
    raise AssertionError(f"{name} not in the central directory")


# -- flipped bits and truncation anywhere --------------------------------------------------


# Files are patched in place and restored, not rewritten: on ext4, rewriting a file
# through truncation flushes it to disk on close (auto_da_alloc), a millisecond each.


def check_edits(f: Any, good: bytes, edits: dict[int, bytes], path: Path, original: PrioritizedReplay) -> str:
    """Apply ``{offset: bytes}`` to the open file ``f`` (a copy of ``good``), check, restore."""
    for pos, value in edits.items():
        f.seek(pos)
        f.write(value)
    try:
        return assert_refused_or_intact(path, original)
    finally:
        for pos, value in edits.items():
            f.seek(pos)
            f.write(good[pos : pos + len(value)])


@pytest.fixture
def damaged(saved) -> Any:
    """``(open copy, good bytes, copy's path, original buffer)``: a copy of the saved file to patch."""
    path, original = saved
    good = path.read_bytes()
    bad = path.with_name("bad.hrz")
    bad.write_bytes(good)
    with open(bad, "r+b", buffering=0) as f:
        yield f, good, bad, original


def test_every_flipped_bit_refused_or_harmless(damaged):
    f, good, bad, original = damaged
    rng = random.Random(7)
    seen = {"refused": 0, "intact": 0}
    for pos in range(len(good)):  # every byte: local headers, npy headers, data, central directory, EOCD
        seen[check_edits(f, good, {pos: bytes([good[pos] ^ (1 << rng.randrange(8))])}, bad, original)] += 1
    assert seen["refused"] > len(good) // 2  # most bytes matter; the rest (timestamps...) change nothing


def test_random_byte_overwrites_refused_or_harmless(damaged):
    f, good, bad, original = damaged
    rng = random.Random(11)
    for _ in range(2000):
        edits = {
            rng.randrange(len(good)): bytes([rng.choice((0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)))])
            for _ in range(rng.choice((1, 2, 4)))
        }
        check_edits(f, good, edits, bad, original)


def test_zip_metadata_fields_overwritten(damaged):
    """Each 2- and 4-byte field of every local and central header and the end record set to hostile values."""
    f, good, bad, original = damaged
    starts = [i for sig in (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06") for i in _find_all(good, sig)]
    for start in starts:
        for off in range(4, 46, 2):
            for value in (b"\x00\x00", b"\xff\xff", b"\x08\x00", b"\x63\x00", b"\x01\x00", b"\xff\xff\xff\x7f"):
                if start + off + len(value) <= len(good):
                    check_edits(f, good, {start + off: value}, bad, original)


def test_npy_headers_overwritten(damaged):
    """Every byte of every .npy header (magic, length, dict) set to a few hostile values."""
    f, good, bad, original = damaged
    for start in _find_all(good, b"\x93NUMPY"):
        header_len = struct.unpack_from("<H", good, start + 8)[0]
        for pos in range(start, start + 10 + header_len):
            for value in (b"\x00", b"\xff", b"9", b"("):
                check_edits(f, good, {pos: value}, bad, original)


def _find_all(data: bytes, sig: bytes) -> list[int]:
    out, i = [], data.find(sig)
    while i != -1:
        out.append(i)
        i = data.find(sig, i + 1)
    return out


def test_truncated_at_every_length_refused(damaged):
    f, good, bad, _ = damaged
    for n in range(len(good) - 1, -1, -1):
        f.truncate(n)
        with pytest.raises(ReplayFileError):
            load(bad)


# -- the ZIP container ---------------------------------------------------------------------


def test_encrypted_flag_refused(saved):
    path, _ = saved
    data = bytearray(path.read_bytes())
    data[central_entry(data, "arrays/priorities.npy") + 8] |= 0x01  # general purpose flag: encrypted
    path.write_bytes(bytes(data))
    with pytest.raises(ReplayFileError, match="encrypted"):
        load(path)


def test_unknown_compression_method_refused(saved):
    path, _ = saved
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, central_entry(data, "arrays/storage/obs.npy") + 10, 99)
    path.write_bytes(bytes(data))
    with pytest.raises(ReplayFileError, match="compress"):
        load(path)


def test_deflated_members_refused(saved):
    """Only stored members are written; deflate would let a small file inflate without bound."""
    path, _ = saved
    rezip(path, members(path), compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(ReplayFileError, match="compress"):
        load(path)


def test_member_size_beyond_the_file_refused(saved):
    path, _ = saved
    data = bytearray(path.read_bytes())
    entry = central_entry(data, "header.json")
    struct.pack_into("<II", data, entry + 20, 0x7FFFFFFF, 0x7FFFFFFF)  # compressed and uncompressed sizes
    path.write_bytes(bytes(data))
    with pytest.raises(ReplayFileError):
        load(path)


def test_overlapping_members_refused(saved):
    """A member whose bytes hold another whole member: nested k deep, reading would cost k times the file."""
    path, _ = saved
    contents = members(path)
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as zf:
        zf.writestr("arrays/priorities.npy", contents["arrays/priorities.npy"])
    with zipfile.ZipFile(inner) as zf:
        inner_entry = inner.getvalue()[: zf.start_dir]  # the local header and data of priorities
    obs = contents["arrays/storage/obs.npy"]
    npy_header = 10 + struct.unpack_from("<H", obs, 8)[0]
    assert len(inner_entry) <= len(obs) - npy_header
    contents["arrays/storage/obs.npy"] = obs[:npy_header] + inner_entry + obs[npy_header + len(inner_entry) :]
    rezip(path, contents)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        obs_info = zf.getinfo("arrays/storage/obs.npy")
    name_len, extra_len = struct.unpack_from("<HH", data, obs_info.header_offset + 26)
    nested = obs_info.header_offset + 30 + name_len + extra_len + npy_header
    struct.pack_into("<I", data, central_entry(data, "arrays/priorities.npy") + 42, nested)
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as zf:  # a well-formed ZIP by zipfile's standards
        assert zf.read("arrays/priorities.npy") == contents["arrays/priorities.npy"]
        assert zf.getinfo("arrays/priorities.npy").header_offset == nested
    with pytest.raises(ReplayFileError, match="overlap"):
        load(path)


def test_arrays_read_in_chunks(saved, monkeypatch):
    path, original = saved
    monkeypatch.setattr(checkpoint, "_READ_CHUNK", 7)
    assert_same_buffer(load(path), original)


# -- the JSON header -----------------------------------------------------------------------


def test_deeply_nested_header_refused(saved):
    path, _ = saved
    with_header_text(path, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ReplayFileError, match="header"):
        load(path)


def test_deeply_nested_value_in_header_refused(saved):
    path, _ = saved
    text = members(path)["header.json"].decode()
    with_header_text(path, text.replace('"stratified": true', '"stratified": ' + "[" * 50_000 + "]" * 50_000))
    with pytest.raises(ReplayFileError):
        load(path)


def test_oversized_header_refused(saved, monkeypatch):
    path, _ = saved
    monkeypatch.setattr(checkpoint, "MAX_HEADER_BYTES", 200)
    with pytest.raises(ReplayFileError, match="header"):
        load(path)


def test_write_refuses_a_header_it_could_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "MAX_HEADER_BYTES", 200)
    with pytest.raises(ValueError, match="header"):
        small_buffer().save(tmp_path / "replay.hrz")
    assert list(tmp_path.iterdir()) == []


def _set(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(header: dict[str, Any]) -> None:
        node = header
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return change


HOSTILE_HEADERS = {
    "capacity list": _set("config", "capacity", value=[64]),
    "capacity string": _set("config", "capacity", value="64"),
    "capacity float": _set("config", "capacity", value=64.5),
    "capacity bool": _set("config", "capacity", value=True),
    "capacity 0": _set("config", "capacity", value=0),
    "capacity 2**41": _set("config", "capacity", value=2**41),
    "capacity 10**30": _set("config", "capacity", value=10**30),
    "size -1": _set("size", value=-1),
    "size string": _set("size", value="50"),
    "size 10**30": _set("size", value=10**30),
    "position list": _set("position", value=[50]),
    "alpha string": _set("config", "alpha", value="0.7"),
    "alpha list": _set("config", "alpha", value=[0.7]),
    "beta 2": _set("config", "beta", value=2.0),
    "eps negative": _set("config", "eps", value=-1.0),
    "fanout string": _set("config", "fanout", value="16"),
    "fanout 3": _set("config", "fanout", value=3),
    "fanout huge": _set("config", "fanout", value=10**30),
    "priority_dtype object": _set("config", "priority_dtype", value="O"),
    "priority_dtype dict": _set("config", "priority_dtype", value={"names": ["a"], "formats": ["f4"]}),
    "stratified string": _set("config", "stratified", value="yes"),
    "schema list": _set("config", "schema", value=[]),
    "schema empty": _set("config", "schema", value={}),
    "schema field list": _set("config", "schema", "obs", value=[]),
    "schema shape string": _set("config", "schema", "obs", "shape", value="3"),
    "schema shape negative": _set("config", "schema", "obs", "shape", value=[-3]),
    "schema shape huge": _set("config", "schema", "obs", "shape", value=[2**62]),
    "schema shape zero and huge": _set("config", "schema", "obs", "shape", value=[0, 2**70]),
    "schema dtype object": _set("config", "schema", "obs", "dtype", value="|O"),
    "schema dtype void": _set("config", "schema", "obs", "dtype", value="|V12"),
    "schema dtype subarray": _set("config", "schema", "obs", "dtype", value="(3,)<f4"),
    "schema dtype number": _set("config", "schema", "obs", "dtype", value=4),
    "max_priority string": _set("max_priority", value="nan"),
    "max_priority list": _set("max_priority", value=[1.0]),
    "max_priority negative": _set("max_priority", value=-1.0),
    "rng_state list": _set("rng_state", value=[]),
    "rng_state empty": _set("rng_state", value={}),
    "rng_state negative": _set("rng_state", "state", "state", value=-1),
    "rng_state huge": _set("rng_state", "state", "state", value=2**300),
    "rng_state string": _set("rng_state", "state", "inc", value="1"),
    "manifest entry list": _set("arrays", "priorities", value=[]),
    "manifest dtype number": _set("arrays", "priorities", "dtype", value=4),
    "manifest shape string": _set("arrays", "priorities", "shape", value="50"),
    "manifest shape huge": _set("arrays", "priorities", "shape", value=[2**70]),
    "manifest extra array": _set("arrays", "extra", value={"dtype": "<f4", "shape": [1]}),
    "config list": _set("config", value=[]),
}


@pytest.mark.parametrize("change", HOSTILE_HEADERS.values(), ids=HOSTILE_HEADERS.keys())
def test_hostile_header_value_refused(saved, change):
    path, _ = saved
    with_header(path, change)
    with pytest.raises(ReplayFileError):
        load(path)


@pytest.mark.parametrize(
    "old, new",
    [
        ('"capacity": 64', '"capacity": 1e400'),
        ('"fanout": 16', '"fanout": 1e400'),
        ('"alpha": 0.7', '"alpha": NaN'),
        ('"eps": 1e-06', '"eps": Infinity'),
        ('"max_priority": ', '"max_priority": 1e400, "x": '),
        ('"size": 50', '"size": ' + "9" * 5000),  # beyond Python's int-parsing digit limit
    ],
)
def test_non_finite_and_unparsable_numbers_refused(saved, old, new):
    path, _ = saved
    text = members(path)["header.json"].decode()
    assert old in text
    with_header_text(path, text.replace(old, new, 1))
    with pytest.raises(ReplayFileError):
        load(path)


HOSTILE_VALUES = [None, True, -1, 0, 2**64, 10**30, 1.5, 1e300, "x", "<f4", [], [1, 2], {}, {"a": 1}]


def _leaves(node: Any, keys: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, keys + (k,))] + ([keys] if keys else [])
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, keys + (i,))] + [keys]
    return [keys]


def test_every_header_value_replaced_refused_or_loaded(saved, tmp_path):
    """Each value of the header, at every depth, replaced by each of a set of hostile ones."""
    path, _ = saved
    contents = members(path)
    header = json.loads(contents["header.json"])
    outcomes = set()
    for i, keys in enumerate(_leaves(header)):
        for j, value in enumerate(HOSTILE_VALUES):
            changed = json.loads(contents["header.json"])
            _set(*keys, value=value)(changed)
            case = tmp_path / f"case-{i}-{j}.hrz"  # a new file each time: cheaper than rewriting one
            rezip(case, {**contents, "header.json": json.dumps(changed).encode()})
            try:
                load(case)
                outcomes.add("loaded")
            except ReplayFileError:
                outcomes.add("refused")
            case.unlink()
    assert "refused" in outcomes


def test_header_not_an_object_refused(saved):
    path, _ = saved
    for text in ("[]", "1", '"hetero-replay"', "null", "\xff\xfe", ""):
        with_header_text(path, text)
        with pytest.raises(ReplayFileError):
            load(path)


# -- sizes in the header and the .npy headers ----------------------------------------------


def test_npy_header_claiming_a_huge_array_refused(saved):
    """4 TiB claimed by a 5 KB file: refused before anything is allocated."""
    path, _ = saved
    with_header(path, _set("arrays", "priorities", "shape", value=[2**40]))
    contents = members(path)
    contents["arrays/priorities.npy"] = npy_bytes("<f4", (2**40,), b"\0" * 64)
    rezip(path, contents)
    with pytest.raises(ReplayFileError, match="holds"):
        load(path)


@pytest.mark.parametrize(
    "descr, shape",
    [("<f4", (7,)), ("|O", (50,)), ("<f8", (50,)), ("[('a', '<f4')]", (50,)), ("<f4", (50, 1)), ("<f4", (-50,))],
)
def test_npy_header_disagreeing_with_the_manifest_refused(saved, descr, shape):
    path, _ = saved
    contents = members(path)
    contents["arrays/priorities.npy"] = npy_bytes(descr, shape, b"\0" * 200)
    rezip(path, contents)
    with pytest.raises(ReplayFileError):
        load(path)


def test_npy_member_with_trailing_bytes_refused(saved):
    path, _ = saved
    contents = members(path)
    contents["arrays/priorities.npy"] += b"\0" * 8
    rezip(path, contents)
    with pytest.raises(ReplayFileError):
        load(path)


def test_npy_header_garbage_refused(saved):
    path, _ = saved
    contents = members(path)
    npy = bytearray(contents["arrays/priorities.npy"])
    for junk in (b"{'descr': " + b"(" * 5000, b"{'descr': " + b"-" * 5000 + b"1", b"\xff" * 64):
        body = npy[:10] + junk
        contents["arrays/priorities.npy"] = bytes(body)
        rezip(path, contents)
        with pytest.raises(ReplayFileError):
            load(path)


def test_storage_rows_disagreeing_with_size_refused(saved):
    path, _ = saved
    with_header(path, _set("size", value=20))  # arrays still hold 50 rows
    with pytest.raises(ReplayFileError, match="inconsistent"):
        load(path)


def test_capacity_beyond_the_format_limit_refused(saved):
    path, _ = saved
    with_header(path, _set("config", "capacity", value=checkpoint.MAX_CAPACITY + 1))
    with pytest.raises(ReplayFileError, match="capacity"):
        checkpoint.read(path)


def _overcommit_refuses_huge_allocations() -> bool:
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip() in ("0", "2")
    except OSError:
        return False


@pytest.mark.skipif(
    not _overcommit_refuses_huge_allocations(),
    reason="needs Linux heuristic overcommit, so that a 2 TiB allocation fails instead of reaching the OOM killer",
)
def test_capacity_no_machine_can_allocate_refused(saved):
    """Within the format's bounds but far beyond any RAM: refused, not a MemoryError."""
    path, _ = saved
    with_header(path, _set("config", "capacity", value=2**39))
    with pytest.raises(ReplayFileError):
        load(path)


def test_missing_file_is_not_a_replay_file_error(tmp_path):
    """A path that isn't there is the caller's problem, not a damaged file."""
    with pytest.raises(FileNotFoundError):
        checkpoint.read(tmp_path / "absent.hrz")


# -- abandoned temporaries -----------------------------------------------------------------

# The child saves through a write_array that writes in slices and pauses, so its
# temporary grows for long enough to be caught mid-write. With GO set it waits at
# the first array until the file GO exists (a writer alive for as long as we like).
CHILD = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from hetero_replay.replay import PrioritizedReplay

    path, go = sys.argv[1], sys.argv[2]
    rows = 50_000
    b = PrioritizedReplay(rows, {"obs": ((32,), "float32"), "reward": ((), "float32")}, tree="numpy", seed=0)
    b.add({"obs": np.ones((rows, 32), np.float32), "reward": np.ones(rows, np.float32)})

    def slow_write_array(fp, array, allow_pickle=False, **kwargs):
        np.lib.format.write_array_header_1_0(fp, np.lib.format.header_data_from_array_1_0(array))
        for part in np.array_split(array.reshape(len(array), -1), 50):
            fp.write(part.tobytes())
            while go != "-" and not os.path.exists(go):
                time.sleep(0.01)
            time.sleep(0.02)

    np.lib.format.write_array = slow_write_array
    print("saving", flush=True)
    b.save(path)
    """
)


def start_child(target: Path, go: str = "-") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target), go], cwd=REPO, env=env, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"saving\n"
    return child


def temporaries(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.*.tmp"))


def wait_for_growing_temporary(target: Path, timeout: float = 60.0) -> Path:
    deadline, last = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        for tmp in temporaries(target):
            size = tmp.stat().st_size if tmp.exists() else 0
            if 0 < last.get(tmp, size) < size:
                return tmp
            last[tmp] = size
        time.sleep(0.005)
    raise AssertionError("the child's temporary file never grew")


@POSIX_ONLY
def test_save_removes_the_temporary_of_a_killed_save(tmp_path):
    target = tmp_path / "replay.hrz"
    child = start_child(target)
    try:
        stale = wait_for_growing_temporary(target)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
    assert stale.exists() and not target.exists()  # killed mid-write: the temporary is left behind

    b = small_buffer()
    b.save(target)
    assert not stale.exists()
    assert temporaries(target) == []
    assert_same_buffer(load(target), b)


@POSIX_ONLY
def test_save_keeps_the_temporary_of_a_live_save(tmp_path):
    target = tmp_path / "replay.hrz"
    go = tmp_path / "go"
    child = start_child(target, str(go))
    try:
        live = _wait_for_temporary(target)
        b = small_buffer()
        b.save(target)  # meanwhile, the child is still writing
        assert live.exists(), "a live writer's temporary file was removed"
        assert_same_buffer(load(target), b)
        go.touch()
        assert child.wait(timeout=120) == 0
    finally:
        child.kill()
        child.wait()
    assert temporaries(target) == []
    assert len(load(target)) == 50_000  # the child's save, renamed last


def _wait_for_temporary(target: Path, timeout: float = 60.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [t for t in temporaries(target) if t.exists() and t.stat().st_size > 0]
        if found:
            return found[0]
        time.sleep(0.005)
    raise AssertionError("the child never created its temporary file")


@POSIX_ONLY
def test_only_unowned_temporaries_of_the_same_target_are_removed(tmp_path):
    target = tmp_path / "replay.hrz"
    dead_pid = 2**22 + 12345  # above the usual pid_max, so no process has it
    stale = tmp_path / f".replay.hrz.{dead_pid}.0123456789abcdef.tmp"
    kept = [
        tmp_path / f".replay.hrz.{os.getpid()}.0123456789abcdef.tmp",  # this process: maybe another thread
        tmp_path / f".other.hrz.{dead_pid}.0123456789abcdef.tmp",  # another target
        tmp_path / f".replay.hrz.x.{dead_pid}.0123456789abcdef.tmp",  # of target "replay.hrz.x"
        tmp_path / f".replay.hrz.{dead_pid}.0123456789abcdef.tmp.keep",
        tmp_path / "replay.hrz.tmp",
    ]
    for p in [stale, *kept]:
        p.write_bytes(b"partial")
    link = tmp_path / f".replay.hrz.{dead_pid}.fedcba9876543210.tmp"
    link.symlink_to(tmp_path / "precious")
    (tmp_path / "precious").write_bytes(b"keep me")
    fifo = tmp_path / f".replay.hrz.{dead_pid}.00000000000000ff.tmp"
    os.mkfifo(fifo)  # opening it must not block the save
    small_buffer().save(target)
    assert not stale.exists()
    assert all(p.exists() for p in kept)
    assert (tmp_path / "precious").read_bytes() == b"keep me"


@POSIX_ONLY
def test_save_survives_losing_its_new_temporary_to_another_save(tmp_path, monkeypatch):
    """Between creating its temporary and locking it, another save may remove it: start again."""
    import fcntl

    real_flock, lost = fcntl.flock, []

    def flock(fd: int, op: int) -> None:
        if op == fcntl.LOCK_EX and not lost:  # the other save: lock (it is free), unlink, unlock
            (tmp,) = temporaries(tmp_path / "replay.hrz")
            tmp.unlink()
            lost.append(tmp)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    b = small_buffer()
    b.save(tmp_path / "replay.hrz")
    assert lost and temporaries(tmp_path / "replay.hrz") == []
    assert_same_buffer(load(tmp_path / "replay.hrz"), b)


@POSIX_ONLY
def test_save_where_files_cannot_be_locked_removes_nothing(tmp_path, monkeypatch):
    """No locks (NFS without lockd): saving still works, and no temporary can be judged abandoned."""
    import errno
    import fcntl

    def flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)
    other = tmp_path / ".replay.hrz.4194305.0123456789abcdef.tmp"
    other.write_bytes(b"maybe someone's live save")
    b = small_buffer()
    b.save(tmp_path / "replay.hrz")
    assert temporaries(tmp_path / "replay.hrz") == [other]
    assert_same_buffer(load(tmp_path / "replay.hrz"), b)


# -- file modes ----------------------------------------------------------------------------


@POSIX_ONLY
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002, 0o000])
def test_saved_file_mode_follows_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        small_buffer().save(tmp_path / "replay.hrz")
    finally:
        os.umask(old)
    assert (tmp_path / "replay.hrz").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_is_refused_not_waited_on(tmp_path, kind):
    """``load`` / ``reopen`` of a FIFO hung in ``open`` for good; a device was read without end."""
    if kind == "fifo":
        path = tmp_path / "buffer.hrz"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    with pytest.raises(checkpoint.ReplayFileError, match="not a regular file"):
        checkpoint.read(path)
    with pytest.raises(IsADirectoryError):
        checkpoint.read(tmp_path)
