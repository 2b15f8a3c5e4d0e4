"""PrioritizedReplay(rate_limiter=...) and RelaxedReplay: bursty writers keep the ratio, nobody deadlocks, state checkpoints.

Writer processes add to a ``"shared"`` buffer in bursts with pauses while the learner samples as
fast as the limiter lets it (their rows are counted when the learner polls them); threads add to
a host buffer through its own front door (they wait too). Refused calls leave the buffer as it was.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, RateLimited, RateLimiter, RelaxedReplay
from tests.conftest import SCHEMA, make_batch

BATCH, CHUNK, TARGET = 32, 16, 4.0


def bursty_writer(writer, seed: int, seconds: float) -> None:
    """Add CHUNK rows at a time in bursts of 1-20 adds, pausing up to 30 ms between bursts."""
    rng = np.random.default_rng(seed)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(int(rng.integers(1, 20))):
            writer.add(make_batch(CHUNK))
        time.sleep(float(rng.uniform(0, 0.03)))


def sample_until(buf, seconds: float, writers: list) -> None:
    """The learner: sample as fast as allowed until ``seconds`` pass or the writers are gone (RateLimited).

    A RateLimited while a writer lives (a machine that stalled it past the limiter's timeout) goes on.
    """
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            buf.sample(BATCH)
        except RateLimited:
            if not any(w.is_alive() for w in writers):
                return


def within_target(limiter: RateLimiter) -> bool:
    """The achieved ratio within 5% of TARGET (the band's error allowed on the last batch)."""
    return abs(limiter.sampled / limiter.inserted - TARGET) <= 0.05 * TARGET + limiter.error / limiter.inserted


def test_bursty_writer_processes_and_a_fast_learner_keep_the_ratio_within_5_percent(tmp_path) -> None:
    limiter = RateLimiter(TARGET, error=4 * BATCH, min_size=256, timeout=0.5)
    buf = PrioritizedReplay(
        4096, SCHEMA, seed=0, storage="shared", storage_options={"dir": str(tmp_path)}, rate_limiter=limiter
    )
    try:
        procs = [
            mp.get_context("fork").Process(target=bursty_writer, args=(buf.writer(), s, 2.5), daemon=True)
            for s in range(2)
        ]
        for p in procs:
            p.start()
        sample_until(buf, 6.0, procs)  # ends with RateLimited once the writers stop
        for p in procs:
            p.join(30)
        assert all(p.exitcode == 0 for p in procs)
        assert limiter.inserted > 2000 and limiter.inserted == buf.storage.tickets  # every row counted, once
        assert within_target(limiter), limiter
    finally:
        buf.close()


def test_relaxed_replay_with_a_writer_thread_keeps_the_ratio_and_counts_only_the_batches_taken() -> None:
    limiter = RateLimiter(TARGET, error=4 * BATCH, min_size=256, timeout=0.5)
    with RelaxedReplay(PrioritizedReplay(2048, SCHEMA, seed=0, rate_limiter=limiter), staleness=2) as buf:
        stop = threading.Event()

        def writer() -> None:
            rng = np.random.default_rng(0)
            while not stop.is_set():
                for _ in range(int(rng.integers(1, 20))):
                    try:
                        buf.add(make_batch(CHUNK))  # waits while the writer is ahead of the learner
                    except RateLimited:
                        return  # the learner stopped
                time.sleep(float(rng.uniform(0, 0.01)))

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        taken = 0
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            batch = buf.sample(BATCH)
            buf.update_priorities(batch.indices, np.ones(BATCH))
            taken += 1
        stop.set()
        t.join(10)
        assert not t.is_alive()
        assert limiter.sampled == taken * BATCH  # the batches drawn ahead are not counted
        assert limiter.inserted > 1000 and within_target(limiter), limiter


def test_when_the_writers_stop_the_learner_times_out_and_when_the_learner_stops_the_writer_does() -> None:
    limiter = RateLimiter(1.0, error=BATCH, min_size=CHUNK, timeout=0.2)
    buf = PrioritizedReplay(256, SCHEMA, seed=0, rate_limiter=limiter)
    buf.add(make_batch(CHUNK))
    buf.sample(BATCH)  # 16 - 32 = -16 >= -32
    start = time.monotonic()
    with pytest.raises(RateLimited, match="sample of 32"):
        buf.sample(BATCH)  # no writer comes
    assert 0.15 < time.monotonic() - start < 5
    buf.add(make_batch(64))  # diff <= 0: goes
    with pytest.raises(RateLimited, match="insert of 16"):
        buf.add(make_batch(CHUNK))  # 48 + 16 > 32 ahead: no learner comes
    assert (limiter.inserted, limiter.sampled, len(buf)) == (80, 32, 80)


@pytest.mark.parametrize("relaxed", [False, True])
def test_close_wakes_a_learner_waiting_for_writers(relaxed: bool) -> None:
    engine = PrioritizedReplay(64, SCHEMA, seed=0, rate_limiter=RateLimiter(1.0, error=BATCH, timeout=None))
    buf = RelaxedReplay(engine, staleness=1) if relaxed else engine
    got: list[str] = []

    def learner() -> None:
        try:
            buf.sample(BATCH)
            got.append("sampled")
        except RateLimited:
            got.append("RateLimited")

    t = threading.Thread(target=learner, daemon=True)
    t.start()
    time.sleep(0.1)
    assert t.is_alive()  # nothing inserted: it waits, without end
    buf.close()
    t.join(5)
    assert not t.is_alive() and got == ["RateLimited"]


def test_a_polling_learner_is_woken_by_a_writer_process(tmp_path) -> None:
    limiter = RateLimiter(1.0, error=BATCH, min_size=CHUNK, timeout=10.0)
    buf = PrioritizedReplay(
        256, SCHEMA, seed=0, storage="shared", storage_options={"dir": str(tmp_path)}, rate_limiter=limiter
    )
    try:
        writer = buf.writer()
        p = mp.get_context("fork").Process(target=_add_later, args=(writer, 0.3), daemon=True)
        p.start()
        start = time.monotonic()
        buf.sample(CHUNK)  # waits for the writer process's rows, seen by polling
        assert 0.2 < time.monotonic() - start < 5
        p.join(10)
        assert (limiter.inserted, limiter.sampled) == (CHUNK, CHUNK)
    finally:
        buf.close()


def _add_later(writer, delay: float) -> None:
    time.sleep(delay)
    writer.add(make_batch(CHUNK))


def snapshot(buf: PrioritizedReplay) -> tuple:
    """What a refused call must leave as it was: generator, priorities, position, size, the limiter's counters."""
    limiter = buf.rate_limiter
    counts = None if limiter is None else (limiter.inserted, limiter.sampled)
    return str(buf.rng.bit_generator.state), buf.leaves().tobytes(), buf.position, len(buf), counts


def test_refused_samples_and_adds_leave_the_buffer_as_it_was() -> None:
    limiter = RateLimiter(1.0, error=BATCH, min_size=CHUNK, timeout=0)
    buf = PrioritizedReplay(256, SCHEMA, seed=0, rate_limiter=limiter)
    buf.add(make_batch(CHUNK))
    batch = buf.sample(BATCH)
    buf.update_priorities(batch.indices, np.linspace(0.1, 2, BATCH))
    before = snapshot(buf)
    with pytest.raises(RateLimited):
        buf.sample(BATCH)  # the learner is ahead
    with pytest.raises(ValueError, match="more than error"):
        buf.sample(BATCH + 1)  # larger than the band
    buf.add(make_batch(2 * BATCH))
    before = snapshot(buf)
    with pytest.raises(RateLimited):
        buf.add(make_batch(CHUNK))  # the writers are ahead
    with pytest.raises(ValueError):
        buf.add({"obs": np.zeros((CHUNK, 3))})  # a bad batch: refused before it waits
    assert snapshot(buf) == before


def test_relaxed_refusals_leave_the_buffer_as_it_was() -> None:
    limiter = RateLimiter(1.0, error=BATCH, min_size=CHUNK, timeout=0)
    with RelaxedReplay(PrioritizedReplay(256, SCHEMA, seed=0, rate_limiter=limiter), staleness=1) as buf:
        buf.add(make_batch(CHUNK))
        buf.sample(BATCH)
        buf.flush()
        before = snapshot(buf.replay)
        with pytest.raises(RateLimited):
            buf.sample(BATCH)
        buf.flush()
        assert snapshot(buf.replay) == before


def test_the_counters_are_part_of_state_dict_save_pickle_and_durable_points(tmp_path) -> None:
    def limiter() -> RateLimiter:
        return RateLimiter(2.0, error=BATCH, min_size=CHUNK, timeout=0)

    buf = PrioritizedReplay(256, SCHEMA, seed=0, rate_limiter=limiter())
    buf.add(make_batch(CHUNK))
    buf.sample(BATCH)
    assert buf.state_dict()["rate_limiter"]["sampled"] == BATCH
    buf.save(tmp_path / "buf.hrp")
    loaded = PrioritizedReplay.load(tmp_path / "buf.hrp", rate_limiter=limiter())
    copied = pickle.loads(pickle.dumps(buf))
    other = PrioritizedReplay(256, SCHEMA, seed=1, rate_limiter=limiter())
    other.load_state_dict(buf.state_dict())
    for b in (loaded, copied, other):
        assert b.rate_limiter is not None and (b.rate_limiter.inserted, b.rate_limiter.sampled) == (CHUNK, BATCH)
    assert other.rate_limiter is not buf.rate_limiter and copied.rate_limiter is not buf.rate_limiter
    different = PrioritizedReplay(256, SCHEMA, seed=1, rate_limiter=RateLimiter(3.0, error=BATCH))
    before = snapshot(different)
    with pytest.raises(ValueError, match="samples_per_insert"):
        different.load_state_dict(buf.state_dict())  # another ratio: refused, nothing changed
    assert snapshot(different) == before

    disk = PrioritizedReplay(
        256, SCHEMA, seed=0, storage="disk", storage_options={"path": str(tmp_path / "d")}, rate_limiter=limiter()
    )
    disk.add(make_batch(CHUNK))
    disk.sample(BATCH)
    disk.close()  # a last durable point
    again = PrioritizedReplay.reopen(tmp_path / "d", rate_limiter=limiter())
    try:
        assert again.rate_limiter is not None
        assert (again.rate_limiter.inserted, again.rate_limiter.sampled, len(again)) == (CHUNK, BATCH, CHUNK)
    finally:
        again.close()


def test_a_bad_rate_limiter_is_refused() -> None:
    with pytest.raises(TypeError, match="rate_limiter"):
        PrioritizedReplay(8, SCHEMA, rate_limiter={"samples_per_insert": 1.0})  # type: ignore[arg-type]
