"""The watcher's socket: receives from ranks, survives garbage, stays private."""

import os
import stat
import time

import pytest
import zmq

from commviz.events import encode_batch
from commviz.transport.address import AddressError, check_private_dir, is_loopback, parse
from commviz.transport.client import Client
from commviz.transport.server import Server
from tests.helpers import Handshakes, hello, op, settled, wait_for


def make_server(addr, **kw):
    got, errors = [], []
    s = Server(addr, lambda b, raw: got.append(b), lambda peer, msg: errors.append((peer, msg)), **kw).start()
    return s, got, errors


def test_batches_arrive_and_garbage_is_counted_by_peer(sockdir):
    addr = f"ipc://{sockdir}/w.sock"
    server, got, errors = make_server(addr)
    try:
        assert stat.S_IMODE(os.stat(sockdir / "w.sock").st_mode) == 0o600
        c = Client(addr, identity=b"rank0-pid1")
        assert wait_for(lambda: c.send(encode_batch(0, [hello(0)])))
        assert wait_for(lambda: len(got) == 1)
        # garbage from a raw zmq peer: counted, named, and the server carries on
        ctx = zmq.Context.instance()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, b"intruder")
        raw.connect(addr)
        raw.send(b"\xc1\xc1 not msgpack")
        other = ctx.socket(zmq.DEALER)
        other.setsockopt(zmq.IDENTITY, b"stranger")
        other.connect(addr)
        other.send_multipart([b"two", b"parts"])
        assert wait_for(lambda: len(errors) == 2)
        assert ("intruder", "undecodable frame") in [(p, m[:17]) for p, m in errors]
        assert any(p == "stranger" and "2 parts" in m for p, m in errors)
        assert c.send(encode_batch(0, [hello(0)]))
        assert wait_for(lambda: len(got) == 2)
        assert server.bad_frames == 2
        other.close(0)
        raw.close(0)
        c.close()
    finally:
        server.close()
    assert not (sockdir / "w.sock").exists()


def test_oversized_frames_do_not_reach_the_decoder(sockdir, monkeypatch):
    import commviz.transport.server as srv

    monkeypatch.setattr(srv, "MAX_FRAME", 1024)
    addr = f"ipc://{sockdir}/w.sock"
    server, got, errors = make_server(addr)
    try:
        c = Client(addr, identity=b"flood")
        assert wait_for(lambda: c.send(b"x" * 4096))
        # positive control: a good frame sent after it does arrive (zmq drops the
        # connection that sent the oversized one; the client reconnects by itself)
        assert wait_for(lambda: c.send(encode_batch(0, [hello(0)])) and wait_for(lambda: got, 0.5), 10)
        assert [b.rank for b in got] == [0] * len(got) and errors == [] and server.bad_frames == 0
        c.close()
    finally:
        server.close()


def test_second_watcher_on_the_same_socket_is_refused(sockdir):
    addr = f"ipc://{sockdir}/w.sock"
    server, _, _ = make_server(addr)
    try:
        with pytest.raises(AddressError, match="another commviz watcher"):
            Server(addr, lambda b, r: None, lambda p, m: None)
    finally:
        server.close()


def test_stale_socket_file_is_replaced(sockdir):
    import socket

    path = sockdir / "w.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # bound, never listening: what a crashed watcher leaves behind
    server, _, _ = make_server(f"ipc://{path}")
    server.close()


def test_private_dir_checks(tmp_path):
    d = tmp_path / "commviz-x"
    d.mkdir(mode=0o755)
    with pytest.raises(AddressError, match="chmod 700"):
        check_private_dir(str(d))
    os.chmod(d, 0o700)
    check_private_dir(str(d))


def test_address_parsing():
    assert parse("ipc:///tmp/x.sock") == ("ipc", "/tmp/x.sock")
    assert parse("tcp://127.0.0.1:5557") == ("tcp", "127.0.0.1:5557")
    for bad in ("ipc://", "tcp://host", "http://x", "/tmp/x"):
        with pytest.raises(AddressError):
            parse(bad)
    assert is_loopback("tcp://127.0.0.1:1") and is_loopback("tcp://localhost:1") and is_loopback("ipc:///x")
    assert not is_loopback("tcp://0.0.0.0:1") and not is_loopback("tcp://10.1.2.3:1")


def test_tcp_port_zero_reports_the_real_port():
    server, got, _ = make_server("tcp://127.0.0.1:0")
    try:
        assert not server.addr.endswith(":0")
        c = Client(server.addr, identity=b"r0")
        assert wait_for(lambda: c.send(encode_batch(0, [hello(0)])))
        assert wait_for(lambda: len(got) == 1)
        c.close()
    finally:
        server.close()


