"""Paths an attacker can plant, one owner per buffer, paths made absolute, refusals before side effects.

Every file a buffer creates goes through :mod:`hetero_replay.storage.files`:
its directory private (ours, writable by nobody else), new files exclusive and
never through a symlink, the profile cache's temporary unpredictable, one learner
owning a disk buffer at a time (``flock``, dropped by the kernel at SIGKILL). The
attacker is a real second user (``nobody``, through ``runuser``: root only), the
races real processes, the full disk a real ``RLIMIT_FSIZE`` in a child.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay.storage.disk import CONTROL_FILE, ROW_FILE, STATE_FILE
from hetero_replay.storage.files import LOCK_FILE, BufferInUseError

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"id": ((), np.int64), "obs": ((4,), np.float32)}
JOIN_S = 60  # only against hangs
VICTIM_TEXT = b"the victim's own bytes\n"


def rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32)}


def disk(path: Path | str, capacity: int = 16, **options) -> PrioritizedReplay:
    return PrioritizedReplay(capacity, SCHEMA, storage="disk", storage_options={"path": path, **options})


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def shared_root():
    """A directory another user can reach (tmp_path's parents are root's 0700), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to act as a second user (nobody)")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    root = Path(tempfile.mkdtemp(prefix="hr-paths-", dir="/tmp"))
    root.chmod(0o1777)  # like /tmp: anyone may make a directory in it
    yield root
    shutil.rmtree(root, ignore_errors=True)


def as_nobody(script: str) -> None:
    """Run ``script`` (Python) as user ``nobody``: the attacker."""
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")  # one nobody may run
    if python is None:
        pytest.skip("no system python3 for user nobody")
    subprocess.run(["runuser", "-u", "nobody", "--", python, "-c", textwrap.dedent(script)], check=True)


# -- planted files -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o1777])
def test_disk_refuses_a_directory_another_user_made(shared_root, mode):
    """Another user makes the buffer's directory (world-writable, sticky or not) and plants
    ``rows.dat -> a victim file``: the buffer is refused, the victim untouched, nothing created."""
    victim = shared_root / "victim"
    victim.write_bytes(VICTIM_TEXT)
    victim.chmod(0o644)
    buf_dir = shared_root / "buf"
    as_nobody(f"""
        import os
        os.mkdir({str(buf_dir)!r}); os.chmod({str(buf_dir)!r}, {mode})
        os.symlink({str(victim)!r}, {str(buf_dir / ROW_FILE)!r})
    """)
    with pytest.raises(ValueError, match="storage_options path"):
        disk(buf_dir)
    assert victim.read_bytes() == VICTIM_TEXT
    assert sorted(p.name for p in buf_dir.iterdir()) == [ROW_FILE]


def test_disk_refuses_a_directory_others_may_write(tmp_path):
    """Our own directory, but group- or world-writable: refused (anyone could plant the buffer's names in it)."""
    for mode in (0o770, 0o777, 0o1777):
        buf_dir = tmp_path / f"buf{mode:o}"
        buf_dir.mkdir()
        buf_dir.chmod(mode)
        with pytest.raises(ValueError, match="writable by other users"):
            disk(buf_dir)
        assert list(buf_dir.iterdir()) == []


def test_disk_refuses_a_symlinked_directory_and_planted_names(tmp_path):
    """The buffer's directory as a symlink is refused; a name of the buffer's already there (a link to a
    victim) makes it 'a buffer already': never truncated, never followed."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ValueError, match="symlink"):
        disk(tmp_path / "link")
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM_TEXT)
    for name in (ROW_FILE, CONTROL_FILE):
        buf_dir = tmp_path / f"planted-{name}"
        buf_dir.mkdir(mode=0o700)
        (buf_dir / name).symlink_to(victim)
        with pytest.raises(ValueError, match="holds a replay buffer already"):
            disk(buf_dir)
        assert victim.read_bytes() == VICTIM_TEXT
        assert sorted(p.name for p in buf_dir.iterdir()) == sorted([name, LOCK_FILE])


def test_disk_files_are_private(tmp_path):
    """A new buffer's directory is 0700 and its files 0600, whatever the umask lets through."""
    old = os.umask(0)
    try:
        buf = disk(tmp_path / "a" / "buf")
        buf.add(rows(1, 4))
        buf.flush()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "buf").stat().st_mode) == 0o700
    for name in (CONTROL_FILE, ROW_FILE, LOCK_FILE):
        assert stat.S_IMODE((tmp_path / "a" / "buf" / name).stat().st_mode) == 0o600, name
    buf.close()


