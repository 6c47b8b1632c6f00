"""The live watcher queues frames and hands them to the model a batch at a time:
whoever takes the model's lock sees every frame that arrived, in arrival order, as
if each had been ingested on arrival."""

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
        with feed.lock:
            assert _state(feed.model) == _state(one)
        assert any(carried)  # some drains left events for the next
        assert not feed.model.shed
    finally:
        feed.close()
