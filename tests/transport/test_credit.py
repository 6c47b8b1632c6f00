"""Credit over the real wire: the watcher acks every frame it dealt with, so a rank
knows exactly what it handed over, what a slow model still holds, and what a watcher
that died took with it."""

import threading

from commviz.events import encode_batch
from commviz.transport.client import Client
from commviz.transport.credit import Window, ack_frame, acked
from commviz.transport.server import Server
from tests.helpers import hello, op
from tests.helpers import wait_for


def frame(i: int) -> bytes:
    return encode_batch(0, op(i, 1000 * i, 1000 * i + 500))


def test_ack_frames_round_trip_and_nothing_else_counts():
    assert acked(ack_frame(7)) == 7
    assert acked(b"CVA2" + ack_frame(7)[4:]) == 0
    assert acked(b"\x93\x01\x00\x90") == 0  # a batch is not an ack
    w = Window(3)
    for tag in "abc":
        w.sent(tag)
    assert w.room == 0
    w.ack(2)
    assert (w.room, w.lose(), w.room) == (2, ["c"], 3)


def test_every_frame_is_acked_once_the_model_has_it(sockdir):
    """The model takes frames only when the test lets it: until then the rank's
    window stays full, and each frame ingested gives one back."""
    addr = f"ipc://{sockdir}/w.sock"
    gate, got = threading.Semaphore(0), []

    def slow_model(batch, payload):
        gate.acquire()
        got.append(batch)

    server = Server(addr, slow_model, lambda *a: None).start()
    c = Client(addr, identity=b"rank0", window=4)
    try:
        assert wait_for(lambda: c.send(encode_batch(0, [hello(0)]), "resync"))
        for i in range(3):
            assert c.send(frame(i), i)
        assert c.room == 0
        c.poll()
        assert c.room == 0  # nothing ingested, nothing acked
        gate.release()
        gate.release()
        assert wait_for(lambda: c.poll() is None and c.room == 2)
        for _ in range(2):
            gate.release()
        assert wait_for(lambda: c.poll() is None and c.room == 4)
        assert len(got) == 4 and server.frames == 4
    finally:
        for _ in range(8):
            gate.release()
        c.close()
        server.close()


def test_a_watcher_that_dies_gives_back_exactly_what_it_had_not_acked(sockdir):
    addr = f"ipc://{sockdir}/w.sock"
    gate = threading.Event()
    server = Server(addr, lambda b, p: gate.wait(), lambda *a: None).start()
    c = Client(addr, identity=b"rank0", window=8)
    try:
        assert wait_for(lambda: c.send(encode_batch(0, [hello(0)]), "resync"))
        gate.set()
        assert wait_for(lambda: c.poll() is None and c.room == 8)  # the first one went through
        gate.clear()
        for i in range(5):
            assert c.send(frame(i), i)
        server.close()  # the model never took them
        lost = []
        assert wait_for(lambda: lost.extend(c.poll() or []) or lost, timeout=10)
        assert lost == [0, 1, 2, 3, 4] and c.room == 8
    finally:
        gate.set()
        c.close()