def test_writer_never_attaches_through_a_planted_link(tmp_path):
    """A writer handle opens the ring's files without following symlinks: one swapped for a link is refused."""
    buf = disk(tmp_path / "buf")
    writer = buf.writer()
    buf_dir = tmp_path / "buf"
    (buf_dir / ROW_FILE).rename(tmp_path / "moved")
    (buf_dir / ROW_FILE).symlink_to(tmp_path / "moved")
    with pytest.raises(OSError):
        writer.add(rows(1, 2))
    (buf_dir / ROW_FILE).unlink()
    (tmp_path / "moved").rename(buf_dir / ROW_FILE)
    buf.close()


def test_shared_refuses_a_directory_others_may_write(tmp_path):
    """A 'shared' segment goes to a directory of ours or a sticky one (its name is random), never
    to one anybody may rename files in."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ValueError, match="storage_options dir"):
        PrioritizedReplay(8, SCHEMA, storage="shared", storage_options={"dir": open_dir})
    assert list(open_dir.iterdir()) == []
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    buf = PrioritizedReplay(8, SCHEMA, storage="shared", storage_options={"dir": sticky})
    buf.close()


def test_profile_cache_never_writes_through_a_planted_temporary(tmp_path, monkeypatch):
    """The profile cache's temporary was ``.{name}.{pid}.tmp``: a link planted there redirected the write.
    Now its name is unpredictable and it is created exclusively: the victim keeps its bytes."""
    from tests.test_advisor import NATIVE, entry, make_profile  # a small real profile

    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM_TEXT)
    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / "profile.json"
    (cache / f".{target.name}.{os.getpid()}.tmp").symlink_to(victim)
    make_profile([entry(NATIVE)]).save(target)
    assert victim.read_bytes() == VICTIM_TEXT
    assert target.is_file() and not target.is_symlink()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


# -- one owner ----------------------------------------------------------------------------------


def _race_reopen(path: str, barrier, results, done) -> None:
    barrier.wait(JOIN_S)
    try:
        buf = PrioritizedReplay.reopen(path)
    except BufferInUseError:
        results.put("in use")
        return
    except Exception as e:  # reported, so the test says what else happened
        results.put(f"{type(e).__name__}: {e}")
        return
    results.put("owner")
    done.wait(JOIN_S)
    buf.close()


def _own_then_fork_then_wait(path: str, ready) -> None:
    buf = PrioritizedReplay.reopen(path)
    child = os.fork()
    if child == 0:  # a forked child of the owner: outlives it, never touches the buffer
        signal.pause()
        os._exit(0)
    ready.put(child)
    signal.pause()
    del buf


@pytest.mark.parametrize("racers", [8])
def test_one_owner_among_racing_reopens(tmp_path, racers):
    """N processes reopen one buffer at the same moment: exactly one gets it, the others
    BufferInUseError; the same process cannot open it twice either."""
    path = tmp_path / "buf"
    buf = disk(path)
    buf.add(rows(1, 10))
    buf.flush()
    with pytest.raises(BufferInUseError):
        PrioritizedReplay.reopen(path)
    buf.close()
    ctx = mp.get_context("fork")
    for _ in range(3):
        barrier, results, done = ctx.Barrier(racers), ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(target=_race_reopen, args=(str(path), barrier, results, done), daemon=True)
            for _ in range(racers)
        ]
        for p in procs:
            p.start()
        outcomes = sorted(results.get(timeout=JOIN_S) for _ in procs)
        done.set()
        for p in procs:
            p.join(JOIN_S)
            assert p.exitcode == 0
        assert outcomes == ["in use"] * (racers - 1) + ["owner"], outcomes


def test_sigkilled_owner_releases_the_buffer_even_with_a_forked_child_alive(tmp_path):
    """The owner is SIGKILLed while a child it forked lives on: a new learner reopens the buffer
    (the lock was the owner's alone), with every durable row."""
    path = tmp_path / "buf"
    buf = disk(path)
    buf.add(rows(1, 10))
    buf.close()
    ctx = mp.get_context("fork")
    ready = ctx.Queue()
    owner = ctx.Process(target=_own_then_fork_then_wait, args=(str(path), ready), daemon=True)
    owner.start()
    child = ready.get(timeout=JOIN_S)
    try:
        with pytest.raises(BufferInUseError):
            PrioritizedReplay.reopen(path)
        os.kill(owner.pid, signal.SIGKILL)
        # Not owner.join(): its sentinel pipe stays open in the forked child, so join() would wait out
        # JOIN_S; is_alive() reaps the dead owner with waitpid.
        deadline = time.monotonic() + JOIN_S
        while owner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        again = PrioritizedReplay.reopen(path)
        assert len(again) == 10
        again.close()
    finally:
        os.kill(child, signal.SIGKILL)
        if owner.is_alive():
            os.kill(owner.pid, signal.SIGKILL)
        owner.join(JOIN_S)


# -- absolute paths -------------------------------------------------------------------------------


def test_disk_relative_path_survives_chdir(tmp_path, monkeypatch):
    """A relative path is resolved once, when the buffer is made: after ``os.chdir`` its durable points,
    its writers and its reopen reach the same directory."""
    monkeypatch.chdir(tmp_path)
    buf = disk("buf")
    writer = buf.writer()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    buf.add(rows(1, 4))
    writer.add(rows(5, 4))
    buf.flush()
    writer.close()
    buf.close()
    assert list(elsewhere.iterdir()) == []
    again = PrioritizedReplay.reopen(tmp_path / "buf")
    assert len(again) == 8
    again.close()


def test_tianshou_relative_durable_path_survives_chdir(tmp_path, monkeypatch):
    """The Tianshou buffer's durable points go to the file named when it was made, not one under the new cwd."""
    pytest.importorskip("tianshou")
    from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer
    from tests.test_tianshou_durable import rows_of

    monkeypatch.chdir(tmp_path)
    buf = HeteroPrioritizedReplayBuffer(32, random_seed=3, durable_path="points.hrp")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for k in range(16):
        buf.add(rows_of([k + 1]), buffer_ids=[0])
    buf.flush()
    assert list(elsewhere.iterdir()) == []
    assert len(HeteroPrioritizedReplayBuffer.reopen(tmp_path / "points.hrp")) == 16


# -- directories above a buffer's files -------------------------------------------------------------


def _creators(tmp_path: Path):
    """Every way the library creates files under a user-given path: ``{name: (make(path), argument name)}``."""

    def new_disk(path: Path) -> None:
        disk(path).close()

    def reopened_disk(path: Path) -> None:
        PrioritizedReplay.reopen(path).close()

    def shared(path: Path) -> None:
        PrioritizedReplay(8, SCHEMA, storage="shared", storage_options={"dir": path}).close()

    def save(path: Path) -> None:
        buf = PrioritizedReplay(8, SCHEMA)
        buf.add(rows(1, 4))
        buf.save(path)

    def tianshou(path: Path) -> None:
        pytest.importorskip("tianshou")
        from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer

        HeteroPrioritizedReplayBuffer(32, durable_path=path)

    return {
        "disk": (new_disk, "storage_options path"),
        "disk reopen": (reopened_disk, "path"),
        "shared": (shared, "storage_options dir"),
        "save": (save, "path"),
        "tianshou durable_path": (tianshou, "durable_path"),
    }


CREATORS = ["disk", "disk reopen", "shared", "save", "tianshou durable_path"]


def _prepared(creator: str, parent: Path) -> Path:
    """The path ``creator`` is given below ``parent``; what must be there already is made elsewhere and moved in."""
    target = parent / ("buf.hrp" if creator in ("save", "tianshou durable_path") else "buf")
    if creator in ("disk reopen", "shared"):
        made = Path(tempfile.mkdtemp()) / "buf"
        if creator == "disk reopen":
            disk(made).close()
        else:
            made.mkdir(mode=0o700)
        os.rename(made, target)
        os.rmdir(made.parent)
    return target


@pytest.mark.parametrize("creator", CREATORS)
def test_a_parent_directory_others_may_write_without_the_sticky_bit_is_refused(tmp_path, creator):
    """Another user who may write to a directory above the buffer's files (not sticky) could rename them
    away and put a directory or link of theirs in their place: refused, naming that directory, nothing made."""
    make, name = _creators(tmp_path)[creator]
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o700)
    target = _prepared(creator, open_dir)
    made_before = sorted(open_dir.rglob("*"))
    for mode in (0o777, 0o770):
        open_dir.chmod(mode)
        with pytest.raises(ValueError, match=rf"{name}=.*the directory '{open_dir}' above it is writable by other"):
            make(target)
        assert sorted(open_dir.rglob("*")) == made_before
    # One level further up counts too; a sticky directory is fine (only an entry's owner may rename it).
    open_dir.chmod(0o700)
    tmp_path.chmod(0o777)
    try:
        with pytest.raises(ValueError, match=rf"the directory '{tmp_path}' above it"):
            make(target)
        tmp_path.chmod(0o1777)
        make(target)
    finally:
        tmp_path.chmod(0o700)


