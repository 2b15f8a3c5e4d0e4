"""Soak test of the storage service (issue 25): writers killed at random, a relaxed learner, forks, durable points.

    python benchmarks/soak.py                                   # 10 minutes on each of disk, shared, 4 shards
    python benchmarks/soak.py --minutes 2 --only disk shared    # a shorter run

For each target (``disk``: ``PrioritizedReplay(storage="disk")``; ``shared``:
``storage="shared"``; ``shards``: ``ShardedReplay(4, ..., storage="disk")``)
one learner process samples through the staleness schedule (``RelaxedReplay``
with a worker thread, or the sharded replay with ``staleness=2``) and updates
priorities, while ``--writers`` actor processes add rows through writer
handles. Every few seconds one writer is SIGKILLed (and replaced), the learner
makes a durable point (``flush``), and forks a child that must sample the
inherited buffer and exit 0 (not for the sharded replay: its learner holds a
Ray connection, which a fork does not carry).

Every row carries its writer, its sequence number and a payload computed from
both, so a served row is checked whole. At the end the buffer is closed and
reopened from its last durable point (disk) and the descriptors and files left
behind are counted. Reported per target:

* rows acknowledged by writers (``add`` returned), rows committed (tickets the
  learner saw), rows lost outside the documented window (acknowledged but never
  committed, less the in-flight rows of killed writers): must be 0;
* torn or damaged rows served (payload not matching its id): must be 0;
* hangs (an operation over ``--hang-seconds``), crashes (a fork child or writer
  that died other than by our SIGKILL): must be 0;
* rows after reopen vs the last durable point; leaked descriptors and files: must be 0.

Exit status 1 if any must-be-0 count is not. Not part of CI (minutes long).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import gc
import multiprocessing as mp
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetero_replay import PrioritizedReplay, RelaxedReplay, ShardedReplay

PAYLOAD = 16
SCHEMA = {"wid": ((), "int64"), "seq": ((), "int64"), "payload": ((PAYLOAD,), "float32")}
CHUNK = 8  # rows per writer add
MAX_WRITERS = 4096  # writers over a run (each replacement of a killed one is a new writer)


def payload_of(wid: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The payload a row of writer ``wid`` and sequence ``seq`` carries (checked on every sample)."""
    base = (wid.astype(np.float64) * 1_000_003 + seq.astype(np.float64)) % 65_521
    return (base[:, None] + np.arange(PAYLOAD)[None, :]).astype(np.float32)


def writer_main(handle: Any, wid: int, acked: Any, stop: Any) -> None:
    """Add chunks of rows until stopped (or SIGKILLed); ``acked[wid]``: the rows returned ``add`` calls acknowledged."""
    seq = 0
    while not stop.value:
        s = np.arange(seq, seq + CHUNK, dtype=np.int64)
        w = np.full(CHUNK, wid, np.int64)
        handle.add({"wid": w, "seq": s, "payload": payload_of(w, s)})
        seq += CHUNK
        acked[wid] = seq  # one writer per slot: no lock needed
        time.sleep(0.01)


@dataclass
class Report:
    target: str
    seconds: float = 0.0
    learner_steps: int = 0
    acked: int = 0
    committed: int = 0
    killed_writers: int = 0
    lost_outside_window: int = 0
    torn_or_damaged_served: int = 0
    abandoned_slots: int = 0
    hangs: int = 0
    crashes: int = 0
    forks: int = 0
    durable_points: int = 0
    rows_at_last_point: int = 0
    rows_after_reopen: int = -1
    leaked_fds: int = 0
    leaked_files: int = 0
    notes: list[str] = field(default_factory=list)

    def failed(self) -> bool:
        return any(
            (self.lost_outside_window, self.torn_or_damaged_served, self.hangs, self.crashes,
             self.leaked_fds, self.leaked_files)
        ) or (self.rows_after_reopen not in (-1, self.rows_at_last_point))  # fmt: skip


