"""The rank side of the wire: it never waits, and what zmq holds for a watcher that
does not read is capped at SNDHWM batches (docs/PROMISES.md: "zmq holds at most 256
batches")."""

import time

import zmq

from commviz.transport import client as client_mod
from commviz.transport.client import Client
from tests.helpers import wait_for


def test_a_watcher_that_stops_reading_gets_at_most_256_batches_queued(tmp_path):
    """A ROUTER that never reads and holds one message stands in for a frozen watcher:
    past what it and the kernel buffer took, zmq queues SNDHWM batches, then refuses."""
    addr = f"ipc://{tmp_path}/w.sock"
    ctx = zmq.Context()
    frozen = ctx.socket(zmq.ROUTER)
    frozen.setsockopt(zmq.RCVHWM, 1)
    frozen.setsockopt(zmq.RCVBUF, 4096)
    frozen.bind(addr)
    c = Client(addr, identity=b"rank0")
    payload = b"x" * (1 << 20)  # bigger than any socket buffer: the kernel holds at most a few
    try:
        assert wait_for(lambda: c.send(payload), timeout=10), "never connected"  # IMMEDIATE: refused until then
        taken, t0 = 1, time.monotonic()
        # A send never waits: it is taken or refused at once. zmq's I/O thread moves
        # frames out of the queue, so wait until a refusal sticks for a moment.
        last_taken = time.monotonic()
        while time.monotonic() - last_taken < 0.5:
            assert time.monotonic() - t0 < 60, "zmq kept taking frames: no cap"
            if c.send(payload):
                taken += 1
                last_taken = time.monotonic()
            else:
                time.sleep(0.005)
        assert client_mod.SNDHWM == 256
        # 256 in zmq's queue; the rest sits in the reader's one-message queue, the
        # kernel and zmq's encoders (1 MiB frames: a handful)
        assert 256 <= taken <= 256 + 8, taken
        send_t = time.perf_counter()
        assert not c.send(payload)
        assert time.perf_counter() - send_t < 0.5  # refused, not waited for
    finally:
        c.close()
        frozen.close(0)
        ctx.term()
