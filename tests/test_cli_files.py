"""The command line and the advisor with hostile or mistaken files and paths (issue 25).

What the ``hetero-replay`` command reads (``--profile``, the profile cache) and
writes (``--out``: advice, comparison reports, cached profiles) is treated as
the storage's files are (:mod:`hetero_replay.storage.files`): files it writes
under known names are never written through a planted link, folders another
user could change are refused, and a file it reads that is no profile (a FIFO,
a directory, a huge or deeply nested file) is a clear error, exit status 2, not
a hang or a traceback. Bad arguments are refused before the minutes of work.
Real processes for the command, real FIFOs, symlinks and folder modes.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_replay.advisor import ProfileError, advise
from hetero_replay.advisor import profile as profiling
from hetero_replay.advisor.profile import Profile
from hetero_replay.apps.compare import report
from tests.test_advisor import ranked_profile
from tests.test_compare import result

VICTIM_TEXT = b"the victim's own bytes\n"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The installed command, in a process of its own (a hang is a timeout, not a stuck test run)."""
    code = "import sys; from hetero_replay.apps.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)


def refused(proc: subprocess.CompletedProcess[str], match: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and match in proc.stderr, proc.stderr[-2000:]


# -- what it reads -----------------------------------------------------------------------------------


def test_a_fifo_given_as_the_profile_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    refused(cli("advise", "--profile", str(fifo)), "not a regular file")


def test_a_directory_given_as_the_profile_is_refused_without_a_traceback(tmp_path):
    refused(cli("advise", "--profile", str(tmp_path)), "not a regular file")


@pytest.mark.parametrize("kind", ["huge", "nested"])
def test_a_huge_or_deeply_nested_profile_is_a_profile_error(tmp_path, monkeypatch, kind):
    path = tmp_path / "p.json"
    if kind == "huge":
        monkeypatch.setattr(profiling, "MAX_PROFILE_BYTES", 1 << 10)
        path.write_bytes(b" " * (2 << 10))
    else:
        path.write_text("[" * 100_000 + "]" * 100_000)  # json.loads raised RecursionError
    with pytest.raises(ProfileError, match=str(path)):
        Profile.load(path)


def test_a_cache_folder_others_may_write_is_refused_before_a_planted_profile_is_read(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "profiles").mkdir(parents=True)
    (cache / "profiles").chmod(0o777)  # anyone may plant <lib>-<algo>-<env>-<digest>.json there
    monkeypatch.setenv("HETERO_REPLAY_CACHE", str(cache))
    from tests.test_advisor import spec

    with pytest.raises(ValueError, match="profile cache=.*writable by other users"):
        profiling.cache_path(spec(), [], ["cpu"])
    (cache / "profiles").chmod(0o700)
    assert profiling.cache_path(spec(), [], ["cpu"]).parent == cache / "profiles"
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("HETERO_REPLAY_CACHE", str(fresh))
    old = os.umask(0)
    try:
        profiling.cache_path(spec(), [], ["cpu"])
    finally:
        os.umask(old)
    assert stat.S_IMODE((fresh / "profiles").stat().st_mode) == 0o700
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700


# -- what it writes ----------------------------------------------------------------------------------


def _plant(folder: Path, names: list[str]) -> Path:
    victim = folder.parent / "victim"
    victim.write_bytes(VICTIM_TEXT)
    folder.mkdir(mode=0o700)
    for name in names:
        (folder / name).symlink_to(victim)
    return victim


def test_advice_files_are_never_written_through_a_planted_link(tmp_path):
    names = ["advice.txt", "advice.json", "advice.png", "profile.json"]
    victim = _plant(tmp_path / "out", names)
    advice = advise(profile=ranked_profile().save(tmp_path / "p.json"), staleness=(0,))
    advice.save(tmp_path / "out")
    assert victim.read_bytes() == VICTIM_TEXT
    for name in names:
        assert (tmp_path / "out" / name).is_file() and not (tmp_path / "out" / name).is_symlink(), name


def test_comparison_reports_are_never_written_through_a_planted_link(tmp_path):
    names = ["runs.csv", "curves.csv", "results.json", "comparison.png"]
    victim = _plant(tmp_path / "out", names)
    results = [result("uniform", 0, 10.0, [0, 100, 200]), result("per", 0, 8.0, [0, 200, 300])]
    report.write_all(results, report.summarize(results), str(tmp_path / "out"))
    assert victim.read_bytes() == VICTIM_TEXT
    assert all(not (tmp_path / "out" / name).is_symlink() for name in names)


def test_an_out_folder_others_may_change_is_refused_before_any_work(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    out = str(open_dir / "out")
    # compare: before, the runs trained first and the files then went where another user could swap them.
    refused(cli("compare", "--steps", "100", "--seeds", "1", "--out", out), "writable by other users")
    refused(cli("advise", "--profile", str(ranked_profile().save(tmp_path / "p.json")), "--out", out), "--out=")
    assert os.listdir(open_dir) == []


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["compare", "--first-seed", "-1", "--steps", "100", "--seeds", "1"], "seeds must be >= 0"),
        (["advise", "--lib", "sb3", "--validate", "--top", "0"], "--top must be >= 1"),
        (["advise", "--lib", "sb3", "--validate", "--repeats", "0"], "--repeats must be >= 1"),
        (["advise", "--lib", "sb3", "--validate", "--env-steps", "0"], "--env-steps must be >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_the_runs_or_the_profiling(tmp_path, args, match):
    # Before: a traceback from gymnasium once the first run started, or an error after minutes of profiling.
    refused(cli(*args, "--no-progress", "--out", str(tmp_path / "out"), timeout=120), match)
    assert not (tmp_path / "out").exists()