@pytest.mark.parametrize("creator", CREATORS)
def test_a_parent_directory_of_another_user_is_refused(shared_root, creator):
    """A directory above it that another real user owns (they may change it whatever its mode), or a
    symlink of theirs on the way: refused before anything is made."""
    make, name = _creators(shared_root)[creator]
    theirs = shared_root / "theirs"
    as_nobody(f"import os; os.mkdir({str(theirs)!r}); os.chmod({str(theirs)!r}, 0o755)")
    target = _prepared(creator, theirs)
    made_before = sorted(theirs.rglob("*"))
    with pytest.raises(ValueError, match=rf"{name}=.*the directory '{theirs}' above it belongs to user"):
        make(target)
    assert sorted(theirs.rglob("*")) == made_before
    mine = shared_root / "mine"
    mine.mkdir(mode=0o700)
    link = shared_root / "link"
    as_nobody(f"import os; os.symlink({str(mine)!r}, {str(link)!r})")
    target = _prepared(creator, mine)
    made_before = sorted(mine.rglob("*"))
    with pytest.raises(ValueError, match=rf"the directory '{link}' above it belongs to user"):
        make(link / target.name)
    assert sorted(mine.rglob("*")) == made_before


def test_missing_parents_are_made_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        disk(tmp_path / "a" / "b" / "buf").close()
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


