"""What a flood of connections can make the watcher hold: at most MAX_CONNECTIONS are
open at once (a new one past that is closed as soon as zmq reports it), and a peer
that sends garbage loses its connection when it is described."""

import socket
import time

import zmq

from commviz.events import MAX_WIRE_FRAME, encode_batch, encode_frames
from commviz.transport.client import Client
from commviz.transport.conns import Connections, close_fd
from commviz.transport.server import Server
from tests.helpers import hello, op
from tests.transport.test_server import settled, sockdir, wait_for  # noqa: F401  (fixture)


class NoSock:
    def get_monitor_socket(self, events):
        return None


def test_past_the_cap_a_new_connection_is_closed_and_counted():
    conns = Connections(NoSock(), max_open=2)
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        for ours, _ in pairs:
            conns.on_event({"event": zmq.EVENT_ACCEPTED, "value": ours.fileno()})
        assert len(conns.open) == 2 and conns.turned_away == 1
        pairs[2][1].settimeout(2)
        assert pairs[2][1].recv(1) == b""  # the third one's peer sees it closed
        conns.on_event({"event": zmq.EVENT_DISCONNECTED, "value": pairs[0][0].fileno()})
        conns.on_event({"event": zmq.EVENT_ACCEPTED, "value": pairs[2][0].fileno()})
        assert len(conns.open) == 2 and conns.turned_away == 1  # a slot was free again
        conns.on_event({"event": zmq.EVENT_HANDSHAKE_FAILED_AUTH, "value": 0})
        assert conns.denied == 1
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_close_fd_leaves_the_descriptor_to_its_owner():
    a, b = socket.socketpair()
    try:
        assert close_fd(a.fileno())
        b.settimeout(2)
        assert b.recv(1) == b""
        assert a.fileno() >= 0  # still open: zmq closes it, not us
    finally:
        a.close()
        b.close()
    assert not close_fd(10**6)


def test_a_garbage_sender_loses_its_connection_and_ranks_keep_theirs(sockdir):
    addr = f"ipc://{sockdir}/w.sock"
    got = []
    server = Server(addr, lambda b, raw: got.append(b.rank), lambda *a: None).start()
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(addr)
    c = Client(addr, identity=b"rank0")
    try:
        assert wait_for(lambda: c.send(encode_batch(0, [hello(0)])))
        assert wait_for(lambda: got == [0])
        raw.send(b"garbage")
        assert wait_for(lambda: server.conns.evicted == 1)
        assert c.send(encode_batch(0, op(0, 1, 2)))
        assert wait_for(lambda: got == [0, 0])  # the rank's connection was not touched
        assert c.poll() is None
    finally:
        c.close()
        raw.close()
        ctx.term()
        server.close()


def test_a_frame_over_the_wire_limit_never_reaches_the_watcher(sockdir):
    addr = f"ipc://{sockdir}/w.sock"
    got = []
    server = Server(addr, lambda b, raw: got.append(len(b.events)), lambda *a: None).start()
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(addr)
    try:
        events = [hello(0)] + [e for i in range(6000) for e in op(i, i, i + 1)]
        big = encode_batch(0, events)
        assert len(big) > MAX_WIRE_FRAME
        raw.send(big)
        frames = list(encode_frames(0, events))
        assert all(p is not None and len(p) <= MAX_WIRE_FRAME for p, _ in frames)
        assert sum(n for _, n in frames) == len(events)
        time.sleep(0.3)
        for p, _ in frames:
            raw.send(p)
        assert wait_for(lambda: sum(got) == len(events))  # the frames that fit, all of them
        assert server.frames == len(frames)
    finally:
        raw.close()
        ctx.term()
        server.close()