def test_a_flooding_peer_is_ignored_without_hurting_the_others(sockdir, clock):
    addr = f"ipc://{sockdir}/w.sock"
    got, errors = [], []
    server = Server(addr, lambda b, r: got.append(b.rank), lambda p, m: errors.append((p, m)), flood_frames_per_s=50,
                    clock=clock).start()
    try:
        flood = Client(addr, identity=b"flood")
        calm = Client(addr, identity=b"calm")
        for _ in range(500):  # past zmq's 256, the next send waits for room
            assert wait_for(lambda: flood.send(encode_batch(7, [])))
        # all 500 frames inside one second of the server's clock: 50 taken, 450 shed
        assert wait_for(lambda: server.shed.by_peer.get(b"flood") == 450)
        assert got.count(7) == 50
        assert wait_for(lambda: calm.send(encode_batch(1, [hello(1)])))
        assert wait_for(lambda: 1 in got)  # the others are heard
        said = [m for p, m in errors if p == "flood"]
        assert len(said) == 1 and said[0].startswith("over 50 frames/s")  # said once
        clock.tick(1.0)  # a new second: the flooding peer is heard again
        assert flood.send(encode_batch(7, []))
        assert wait_for(lambda: got.count(7) == 51)
        flood.close()
        calm.close()
    finally:
        server.close()


def two_peers_talking(sockdir, n_clients: int, clock=time.monotonic):
    """A server capped at 2 peers, `n_clients` clients, the first two heard from."""
    addr = f"ipc://{sockdir}/w.sock"
    got = []
    server = Server(addr, lambda b, r: got.append(b.rank), lambda p, m: None, max_peers=2, clock=clock).start()
    clients = [Client(addr, identity=f"rank{i}".encode()) for i in range(n_clients)]
    for i, c in enumerate(clients[:2]):
        assert wait_for(lambda c=c, i=i: c.send(encode_batch(i, [hello(i)])))
    assert wait_for(lambda: sorted(got) == [0, 1])
    return server, got, clients


def test_peers_silent_for_a_minute_are_forgotten_and_make_room(sockdir, clock):
    server, got, clients = two_peers_talking(sockdir, 3, clock)
    try:
        clock.tick(59.0)  # silent for 59 s: still remembered, the newcomer is refused
        assert wait_for(lambda: clients[2].send(encode_batch(2, [hello(2)])))
        assert wait_for(lambda: server.refused == 1)
        clock.tick(2.0)  # 61 s: forgotten, room for the newcomer
        assert clients[2].send(encode_batch(2, [hello(2)]))
        assert wait_for(lambda: got.count(2) == 1)
        assert server.refused == 1 and b"rank2" in server.peers and b"rank0" not in server.peers
        for c in clients:
            c.close()
    finally:
        server.close()


def test_peers_beyond_the_cap_are_ignored_and_the_first_ones_keep_working(sockdir):
    server, got, clients = two_peers_talking(sockdir, 4)
    try:
        for i, c in enumerate(clients[2:], start=2):
            assert wait_for(lambda c=c, i=i: c.send(encode_batch(i, [hello(i)])))
        assert wait_for(lambda: server.refused >= 2)
        assert clients[0].send(encode_batch(0, [hello(0)]))
        assert wait_for(lambda: got.count(0) == 2)
        assert sorted(set(got)) == [0, 1]
        for c in clients:
            c.close()
    finally:
        server.close()


def test_bad_frames_are_counted_each_and_described_once_per_peer_per_second(sockdir, clock):
    addr = f"ipc://{sockdir}/w.sock"
    server, got, errors = make_server(addr, clock=clock)
    try:
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, b"noisy")
        connections = Handshakes(raw)
        raw.connect(addr)
        for i in range(2000):
            raw.send(bytes([i % 256]) * 64)
        assert wait_for(lambda: server.bad_frames > 0)
        # described once, and its connection closed then (what was in flight on it is
        # gone with it; zmq connects it again); every frame that arrived is counted
        assert wait_for(lambda: connections() >= 2)
        assert wait_for(lambda: settled(lambda: server.bad_frames))
        n = server.bad_frames
        assert 1 <= n <= 2000 and server.conns.evicted == 1
        assert len(errors) == 1 and errors[0][0] == "noisy"
        clock.tick(1.0)  # a second on: the next bad frame is described again
        raw.send(b"\x93\x01\x00\x91\xc0")  # shaped like a batch, wrong inside
        assert wait_for(lambda: len(errors) == 2)
        assert f"{n + 1} bad frames from it" in errors[1][1]
        assert server.rejected.top() == [("noisy", n + 1)]
        connections.close()
        raw.close(0)
    finally:
        server.close()


def test_when_the_model_falls_behind_frames_are_shed_and_counted_per_peer(sockdir):
    import threading

    addr = f"ipc://{sockdir}/w.sock"
    gate = threading.Event()
    got, errors = [], []
    server = Server(addr, lambda b, r: (gate.wait(10), got.append(b.rank)), lambda p, m: errors.append((p, m)),
                    queue_bytes=2000).start()
    try:
        c = Client(addr, identity=b"rank3-pid9")
        frame = encode_batch(3, [hello(3)])
        assert wait_for(lambda: c.send(frame))  # taken by the (stuck) model
        for _ in range(50):
            c.send(frame)
        assert wait_for(lambda: server.shed_frames > 0)
        assert any(p == "rank3-pid9" and "behind" in m for p, m in errors)
        gate.set()
        # Every frame is, in the end, either handed to the model or counted as shed.
        # Frames still queued in zmq when the model frees up are read after it, so
        # the total is waited for, not read at one instant (on Python 3.10 eight
        # frames were still in flight when `got` first caught up with `frames`).
        assert wait_for(lambda: server.frames + server.shed_frames == 51), (server.frames, server.shed_frames)
        assert wait_for(lambda: len(got) == server.frames)
        assert server.shed.top() == [("rank3-pid9", server.shed_frames)]
        c.close()
    finally:
        gate.set()
        server.close()


