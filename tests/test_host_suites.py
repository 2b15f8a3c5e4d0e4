"""The host libraries' own buffer and collector tests, with our buffers in place of theirs: a regression gate.

Our buffers subclass the host libraries' and promise to stand wherever theirs
do. This runs the hosts' own tests of those classes, from the released sources
of the installed versions, in a subprocess ``pytest`` whose plugin
(``tests/host_swap.py``) replaces the host's classes with ours before the test
modules import them:

* Tianshou: ``test/base/test_buffer.py`` and ``test/base/test_collector.py``
  (``PrioritizedReplayBuffer`` -> ``HeteroPrioritizedReplayBuffer``,
  ``PrioritizedVectorReplayBuffer`` -> ``HeteroPrioritizedVectorReplayBuffer``).
  Tianshou's sdist on PyPI holds only the package (no tests, checked for
  2.0.1), so they come from the source archive of the release's tag
  ``v<version>`` in its repository: fetched only where ``HETERO_REPLAY_FETCH_HOST_TESTS=1``
  says that host is reachable (CI reaches package registries only), or
  placed in ``build/host-suites/tianshou-<version>.tar.gz`` beforehand.
* Stable-Baselines3: ``tests/test_buffers.py`` and ``tests/test_n_step_replay.py`` from its
  sdist on PyPI (``pip download --no-deps --no-binary :all:``), with ``ReplayBuffer`` ->
  ``PrioritizedReplayBuffer``, ``DictReplayBuffer`` -> ``DictPrioritizedReplayBuffer`` and
  ``NStepReplayBuffer`` -> ``NStepPrioritizedReplayBuffer``.

The sources are fetched at test time into ``build/host-suites/`` (kept there
for the next run; nothing of them enters the repository). Without network the
test skips, saying what it could not fetch. :data:`NOT_APPLICABLE` lists, with
the reason, each host test that asserts something our buffers deliberately do
otherwise; every other test must pass.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "host-suites"
PLUGIN_DIR = Path(__file__).resolve().parent  # holds host_swap.py

#: Per host: the distribution, the files its tests need (relative to its source root), the tests to run.
SUITES = {
    "tianshou": (
        "tianshou",
        [
            "test/__init__.py",
            "test/base/__init__.py",
            "test/base/env.py",
            "test/base/test_buffer.py",
            "test/base/test_collector.py",
        ],  # fmt: skip
        ["test/base/test_buffer.py", "test/base/test_collector.py"],
    ),
    "sb3": (
        "stable-baselines3",
        ["tests/test_buffers.py", "tests/test_n_step_replay.py"],
        ["tests/test_buffers.py", "tests/test_n_step_replay.py"],
    ),
}

#: Host tests (node id prefixes) that cannot apply to our buffers, each with the reason.
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "tianshou": {},
    "sb3": {
        "tests/test_buffers.py::test_buffer_dtypes": (
            "sets `full = True` on an empty buffer and samples 64 rows of its zero-filled storage; a "
            "prioritized buffer draws by priority mass, which an empty buffer has none of, so it refuses "
            "(ValueError) rather than serve rows never written. The dtypes it checks are the storage's, "
            "built by SB3's own ReplayBuffer.__init__, which ours calls."
        ),
        "tests/test_n_step_replay.py::test_run": (
            "checks that the stock DQN/SAC/TD3 with n_steps=3 build an NStepReplayBuffer: they build SB3's own "
            "(bound in SB3's modules at import), while the swap rebinds the test's name to ours; the PER "
            "algorithms' n_steps are tested in tests/test_sb3_nstep.py."
        ),
        "tests/test_n_step_replay.py::test_n_steps_with_dict_obs[HerReplayBuffer]": (
            "an artefact of the swap, not of our buffers: SB3's DictReplayBuffer.__init__ calls "
            "super(ReplayBuffer, self) with the module's name ReplayBuffer, which the swap rebinds to ours, "
            "so SB3's HerReplayBuffer (a DictReplayBuffer) cannot be built while it is in place."
        ),
    },
}

#: Seconds a download may take before the test gives up and skips.
FETCH_TIMEOUT = 300


@pytest.mark.slow
@pytest.mark.parametrize("host", sorted(SUITES))
def test_host_library_tests_pass_with_our_buffers_swapped_in(host: str, tmp_path: Path) -> None:
    distribution, needed, tests = SUITES[host]
    pytest.importorskip({"tianshou": "tianshou", "sb3": "stable_baselines3"}[host])
    version = importlib.metadata.version(distribution)
    archive = _fetch(host, version)
    _extract(archive, needed, tmp_path)
    deselected = [arg for prefix in NOT_APPLICABLE[host] for arg in ("--deselect", prefix)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGIN_DIR), os.environ.get("PYTHONPATH")])))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *tests,
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "host_swap",
            f"--host-swap={host}",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            *deselected,
        ],  # fmt: skip
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    summary = run.stdout.strip().splitlines()[-1:] or [run.stderr]
    assert run.returncode == 0, f"{host} {version}'s own tests with our buffers: {summary[0]}\n{run.stdout[-6000:]}"
    assert " passed" in summary[0], summary[0]


def _fetch(host: str, version: str) -> Path:
    """The released source archive of ``host`` at ``version``, from the cache or downloaded into it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    if host == "sb3":
        return _pip_sdist("stable-baselines3", "stable_baselines3", version)
    target = CACHE / f"tianshou-{version}.tar.gz"
    if not target.exists():
        if os.environ.get("HETERO_REPLAY_FETCH_HOST_TESTS") != "1":
            pytest.skip(
                f"Tianshou {version}'s sdist has no tests; put its repository's v{version} source archive at {target} "
                "or set HETERO_REPLAY_FETCH_HOST_TESTS=1 where its repository is reachable"
            )
        url = f"https://github.com/thu-ml/tianshou/archive/refs/tags/v{version}.tar.gz"
        partial = target.with_name(target.name + f".{os.getpid()}.part")
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as response, partial.open("wb") as out:
                out.write(response.read())
        except OSError as e:  # URLError and timeouts included: no network, or no such tag
            partial.unlink(missing_ok=True)
            pytest.skip(f"cannot fetch Tianshou {version}'s tests from {url}: {e}")
        partial.replace(target)  # a complete archive or none: an interrupted download is never cached
    return target


def _pip_sdist(distribution: str, stem: str, version: str) -> Path:
    """``distribution``'s sdist at ``version``, through ``pip download``."""
    found = sorted(CACHE.glob(f"{stem}-{version}.tar.gz"))
    if not found:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
                   "--dest", str(CACHE), f"{distribution}=={version}"]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip download of {distribution}=={version}'s sdist took over {FETCH_TIMEOUT} s")
        found = sorted(CACHE.glob(f"{stem}-{version}.tar.gz"))
        if done.returncode != 0 or not found:
            pytest.skip(f"cannot download {distribution}=={version}'s sdist: {done.stderr.strip()[-500:]}")
    return found[0]


def _extract(archive: Path, paths: list[str], dest: Path) -> None:
    """Write ``paths`` (relative to the archive's one top folder) from ``archive`` under ``dest``."""
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        for path in paths:
            member = tar.extractfile(f"{top}/{path}")
            if member is None:
                raise FileNotFoundError(f"{archive.name} has no file {path}")
            with contextlib.closing(member):
                target = dest / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(member.read())
