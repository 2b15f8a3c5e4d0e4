"""No hang or crash at fork or at exit, whatever another thread is doing inside the library.

Each public entry point runs in a loop on a daemon thread while the main thread
(a) forks: the child must get a usable buffer and exit 0, the parent must come
back from ``fork``; then (b) exits: the process must exit 0 (it died with
SIGABRT, "terminate called without an active exception", when the thread was
inside a native call, and ``fork`` never returned while the thread was inside
``RelaxedReplay.load_state_dict`` or the SB3 buffer's ``reset``).

Real processes: one driver process per host library imports it once and forks
a fresh scenario process per entry point, which forks its own children and
then exits through the interpreter's normal exit (``sys.exit``). Every wait is
bounded: a process that does not finish is killed and reported as hung.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ENGINE_ENTRIES = ["add", "sample", "update_priorities", "state_dict", "load_state_dict", "save", "flush", "close"]
ENTRIES = {
    "engine": ENGINE_ENTRIES,
    "fpga": ENGINE_ENTRIES,  # the engine on the FPGA tree (its emulation: C++ of the HLS source, GIL released)
    "relaxed": ENGINE_ENTRIES,
    "sb3": ["add", "sample", "update_priorities", "update_priorities_tensor", "reset"],
    "tianshou": ["add", "sample", "update_weight", "update_weight_tensor"],
}

# Run as `python -c _DRIVER KIND FORKS ENTRY...`; prints {entry: [status, log tail]} as JSON.
_DRIVER = r'''
import json, os, signal, sys, tempfile, threading, time
import numpy as np

kind, forks, entries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tmp = tempfile.mkdtemp()
N = 2048  # batch operations this large run on the C++ thread pool
SCHEMA = {"obs": ((8,), "float32"), "reward": ((), "float32")}


def rows(n):
    return {"obs": np.ones((n, 8), np.float32), "reward": np.ones(n, np.float32)}


def engine():
    from hetero_replay import PrioritizedReplay, RelaxedReplay

    buf = PrioritizedReplay(4 * N, SCHEMA, seed=0, tree="fpga" if kind == "fpga" else "auto")
    buf.add(rows(4 * N))
    return RelaxedReplay(buf, staleness=1, worker="thread") if kind == "relaxed" else buf


def build():
    """Returns (buffer, {entry: one call of it}, a use of the buffer that a forked child makes)."""
    if kind in ("engine", "relaxed", "fpga"):
        buf = engine()
        state = buf.state_dict()
        idx, td = np.arange(N), np.random.default_rng(0).random(N)
        if kind == "relaxed":  # its updates wait for the batch that needs them: a learner samples between them
            update = lambda: buf.update_priorities(buf.sample(N).indices, td)
        else:
            update = lambda: buf.update_priorities(idx, td)
        calls = {
            "add": lambda: buf.add(rows(N)),
            "sample": lambda: buf.sample(N),
            "update_priorities": update,
            "state_dict": buf.state_dict,
            "load_state_dict": lambda: buf.load_state_dict(state),
            "save": lambda: buf.save(os.path.join(tmp, f"{os.getpid()}.hrp")),
            "flush": buf.flush,
            "close": lambda: engine().close(),
        }

        def use():
            s = buf.sample(16)
            buf.update_priorities(s.indices, np.ones(16))
            buf.add(rows(4))

        return buf, calls, use
    if kind == "sb3":
        from gymnasium import spaces
        from hetero_replay.adapters.sb3 import PrioritizedReplayBuffer

        envs = N // 8
        buf = PrioritizedReplayBuffer(
            4 * N, spaces.Box(-1, 1, (8,), np.float32), spaces.Discrete(2), device="cpu", n_envs=envs, seed=0
        )
        obs, act, rew, done = np.zeros((envs, 8), np.float32), np.zeros(envs, np.int64), np.ones(envs), np.zeros(envs)
        infos = [{} for _ in range(envs)]
        add = lambda: buf.add(obs, obs, act, rew, done, infos)
        for _ in range(8):
            add()
        idx, td = buf.sample(N).indices, np.ones(N)
        import torch

        td_tensor = torch.ones(N)  # torch's conversions, too, must not run on a daemon thread at exit
        calls = {"add": add, "sample": lambda: buf.sample(N), "update_priorities": lambda: buf.update_priorities(idx, td),
                 "update_priorities_tensor": lambda: buf.update_priorities(idx, td_tensor), "reset": buf.reset}

        def use():
            add()
            buf.update_priorities(buf.sample(16).indices, np.ones(16))

        return buf, calls, use
    from tianshou.data import Batch
    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

    envs = 8
    buf = HeteroPrioritizedVectorReplayBuffer(4 * N, envs, random_seed=0)
    step = Batch(obs=np.zeros((envs, 8), np.float32), act=np.zeros(envs, np.int64), rew=np.ones(envs),
                 terminated=np.zeros(envs, bool), truncated=np.zeros(envs, bool),
                 obs_next=np.zeros((envs, 8), np.float32), info=Batch())
    add = lambda: buf.add(step, buffer_ids=np.arange(envs))
    for _ in range(N // envs):
        add()
    idx, weights = buf.sample(N)[1], np.ones(N)
    import torch

    td_tensor = torch.ones(N)
    calls = {"add": add, "sample": lambda: buf.sample(N), "update_weight": lambda: buf.update_weight(idx, weights),
             "update_weight_tensor": lambda: buf.update_weight(idx, td_tensor)}

    def use():
        add()
        buf.update_weight(buf.sample(16)[1], np.ones(16))

    return buf, calls, use


def wait_or_kill(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def run_scenario(call):
    """In a fresh process: loop `call` on a daemon thread, fork `forks` times, then exit normally."""
    calls, errors = [0], []
    # What a call returns is kept: torch (2.13) itself aborts a process whose daemon thread frees a tensor
    # while the interpreter finalizes (a torch-only loop of torch.empty: 15 of 15 runs), so a batch of
    # tensors freed in this loop, outside the library, would test torch, not the library.
    results = []

    def loop():
        while True:
            try:
                results.append(call())
            except Exception as e:
                errors.append(repr(e))
                return
            calls[0] += 1

    threading.Thread(target=loop, daemon=True).start()
    while calls[0] < 2 and not errors:
        time.sleep(0.001)
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            try:
                use()
            except BaseException as e:
                print("the forked child could not use the buffer:", repr(e), flush=True)
                os._exit(1)
            os._exit(0)
        status = wait_or_kill(pid, 60)
        if status != 0:
            print(f"forked child: {'hung' if status is None else f'exit status {status}'}", flush=True)
            os._exit(3)
    if errors:
        print("the looping call failed:", errors[0], flush=True)
        os._exit(4)
    sys.exit(0)  # the interpreter's normal exit, the daemon thread inside `entry` or about to be


buf, entry_calls, use = build()  # once: each scenario process gets its own copy
results = {}
for entry in entries:
    log = os.path.join(tmp, entry + ".log")
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            run_scenario(entry_calls[entry])
        except BaseException as e:
            if isinstance(e, SystemExit):
                raise
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(5)
    status = wait_or_kill(pid, 120)
    with open(log, errors="replace") as f:
        tail = f.read()[-2000:]
    results[entry] = ["hung" if status is None else status, tail]
print(json.dumps(results))
'''


def _drive(kind: str, forks: int) -> dict[str, list]:
    if kind == "sb3":
        pytest.importorskip("stable_baselines3")
    if kind == "tianshou":
        pytest.importorskip("tianshou")
    env = dict(os.environ, HETERO_REPLAY_NUM_THREADS="2")
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, kind, str(forks), *ENTRIES[kind]],
        capture_output=True, text=True, timeout=900, env=env, cwd=os.path.dirname(os.path.dirname(__file__)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_cache: dict[tuple[str, int], dict[str, list]] = {}


def _result(kind: str, entry: str, forks: int) -> None:
    if (kind, forks) not in _cache:
        _cache[kind, forks] = _drive(kind, forks)
    status, log = _cache[kind, forks][entry]
    assert status == 0, f"{kind}.{entry}: {'hung' if status == 'hung' else f'exit status {status}'}\n{log}"


_CASES = [(kind, entry) for kind, entries in ENTRIES.items() for entry in entries]


@pytest.mark.parametrize(("kind", "entry"), _CASES, ids=[f"{k}.{e}" for k, e in _CASES])
def test_fork_then_exit_while_another_thread_is_inside(kind: str, entry: str) -> None:
    _result(kind, entry, forks=3)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "entry"), _CASES, ids=[f"{k}.{e}" for k, e in _CASES])
def test_many_forks_then_exit_while_another_thread_is_inside(kind: str, entry: str) -> None:
    _result(kind, entry, forks=30)


_NATIVE_EXIT = r"""
import sys, threading
import numpy as np
from hetero_replay import _native