# -- refusals before side effects -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["disk", "shared"])
@pytest.mark.parametrize("abandon_after", [-1.0, float("nan"), "5"])
def test_bad_abandon_after_leaves_no_file_and_no_descriptor(tmp_path, kind, abandon_after):
    """A bad ``abandon_after`` is refused before the first file or descriptor: the path stays usable."""
    options = {"path": tmp_path / "buf"} if kind == "disk" else {"dir": tmp_path}
    before = open_fds()
    with pytest.raises((TypeError, ValueError), match="abandon_after"):
        PrioritizedReplay(8, SCHEMA, storage=kind, storage_options={**options, "abandon_after": abandon_after})
    assert open_fds() == before
    assert list(tmp_path.iterdir()) == []
    PrioritizedReplay(8, SCHEMA, storage=kind, storage_options=options).close()


def test_refused_reopen_and_refused_new_buffer_leave_nothing(tmp_path):
    """reopen of a path holding no buffer makes no directory; a new buffer where one is, and a reopen of one
    with another capacity, leave no descriptor and the buffer as it was."""
    before = open_fds()
    with pytest.raises(ValueError, match="holds no replay buffer"):
        disk(tmp_path / "none", reopen=True)
    assert list(tmp_path.iterdir()) == []
    buf = disk(tmp_path / "buf")
    buf.add(rows(1, 3))
    buf.close()
    files = {p.name: p.read_bytes() for p in (tmp_path / "buf").iterdir()}
    before = open_fds()
    with pytest.raises(ValueError, match="holds a replay buffer already"):
        disk(tmp_path / "buf")
    with pytest.raises(ValueError, match="capacity"):
        disk(tmp_path / "buf", capacity=32, reopen=True)
    assert open_fds() == before
    assert {p.name: p.read_bytes() for p in (tmp_path / "buf").iterdir()} == files
    assert len(PrioritizedReplay.reopen(tmp_path / "buf")) == 3


