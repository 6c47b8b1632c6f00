"""The live watcher queues frames and hands them to the model a batch at a time:
after a `drain`, whoever takes the model's lock sees every frame that arrived, in
arrival order, as if each had been ingested on arrival."""

import random
import time

import pytest

from commviz import watcher
from commviz.events import Batch
from commviz.model import Model, columns
from commviz.watcher import LiveFeed
from tests.model.test_columns import _state, _trace


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_queued_frames_reach_the_model_as_if_ingested_one_by_one(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(columns, "MIN_BATCH", 64)
    monkeypatch.setattr(columns, "SETTLE_MIN", 256)
    monkeypatch.setattr(watcher, "DRAIN_EVENTS", 700)  # many drains, each leaving a tail for the next
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock")  # not started: frames are handed to it as the reader would
    trace = _trace(seed, wall0=time.time_ns())  # recent: the watcher is not behind, sheds nothing
    frames: list[Batch] = []
    for r, ev in trace:
        if frames and frames[-1].rank == r and len(frames[-1].events) < random.Random(seed).randrange(1, 30):
            frames[-1].events.append(ev)
        else:
            frames.append(Batch(1, r, [ev]))
    carried = []
    real = columns.settle_point
    monkeypatch.setattr(columns, "settle_point",
                        lambda c, groups: carried.append(len(c) - real(c, groups)) or len(c) - carried[-1])
    try:
        for b in frames:
            feed._on_batch(b, b"")
        one = Model()
        for r, ev in trace:
            one.ingest(r, ev)
        feed.drain()
        with feed.lock:
            assert _state(feed.model) == _state(one)
        assert any(carried)  # some drains left events for the next
        assert not feed.model.shed
    finally:
        feed.close()


def test_what_a_drain_held_back_goes_in_once_nothing_more_comes(tmp_path):
    """A drain keeps the newest events past its settle point for the next batch; when
    no frame follows (a frozen or hung job), they must still reach the model — often
    they are the op that hangs."""
    from commviz.events import BASE_SCHEMA, GroupDef, Hello, OpEnd, OpStart

    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock").start()
    try:
        n, steps = 8, 3000
        mono, wall = time.monotonic_ns(), time.time_ns()
        for r in range(n):
            feed._on_batch(Batch(BASE_SCHEMA, r, [Hello(r, r, n, "x", 1, "gloo", "cpu", "b", "b", "b", mono, wall),
                                                  GroupDef("0", list(range(n)), "gloo")]), b"")
        feed.drain()
        t = time.monotonic_ns()
        for r in range(n):
            evs = []
            for k in range(steps):
                evs += [OpStart(k, t + r + 1000 * k, "all_reduce", "0", k, 1 << 20),
                        OpEnd(k, t + 200_000 + r + 1000 * k)]
            feed._on_batch(Batch(BASE_SCHEMA, r, evs), b"")
        # rank 0 enters a collective nobody joins; then silence
        feed._on_batch(Batch(BASE_SCHEMA, 0, [OpStart(steps, t + 1000 * steps, "all_reduce", "0", steps, 64)]), b"")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with feed.lock:  # puts nothing in: only the feed's own drainer may
                if feed.model.ranks[0].inflight:
                    break
            time.sleep(0.05)
        with feed.lock:
            assert feed.model.events == 2 * n + 2 * n * steps + 1
            assert len(feed.model.ranks[0].inflight) == 1
    finally:
        feed.close()


def test_taking_the_lock_ingests_nothing_a_view_leaves_young_frames_and_drain_takes_all(tmp_path):
    """Whoever holds the model's lock (a scrape, the liveness thread) pays for no
    ingest; a view's tick leaves frames younger than DRAIN_S to finish their batch;
    a summary's `drain` sees every frame that has arrived."""
    from commviz.events import BASE_SCHEMA, GroupDef, Hello
    from commviz.view.feed import ViewQuery

    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    clock = [100.0]
    # not started: no drainer thread, frames handed in as the reader would
    feed = LiveFeed(f"ipc://{d}/w.sock", clock=lambda: clock[0])
    mono, wall = time.monotonic_ns(), time.time_ns()

    def frame(r: int) -> Batch:
        return Batch(BASE_SCHEMA, r, [Hello(r, r, 2, "x", 1, "gloo", "cpu", "b", "b", "b", mono, wall),
                                      GroupDef("0", [0, 1], "gloo")])

    try:
        feed._on_batch(frame(0), b"")
        with feed.lock:
            assert feed.model.events == 0
        assert feed.fetch(ViewQuery()).info.events == 0  # young: left queued
        clock[0] += watcher.DRAIN_S  # it has waited its DRAIN_S
        assert feed.fetch(ViewQuery()).info.events == 2  # waited its DRAIN_S: in
        feed._on_batch(frame(1), b"")
        feed.drain()
        with feed.lock:
            assert feed.model.events == 4 and sorted(feed.model.ranks) == [0, 1]
    finally:
        feed.close()
