"""What a flood of connections can make the watcher hold: at most MAX_CONNECTIONS are
open at once (the ZAP handler refuses one more before zmq takes a frame from it), and
a peer that sends garbage loses its connection when it is described."""

import socket
import time

import zmq

from commviz.events import MAX_WIRE_FRAME, encode_batch, encode_frames
from commviz.transport.client import Client
from commviz.transport.conns import Connections, close_fd
from commviz.transport.server import Server
from commviz.transport.token import Gate
from tests.helpers import Handshakes, hello, op
from tests.helpers import wait_for
from tests.transport.test_token import NoCtx


def test_the_zap_handler_turns_away_one_connection_too_many_and_says_why():
    room = [True]
    gate = Gate(NoCtx(), None, room=lambda: room[0])

    def ask(mech=b"NULL"):
        return gate.reply([b"1.0", b"7", b"commviz", b"", b"", mech])[2:4]

    assert ask() == [b"200", b"OK"]
    room[0] = False
    assert ask() == [b"400", b"too many connections"]
    assert (gate.turned_away, gate.denied) == (1, 0)
    assert ask(b"PLAIN") == [b"400", b"no valid token"]  # a listener without a token speaks NULL
    assert (gate.turned_away, gate.denied) == (1, 1)


def test_past_the_cap_a_new_peer_gets_no_connection_and_the_first_keep_theirs(sockdir):
    """Ranks that come one after another against a cap of two: exactly two stream (the
    monitor's news of each is read before its handshake is answered), the rest are
    refused and counted, and none of their frames reach the model."""
    addr = f"ipc://{sockdir}/w.sock"
    got = []
    server = Server(addr, lambda b, raw: got.append(b.rank), lambda *a: None, max_connections=2).start()
    clients, took = [], []
    try:
        for r in range(5):
            c = Client(addr, identity=f"rank{r}".encode())
            clients.append(c)
            refused = server.turned_away
            assert wait_for(lambda: c.send(encode_batch(r, [hello(r)])) or server.turned_away > refused, timeout=20)
            took.append(server.turned_away == refused)
        assert took == [True, True, False, False, False]
        assert server.turned_away >= 5 - sum(took)
        assert wait_for(lambda: sorted(got) == [r for r, t in enumerate(took) if t])
        time.sleep(0.3)
        assert sorted(got) == [r for r, t in enumerate(took) if t]  # nothing from the refused
    finally:
        for c in clients:
            c.close()
        server.close()


def test_the_monitor_counts_open_connections_and_failed_handshakes():
    class NoSock:
        def get_monitor_socket(self, events):
            return None

    conns = Connections(NoSock(), max_open=1)
    conns.on_event({"event": zmq.EVENT_ACCEPTED, "value": 7})
    assert conns.room()  # the one asking may be counted already
    conns.on_event({"event": zmq.EVENT_ACCEPTED, "value": 8})
    assert not conns.room()
    conns.on_event({"event": zmq.EVENT_DISCONNECTED, "value": 7})
    assert conns.room() and conns.open == {8}
    conns.on_event({"event": zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, "value": 0})
    assert conns.failed == 1


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
    connections = Handshakes(raw)
    raw.connect(addr)
    try:
        events = [hello(0)] + [e for i in range(6000) for e in op(i, i, i + 1)]
        big = encode_batch(0, events)
        assert len(big) > MAX_WIRE_FRAME
        raw.send(big)
        frames = list(encode_frames(0, events))
        assert all(p is not None and len(p) <= MAX_WIRE_FRAME for p, _ in frames)
        assert sum(n for _, n in frames) == len(events)
        assert wait_for(lambda: connections() >= 2)  # zmq dropped the connection it came on, and made another
        for p, _ in frames:
            raw.send(p)
        assert wait_for(lambda: sum(got) == len(events))  # the frames that fit, all of them
        assert server.frames == len(frames)
    finally:
        connections.close()
        raw.close()
        ctx.term()
        server.close()