class Watchdog:
    """Counts an operation as a hang when it runs past ``seconds`` (and dumps every thread's stack once)."""

    def __init__(self, seconds: float, report: Report) -> None:
        self.seconds, self.report = seconds, report

    def __call__(self, what: str, fn: Any, *args: Any) -> Any:
        done = threading.Event()

        def watch() -> None:
            if not done.wait(self.seconds):
                self.report.hangs += 1
                self.report.notes.append(f"hang: {what} over {self.seconds} s")
                import faulthandler

                faulthandler.dump_traceback(all_threads=True)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            return fn(*args)
        finally:
            done.set()


def check_rows(data: dict[str, np.ndarray]) -> int:
    """Rows whose payload does not match their (writer, sequence): torn or damaged."""
    expected = payload_of(data["wid"], data["seq"])
    return int((~np.isclose(data["payload"], expected).all(axis=1)).sum())


def fork_and_sample(replay: Any) -> int:
    """Fork a child that samples the inherited buffer and exits; its exit status (or -9 after 60 s)."""
    pid = os.fork()
    if pid == 0:  # the child: a usable buffer, then out without running the parent's exit handlers
        code = 0
        try:
            batch = replay.sample(16)
            code = 3 if check_rows(batch.data) else 0
        except BaseException:
            code = 4
        os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def soak(target: str, minutes: float, writers: int, capacity: int, hang_seconds: float, root: Path) -> Report:
    report = Report(target)
    dog = Watchdog(hang_seconds, report)
    path = Path(tempfile.mkdtemp(prefix=f"soak-{target}-", dir=root))
    ctx = mp.get_context("spawn")
    # Lock-free flags: a writer SIGKILLed while holding a multiprocessing lock (an Event's) would hang the learner.
    stop = ctx.RawValue("b", 0)
    acked = ctx.Array("q", MAX_WRITERS, lock=False)
    warm = ctx.Process(target=time.sleep, args=(0,))  # starts multiprocessing's helper process and its pipes
    warm.start()
    warm.join()
    warm.close()
    fds_before = open_fds()
    if target == "shards":
        replay: Any = ShardedReplay(
            4, capacity // 4, SCHEMA, seed=0, storage="disk", durable_dir=str(path), flush_every=5_000,
            flush_seconds=5.0, staleness=2,
        )  # fmt: skip
        learner: Any = replay
    else:
        options = {"path": str(path / "ring")} if target == "disk" else {"dir": str(path)}
        if target == "disk":
            options.update(flush_every=5_000, flush_seconds=5.0)
        engine = PrioritizedReplay(capacity, SCHEMA, seed=0, storage=target, storage_options=options)
        replay = engine
        learner = RelaxedReplay(engine, staleness=2, prefetch=2, worker="thread")
    procs: list[Any] = []
    next_wid = 0

    def start_writer(handle: Any) -> None:
        nonlocal next_wid
        p = ctx.Process(target=writer_main, args=(handle, next_wid, acked, stop), daemon=True)
        p.start()
        procs.append(p)
        next_wid += 1

    handle = replay.writer()
    for _ in range(writers):
        start_writer(handle)
    rng = np.random.default_rng(0)
    start = time.monotonic()
    next_event = start + 3.0
    while time.monotonic() - start < minutes * 60:
        if len(learner) < 64:
            time.sleep(0.05)
            continue
        batch = dog("sample", learner.sample, 64)
        report.torn_or_damaged_served += check_rows(batch.data)
        dog("update_priorities", learner.update_priorities, batch.indices, np.abs(rng.standard_normal(64)))
        report.learner_steps += 1
        if time.monotonic() >= next_event:
            next_event = time.monotonic() + float(rng.uniform(2.0, 5.0))
            victim = procs[int(rng.integers(len(procs)))]
            if victim.is_alive():
                os.kill(victim.pid, signal.SIGKILL)
                victim.join()
                victim.close()
                report.killed_writers += 1
                procs.remove(victim)
                start_writer(handle)
            dog("flush", learner.flush)
            report.durable_points += 1
            if target != "shards":
                code = dog("fork", fork_and_sample, learner)
                report.forks += 1
                if code != 0:
                    report.crashes += 1
                    report.notes.append(f"fork child exited {code}")
    stop.value = 1
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            report.hangs += 1
            report.notes.append(f"writer {p.pid} did not stop")
            p.kill()
            p.join()
        elif p.exitcode not in (0, None):
            report.crashes += 1
            report.notes.append(f"writer exited {p.exitcode}")
        p.close()
    dog("final flush", learner.flush)
    report.acked = int(sum(acked[:next_wid]))
    report.rows_at_last_point = len(learner)
    if target == "shards":  # rows live on the shards: count them (nothing wraps: capacity holds the run)
        report.committed = int(sum(s.size for s in replay.summaries))
        report.lost_outside_window = max(0, report.acked - report.committed)
    else:  # every stored row the ring vouches for, checked whole; each writer's rows an unbroken prefix
        rows, intact = replay.storage.read_intact(np.arange(learner.filled))
        rows = {name: np.asarray(a)[intact] for name, a in rows.items()}
        report.committed = int(intact.sum())
        # Slots claimed by a writer killed before it committed them: the documented window, one chunk per kill.
        report.abandoned_slots = int((~intact).sum())
        if report.abandoned_slots > report.killed_writers * CHUNK:
            report.notes.append(f"{report.abandoned_slots} incomplete slots for {report.killed_writers} killed writers")
        if check_rows(rows):
            report.notes.append(f"{check_rows(rows)} stored rows vouched for but damaged")
            report.torn_or_damaged_served += check_rows(rows)
        for wid in range(next_wid):
            seqs = np.sort(rows["seq"][rows["wid"] == wid])
            prefix = int(np.argmax(seqs != np.arange(len(seqs)))) if (seqs != np.arange(len(seqs))).any() else len(seqs)
            # A killed writer may lose the chunk it was adding (never acknowledged), nothing it acknowledged.
            report.lost_outside_window += max(0, int(acked[wid]) - prefix)
    if report.committed >= capacity:
        report.notes.append("the ring wrapped: raise --capacity for an exact loss count")
    report.seconds = round(time.monotonic() - start, 1)
    dog("close", learner.close)
    if target == "disk":
        reopened = dog("reopen", PrioritizedReplay.reopen, str(path / "ring"))
        report.rows_after_reopen = len(reopened)
        reopened.close()
    del handle, replay, learner
    gc.collect()
    if target == "shards":  # Ray opens its own connections lazily, on first use: not the replay's to close
        report.notes.append(f"descriptors after close: {open_fds() - fds_before:+d} (Ray's, not counted)")
    else:
        report.leaked_fds = max(0, open_fds() - fds_before)
    shutil.rmtree(path, ignore_errors=True)
    report.leaked_files = int(path.exists())
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="minutes per target (default 10)")
    p.add_argument("--only", nargs="+", choices=("disk", "shared", "shards"), default=("disk", "shared", "shards"))
    p.add_argument("--writers", type=int, default=3, help="writer processes (default 3)")
    p.add_argument(
        "--capacity", type=int, default=2_000_000, help="rows, enough that the run never wraps (default 2e6)"
    )
    p.add_argument("--hang-seconds", type=float, default=60.0, help="an operation longer than this is a hang")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where buffer files go")
    args = p.parse_args(argv)
    failed = False
    for target in args.only:
        report = soak(target, args.minutes, args.writers, args.capacity, args.hang_seconds, args.dir)
        failed |= report.failed()
        print(f"\n## {target}: {'FAIL' if report.failed() else 'ok'}")
        for key, value in asdict(report).items():
            print(f"- {key}: {value}")
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