call = sys.argv[1]
tree = _native.SumTree(1 << 16, 16, "float32")
idx, val = np.arange(1 << 16), np.ones(1 << 16, np.float32)
calls = {"tree.update": lambda: tree.update(idx, val), "parallel_for": lambda: _native.run_parallel_for_test(1 << 20, 2, -1)}
running = threading.Event()


def loop():
    while True:
        calls[call]()
        running.set()


threading.Thread(target=loop, daemon=True).start()
running.wait()
sys.exit(0)
"""


@pytest.mark.parametrize("call", ["tree.update", "parallel_for"])
def test_exit_while_a_daemon_thread_is_in_a_native_call_without_the_gil(call: str) -> None:
    # No buffer lock around it: the thread is inside C++ (GIL released, the pool running) when the
    # interpreter finalizes. It is parked where it takes the GIL back, never unwound through C++ frames.
    env = dict(os.environ, HETERO_REPLAY_NUM_THREADS="2")
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", _NATIVE_EXIT, call], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, f"exit status {proc.returncode}: {proc.stderr[-2000:]}"


# -- the relaxed pipeline's worker thread ------------------------------------------------------


def _relaxed_over(storage: str, path: str):
    from hetero_replay import PrioritizedReplay, RelaxedReplay

    options = {"path": path} if storage == "disk" else None
    inner = PrioritizedReplay(64, {"obs": ((4,), "float32")}, seed=0, storage=storage, storage_options=options)
    inner.add({"obs": np.ones((64, 4), np.float32)})
    return inner, RelaxedReplay(inner, staleness=1, worker="thread")


@pytest.mark.parametrize("storage", ["shared", "disk"])
def test_the_worker_stopped_by_a_closed_buffer_reports_it_at_the_learners_next_call(storage: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        inner, relaxed = _relaxed_over(storage, tmp)
        relaxed.update_priorities(relaxed.sample(8).indices, np.ones(8))
        batch = relaxed.sample(8)  # the worker is running now
        worker = relaxed._core.thread
        assert worker is not None
        inner.close()  # under the pipeline: its worker's next job fails
        with relaxed._core.cond:
            relaxed._core.cond.notify_all()
        worker.join(timeout=60)
        assert not worker.is_alive()
        with pytest.raises(Exception, match="pipeline's worker thread stopped") as raised:
            relaxed.update_priorities(batch.indices, np.ones(8))
        assert raised.value.__cause__ is not None  # the worker's own error, chained
        assert relaxed._core.worker_error is None  # raised once


def test_at_exit_an_unclosed_relaxed_replay_does_not_wait_for_its_worker() -> None:
    # The exit handler holds every buffer's lock (forksafe); stopping the worker must not wait for it then.
    code = (
        "import numpy as np\n"
        "from hetero_replay import PrioritizedReplay, RelaxedReplay\n"
        "inner = PrioritizedReplay(4096, {'obs': ((8,), 'float32')}, seed=0)\n"
        "inner.add({'obs': np.ones((4096, 8), np.float32)})\n"
        "relaxed = RelaxedReplay(inner, staleness=1, worker='thread')\n"
        "for _ in range(50):\n"
        "    b = relaxed.sample(2048)\n"
        "    relaxed.update_priorities(b.indices, np.ones(2048))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


_FORK_WHILE_CREATING = r"""
import os, threading, time
from hetero_replay.forksafe import OUTER, ForkSafeLock