def test_frames_the_full_inbox_cannot_take_are_shed_without_being_decoded(sockdir):
    """Behind a flood most frames are shed: decoding them first took the core the
    model needed to catch up. They are still counted, per peer, exactly."""
    import threading

    from commviz.events import decode_batch

    addr = f"ipc://{sockdir}/w.sock"
    gate = threading.Event()
    decoded = []
    server = Server(addr, lambda b, r: gate.wait(10), lambda p, m: None, queue_bytes=2000,
                    decode=lambda payload: (decoded.append(1), decode_batch(payload))[1]).start()
    try:
        c = Client(addr, identity=b"rank3-pid9")
        frame = encode_batch(3, [hello(3)])
        assert wait_for(lambda: c.send(frame))
        for _ in range(50):
            c.send(frame)
        assert wait_for(lambda: server.frames + server.shed_frames == 51), (server.frames, server.shed_frames)
        assert server.shed_frames > 30
        assert len(decoded) <= server.frames + 1  # the shed ones were not decoded (one may race the check)
        c.close()
    finally:
        gate.set()
        server.close()


def test_while_the_inbox_is_full_frames_wait_at_their_sender_instead_of_being_read_to_be_shed(sockdir, clock):
    """Behind a flood two frames in three read were shed: each cost zmq's thread and
    the reader a read for nothing. While the model has no room the socket is read
    only every FULL_PAUSE_S, so the flood waits in zmq or is refused at its senders
    (who count it); once the model frees up every frame taken is read, handed over
    or shed and counted, as before."""
    import threading

    from commviz.transport.server import FULL_PAUSE_S

    addr = f"ipc://{sockdir}/w.sock"
    gate = threading.Event()
    # the reader looks at the stopped clock every millisecond instead of pausing: only
    # the test's ticks let it read again
    server = Server(addr, lambda b, r: gate.wait(10), lambda p, m: None, queue_bytes=2000,
                    clock=clock, sleep=lambda s: time.sleep(0.001)).start()
    try:
        c = Client(addr, identity=b"rank3-pid9")
        frame = encode_batch(3, [ev for i in range(400) for ev in op(i, 1000 * i, 1000 * i + 500, seq=i)])  # ~20 KB
        assert wait_for(lambda: c.send(frame))
        assert wait_for(lambda: server.frames == 1 and server.paused > 0)  # taken by the (stuck) model: full
        sent = 1
        while c.send(frame):  # flat out, as a peer ignoring its credit window
            sent += 1
            assert sent < 100_000, "never refused: the flood was read as it came"
        assert server.frames + server.shed_frames == 1  # refused at the sender, not one frame read meanwhile
        clock.tick(FULL_PAUSE_S * 1.01)  # a hair over: 100.05 - 100 rounds to just under 0.05
        assert wait_for(lambda: server.frames + server.shed_frames > 1)  # a pause on, the socket is read again
        gate.set()
        # (this inbox is "full" whenever a frame waits: each round waits for the next pause)
        assert wait_for(lambda: clock.tick(FULL_PAUSE_S) or server.frames + server.shed_frames == sent, timeout=30), \
            (server.frames, server.shed_frames, sent)
        c.close()
    finally:
        gate.set()
        server.close()


def test_junk_from_a_new_peer_while_the_inbox_is_full_is_bad_not_a_peer(sockdir):
    """Shedding without decoding is for peers already talking: a frame from a new
    one is judged first, so a flood of junk identities is counted as bad frames and
    takes none of the peer places real ranks need."""
    import threading

    from commviz.transport.server import BATCH_HEAD

    addr = f"ipc://{sockdir}/w.sock"
    gate = threading.Event()
    server = Server(addr, lambda b, r: gate.wait(10), lambda p, m: None, queue_bytes=2000).start()
    try:
        c = Client(addr, identity=b"rank3-pid9")
        frame = encode_batch(3, [hello(3)])
        assert wait_for(lambda: c.send(frame))
        for _ in range(20):
            c.send(frame)
        assert wait_for(lambda: server.shed_frames > 0)
        junk = Client(addr, identity=b"junk-1")
        assert wait_for(lambda: junk.send(bytes([BATCH_HEAD]) + b"\xff" * 4000))  # "too big to fit", undecoded
        assert wait_for(lambda: server.bad_frames == 1)
        assert b"junk-1" not in server.peers
        c.close()
        junk.close()
    finally:
        gate.set()
        server.close()
