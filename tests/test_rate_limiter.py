"""RateLimiter: the ratio holds under bursty writers, nobody deadlocks, bad input is refused, state checkpoints."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hetero_replay.rate_limiter import RateLimited, RateLimiter


def test_min_size_holds_samples_back_and_inserts_go_until_it() -> None:
    limiter = RateLimiter(samples_per_insert=2.0, min_size=100, error=64, timeout=0)
    assert not limiter.can_sample(1)
    with pytest.raises(RateLimited, match="inserted 0"):
        limiter.sample(1)
    limiter.insert(64)
    limiter.insert(64)  # before min_size, inserts go whatever the ratio (diff 256 > error 64 now)
    with pytest.raises(RateLimited, match="insert of 64"):
        limiter.insert(64)  # past min_size the ratio holds: the writers are 192 samples ahead
    limiter.sample(64)
    assert (limiter.inserted, limiter.sampled) == (128, 64)


def test_bursty_writers_and_a_fast_learner_keep_the_ratio_within_5_percent() -> None:
    target, batch, chunk = 4.0, 64, 32
    limiter = RateLimiter(samples_per_insert=target, min_size=256, error=4 * batch, timeout=5.0)
    stop = threading.Event()

    def writer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            for _ in range(int(rng.integers(1, 40))):  # a burst ...
                try:
                    limiter.insert(chunk)
                except RateLimited:
                    return
            time.sleep(float(rng.uniform(0, 0.03)))  # ... then a pause

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    ratios = []
    start = time.monotonic()
    while time.monotonic() - start < 3.0:
        limiter.sample(batch)  # as fast as allowed
        if limiter.inserted > 2000:
            ratios.append(limiter.sampled / limiter.inserted)
    stop.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert limiter.inserted > 10_000
    assert abs(limiter.sampled / limiter.inserted - target) <= 0.05 * target
    assert max(abs(r - target) for r in ratios) <= 0.05 * target + 4 * batch / 2000
    # the band itself: the learner never more than error ahead, the writers never more than error + a chunk
    assert -limiter.error <= limiter.diff <= limiter.error + chunk * target


def test_when_writers_stop_the_learner_times_out_and_when_the_learner_stops_writers_do() -> None:
    limiter = RateLimiter(samples_per_insert=1.0, min_size=10, error=16, timeout=0.2)
    limiter.insert(10)
    limiter.sample(16)  # credit 10 - 16 = -6 >= -16
    start = time.monotonic()
    with pytest.raises(RateLimited, match="sample of 16"):
        limiter.sample(16)  # would be 22 ahead: no writer comes
    assert 0.15 < time.monotonic() - start < 2.0
    limiter.insert(40)  # diff -6 <= 0: goes, whatever its size
    with pytest.raises(RateLimited, match="insert of 8"):
        limiter.insert(8, timeout=0.1)  # diff 34 + 8 > 16: no learner comes
    with pytest.raises(RateLimited):
        limiter.insert(8, timeout=0)  # non-blocking
    assert limiter.state_dict()["inserted"] == 50 and limiter.sampled == 16  # refused calls counted nothing


def test_a_waiter_is_woken_by_the_other_side_and_by_close() -> None:
    limiter = RateLimiter(samples_per_insert=1.0, min_size=1, error=8, timeout=None)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(limiter.sample(8) or "sampled"))
    t.start()
    time.sleep(0.1)
    assert t.is_alive()  # nothing inserted yet
    limiter.insert(4)
    t.join(5)
    assert got == ["sampled"]
    waiter = threading.Thread(target=lambda: got.append(_raises(lambda: limiter.sample(8))))
    waiter.start()
    time.sleep(0.1)
    limiter.close()
    waiter.join(5)
    assert not waiter.is_alive() and got[-1] == "RateLimited"


def _raises(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
    except RateLimited:
        return "RateLimited"
    return "went"


def test_a_call_is_counted_as_it_is_let_go_and_taken_back_when_its_body_raises() -> None:
    """Two inserts let go on one credit would pass the band together: the first counts before its body runs."""
    limiter = RateLimiter(samples_per_insert=1.0, error=8, min_size=1, timeout=0.2)
    limiter.insert(4)  # diff 4: one more insert of 4 may go (4 + 4 <= 8), not two
    inside, leave = threading.Event(), threading.Event()

    def slow_add() -> None:  # a buffer's add still writing its rows
        with limiter.admitted("insert", 4):
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=slow_add, daemon=True)
    t.start()
    assert inside.wait(10)
    assert limiter.inserted == 8
    with pytest.raises(RateLimited, match="insert of 4"):
        limiter.insert(4)  # 8 + 4 > 8: the add in its body is counted
    leave.set()
    t.join(10)
    assert not t.is_alive() and (limiter.inserted, limiter.sampled) == (8, 0)

    waiting: list[str] = []
    waiter = threading.Thread(target=lambda: waiting.append(str(limiter.insert(4, timeout=10))), daemon=True)
    limiter.sample(4)  # diff 4 -> an insert of 4 may go again
    with pytest.raises(ValueError, match="refused"):
        with limiter.admitted("insert", 4):  # let go and counted (diff 8) ...
            waiter.start()  # ... so this insert waits
            time.sleep(0.05)
            assert waiting == []
            raise ValueError("refused")  # ... then by the buffer: taken back, and the waiter is let go
    waiter.join(10)
    assert waiting == ["None"] and (limiter.inserted, limiter.sampled) == (12, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(samples_per_insert=0.0, error=8), ValueError, "samples_per_insert"),
        (dict(samples_per_insert=float("nan"), error=8), ValueError, "samples_per_insert"),
        (dict(samples_per_insert=1.0, error=8, min_size=0), ValueError, "min_size"),
        (dict(samples_per_insert=1.0, error=0.5), ValueError, "error"),
        (dict(samples_per_insert=1.0, error=8, timeout=-1), ValueError, "timeout"),
        (dict(samples_per_insert="1", error=8), TypeError, "samples_per_insert"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        RateLimiter(**kwargs)


def test_bad_calls_are_refused_and_count_nothing() -> None:
    limiter = RateLimiter(samples_per_insert=1.0, min_size=1, error=8, timeout=0)
    limiter.insert(8)
    with pytest.raises(ValueError, match="n=9 is more than error=8"):
        limiter.sample(9)  # could wait on writers waiting on it
    with pytest.raises(ValueError, match="n"):
        limiter.insert(0)
    with pytest.raises(TypeError, match="n"):
        limiter.sample(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        limiter.sample(1, timeout=-1)
    assert (limiter.inserted, limiter.sampled) == (8, 0)


def test_state_dict_round_trips_and_refuses_other_settings() -> None:
    a = RateLimiter(samples_per_insert=2.0, min_size=4, error=8)
    a.insert(6)
    a.sample(8)
    b = RateLimiter(samples_per_insert=2.0, min_size=4, error=8)
    b.load_state_dict(a.state_dict())
    assert (b.inserted, b.sampled, b.diff) == (6, 8, 4.0)
    with pytest.raises(ValueError, match="samples_per_insert"):
        RateLimiter(samples_per_insert=3.0, min_size=4, error=8).load_state_dict(a.state_dict())
    c = RateLimiter(samples_per_insert=2.0, min_size=4, error=8)
    with pytest.raises(ValueError, match="inserted"):
        c.load_state_dict({**a.state_dict(), "inserted": -1})
    assert (c.inserted, c.sampled) == (0, 0)