outer, made = ForkSafeLock(OUTER), []


def nest():  # as SB3's reset and RelaxedReplay.load_state_dict do: a new buffer (and lock) under a lock
    while True:
        with outer:
            made.append(ForkSafeLock())


threading.Thread(target=nest, daemon=True).start()
while not made:  # the thread is nesting locks now
    time.sleep(0.001)
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        os._exit(0 if outer.acquire(timeout=5) else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
"""


def test_a_fork_while_a_thread_holding_a_lock_creates_one_returns() -> None:
    # In a subprocess: before the fix, fork never returned (a lock-order inversion with the registry lock).
    proc = subprocess.run([sys.executable, "-c", _FORK_WHILE_CREATING], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- a lock held for good does not hang exit ----------------------------------------------------

_EXIT_WHILE_A_LOCK_IS_HELD = r"""
import atexit, os, sys, threading, time
import numpy as np

late = []  # an exit handler that runs after the library's (registered before it): it uses the buffer
atexit.register(lambda: late.append(_use()) or print("late", late[0], flush=True))

from hetero_replay import PrioritizedReplay, forksafe

forksafe.EXIT_WAIT_SECONDS = float(sys.argv[1])
buf = PrioritizedReplay(64, {"obs": ((4,), "float32")}, seed=0)
buf.add({"obs": np.ones((64, 4), np.float32)})


def _use():
    try:
        buf.sample(4)
        return "sampled"
    except RuntimeError as e:
        return "refused: " + str(e)


def stuck():  # a writer under the buffer's lock, blocked for good on a pipe nobody reads
    _, w = os.pipe()
    with buf._lock:
        entered.set()
        os.write(w, b"x" * (1 << 22))


entered = threading.Event()
threading.Thread(target=stuck, daemon=True).start()
entered.wait()
print("exiting", time.monotonic(), flush=True)
sys.exit(0)
"""


def test_exit_waits_for_a_lock_held_for_good_only_exit_wait_seconds() -> None:
    # Before the bound, the exit handler waited for that lock forever: the process never exited.
    wait = 1.0
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_WHILE_A_LOCK_IS_HELD, str(wait)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("exiting")
    # The handler that ran after the library's got an error at once, not a wait of its own.
    assert lines[1].startswith("late refused:") and "EXIT_WAIT_SECONDS" in lines[1], proc.stdout
    assert time.monotonic() >= float(lines[0].split()[1]) + wait  # it did wait the bound