# -- a full disk ------------------------------------------------------------------------------------

_FULL_DISK = """
import os, resource, sys
import numpy as np
from hetero_replay import PrioritizedReplay
sys.path.insert(0, {root!r})
from tests.test_paths_security import SCHEMA, disk, rows

path, step = {path!r}, {step!r}
if step == "create":
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        disk(path, capacity=4096)
    except OSError as e:
        print("refused", type(e).__name__, e)
        sys.exit(0)
    sys.exit("a buffer was made past RLIMIT_FSIZE")
buf = disk(path, capacity=64)
buf.add(rows(1, 20))
buf.flush()  # the durable point the full disk must leave readable
buf.add(rows(21, 20))
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
try:
    buf.flush()
except OSError as e:
    print("refused", type(e).__name__, e)
    os._exit(0)  # as a process that died on a full disk: no last durable point at close
sys.exit("a durable point was written past RLIMIT_FSIZE")
"""


def run_full_disk(path: Path, step: str) -> str:
    script = _FULL_DISK.format(root=str(ROOT), path=str(path), step=step)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=JOIN_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_full_disk_when_creating_leaves_nothing(tmp_path):
    """Creating a disk buffer on a full disk raises OSError and leaves no file (nor the directory it made)."""
    out = run_full_disk(tmp_path / "buf", "create")
    assert "refused" in out and "File too large" in out, out
    assert list(tmp_path.iterdir()) == []


def test_full_disk_when_flushing_keeps_the_last_durable_point(tmp_path):
    """A durable point that fails on a full disk raises OSError naming the file; the previous point is
    still readable, with its rows, and no temporary is left."""
    out = run_full_disk(tmp_path / "buf", "flush")
    assert "refused OSError" in out and STATE_FILE in out, out
    again = PrioritizedReplay.reopen(tmp_path / "buf")
    assert len(again) == 20
    got = again.storage.gather(np.arange(20))
    assert sorted(got["id"].tolist()) == list(range(1, 21))
    again.close()
    assert {p.name for p in (tmp_path / "buf").iterdir()} == {CONTROL_FILE, ROW_FILE, STATE_FILE, LOCK_FILE}


_SMALL_SHM = """
import sys
import numpy as np
from hetero_replay import PrioritizedReplay
schema = {{"id": ((), np.int64), "obs": ((1024,), np.float32)}}
try:
    buf = PrioritizedReplay(1024, schema, storage="shared", storage_options={{"dir": {dir!r}}})
except OSError as e:
    print("refused", type(e).__name__, e)
    sys.exit(0)
ids = np.arange(1024, dtype=np.int64)
buf.add({{"id": ids, "obs": np.ones((1024, 1024), np.float32)}})  # 4 MiB into a 1 MiB file system
sys.exit("a segment larger than its file system was made")
"""


def test_shared_segment_too_big_for_its_file_system_is_refused_not_a_sigbus(small_tmpfs):
    """A 'shared' segment larger than its (small) file system: OSError when it is made, where it was a
    sparse file whose first add past the free space killed the process with SIGBUS."""
    script = _SMALL_SHM.format(dir=str(small_tmpfs))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=JOIN_S)
    assert done.returncode == 0, (done.returncode, done.stdout + done.stderr)
    assert "refused OSError" in done.stdout and "No space left" in done.stdout, done.stdout
    assert list(small_tmpfs.iterdir()) == []
