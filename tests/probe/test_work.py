"""Async completion without the caller's wait(): the gloo-p2p waiter and the
Work.wait patch, with fake Work objects (no torch needed)."""

import threading
import time

import pytest

from commviz.probe.work import Outstanding, Waiters


class FakeWork:
    """Like gloo p2p work: wait() blocks until the transfer is done, and a second
    C++ wait() would hang (here: fails the test)."""

    def __init__(self, error=None):
        self.done = threading.Event()
        self.cpp_waits = 0
        self.error = error

    def wait(self, timeout=None):
        self.cpp_waits += 1
        assert self.cpp_waits == 1, "the original wait() ran twice: on gloo p2p that hangs"
        self.done.wait()
        if self.error:
            raise self.error
        return True

    def is_completed(self):
        return self.done.is_set() and self.cpp_waits > 0


@pytest.fixture
def waiters():
    class Work(FakeWork):
        pass

    ended = []
    w = Waiters(lambda op_id, t, err: ended.append((op_id, t, err)))
    w.install(Work)
    return w, Work, ended


def test_completion_is_stamped_without_the_user_waiting(waiters):
    w, Work, ended = waiters
    work = Work()
    w.track(7, work)
    time.sleep(0.05)
    assert ended == []
    t_done = time.monotonic_ns()
    work.done.set()
    deadline = time.monotonic() + 2
    while not ended and time.monotonic() < deadline:
        time.sleep(0.001)
    [(op_id, t, err)] = ended
    assert op_id == 7 and err == "" and t >= t_done


def test_users_wait_gets_the_waiters_result_not_a_second_cpp_wait(waiters):
    w, Work, ended = waiters
    work = Work()
    w.track(1, work)
    threading.Timer(0.05, work.done.set).start()
    assert work.wait() is True  # patched: waits for the helper's result
    assert work.cpp_waits == 1
    assert work.wait() is True  # and again, still no second C++ wait


def test_users_wait_reraises_the_ops_error(waiters):
    w, Work, ended = waiters
    work = Work(error=RuntimeError("Connection closed by peer"))
    w.track(2, work)
    work.done.set()
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        work.wait()
    assert ended[0][2].startswith("RuntimeError: Connection closed")


def test_untracked_works_use_the_original_wait(waiters):
    w, Work, ended = waiters
    work = Work()
    work.done.set()
    assert work.wait() is True and work.cpp_waits == 1 and ended == []


def test_each_outstanding_work_gets_its_own_waiter(waiters):
    """A send that completes late must not delay stamping a recv that completed early."""
    w, Work, ended = waiters
    slow, fast = Work(), Work()
    w.track(1, slow)
    w.track(2, fast)
    fast.done.set()
    deadline = time.monotonic() + 2
    while not ended and time.monotonic() < deadline:
        time.sleep(0.001)
    assert [e[0] for e in ended] == [2]
    slow.done.set()
    while len(ended) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert [e[0] for e in ended] == [2, 1]


def test_install_twice_keeps_one_patch(waiters):
    w, Work, _ = waiters
    patched = Work.wait
    w.install(Work)
    assert Work.wait is patched


class StepClock:
    """A clock that moves only when the code under test sleeps; `on_sleep` runs at
    each sleep, as completions would arrive from torch's threads meanwhile."""

    def __init__(self, on_sleep=lambda now: None):
        self.now = 0.0
        self.on_sleep = on_sleep

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s
        self.on_sleep(self.now)


def test_exit_waits_while_completions_keep_coming_however_long_that_takes():
    out = Outstanding()
    for i in range(10):
        out.begin(i)

    def one_every_half_second(now):  # 5 s in all: longer than the stall limit
        if now >= 0.5 * (10 - len(out.ids) + 1):
            out.end(min(out.ids))

    clock = StepClock(one_every_half_second)
    assert out.settle(stall_s=1.0, clock=clock, sleep=clock.sleep) == 0
    assert 4.9 < clock.now < 5.1


def test_exit_gives_up_on_an_op_that_never_completes_after_the_stall_limit():
    out = Outstanding()
    out.begin(1)
    out.begin(2)
    clock = StepClock(lambda now: out.end(1) if now > 0.3 else None)
    assert out.settle(stall_s=1.0, clock=clock, sleep=clock.sleep) == 1
    assert 1.29 < clock.now < 1.32


def test_nothing_outstanding_costs_exit_nothing():
    clock = StepClock()
    assert Outstanding().settle(clock=clock, sleep=clock.sleep) == 0
    assert clock.now == 0
