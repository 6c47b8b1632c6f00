"""The reader loop: the C one and pyzmq's give the same messages, parts counted, the
connection named, a round bounded in count and bytes."""

import os
import stat
import time

import pytest
import zmq

from commviz.transport import reader
from tests.helpers import wait_for


def _connect(ctx, addr: str, identity: bytes):
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(addr)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, identity)
    dealer.connect(addr)
    return router, dealer


@pytest.fixture
def pair(tmp_path):
    ctx = zmq.Context()
    router, dealer = _connect(ctx, f"ipc://{tmp_path}/r.sock", b"rank3-pid9")
    yield router, dealer
    dealer.close(0)
    router.close(0)
    ctx.term()


def _take(read, want, n=1000, max_bytes=1 << 30):
    got = []
    wait_for(lambda: got.extend(read(n, max_bytes)) or len(got) >= want, timeout=10)
    return got


@pytest.mark.native
def test_the_c_reader_is_built_and_bound():
    """The rejection figures in docs/PERFORMANCE.md are the C loop's; an install
    that silently fell back to pyzmq would quietly be four times slower."""
    assert reader.fast()


@pytest.mark.parametrize("prefer_c", [True, False], ids=["c", "pyzmq"])
def test_messages_come_whole_with_their_extra_parts_counted(pair, prefer_c):
    router, dealer = pair
    big = os.urandom(128 * 1024)
    dealer.send(b"\x93one")
    dealer.send_multipart([b"a", b"b", b"c"])
    dealer.send(b"")
    dealer.send(big)
    got = _take(reader.reader(router, prefer_c), 4)
    assert [(i, p, x) for i, p, x, _ in got] == [
        (b"rank3-pid9", b"\x93one", 0), (b"rank3-pid9", b"a", 2),
        (b"rank3-pid9", b"", 0), (b"rank3-pid9", big, 0)]
    fd = reader.fd_of(got[0][3])
    assert stat.S_ISSOCK(os.fstat(fd).st_mode)  # the connection itself, to be closed
    assert reader.reader(router, prefer_c)(10, 1 << 30) == []  # nothing left, no error


@pytest.mark.parametrize("prefer_c", [True, False], ids=["c", "pyzmq"])
def test_a_round_stops_at_its_count_or_its_bytes(pair, prefer_c):
    router, dealer = pair
    for i in range(10):
        dealer.send(bytes([i]) * 1000)
    read = reader.reader(router, prefer_c)
    assert router.poll(10_000)
    time.sleep(0.2)  # all ten queued (RCVHWM is zmq's default here)
    first = read(3, 1 << 30)
    assert len(first) == 3
    second = read(100, 2500)  # stops at the frame that reaches 2,500 bytes
    assert len(second) == 3
    rest = _take(read, 4)
    assert [p[0] for _, p, _, _ in first + second + rest] == list(range(10))


def test_both_readers_agree_on_a_random_stream(tmp_path):
    import random

    rng = random.Random(7)
    msgs = [[rng.randbytes(rng.choice((0, 1, 63, 64, 3000))) for _ in range(rng.randint(1, 4))]
            for _ in range(500)]
    ctx = zmq.Context()
    got = {}
    try:
        for prefer_c in (True, False):
            router, dealer = _connect(ctx, f"ipc://{tmp_path}/{prefer_c}.sock", b"p")
            for m in msgs:
                dealer.send_multipart(m)
            got[prefer_c] = [(i, p, x) for i, p, x, _ in _take(reader.reader(router, prefer_c), len(msgs), n=37)]
            dealer.close(0)
            router.close(0)
    finally:
        ctx.term()
    assert got[True] == got[False] == [(b"p", m[0], len(m) - 1) for m in msgs]


@pytest.mark.parametrize("prefer_c", [True, False], ids=["c", "pyzmq"])
def test_every_part_counts_towards_a_rounds_bytes(pair, prefer_c):
    """A peer's extra parts are dropped, but they were in memory: a round of
    many-part messages stops at the byte budget too."""
    router, dealer = pair
    for _ in range(3):
        dealer.send_multipart([b"a" * 1000, b"b" * 1000, b"c" * 1000])
    read = reader.reader(router, prefer_c)
    first = _take(read, 1, max_bytes=2500)
    assert [(p[:1], x) for _, p, x, _ in first] == [(b"a", 2)]
    assert len(_take(read, 2)) == 2


def test_a_failed_allocation_never_shifts_identities(tmp_path):
    """If making a message's objects fails, its other parts are taken too: a peer's
    bytes must never be read as the next message's identity."""
    _testcapi = pytest.importorskip("_testcapi")
    if not reader.fast():
        pytest.skip("the C reader is not built")
    for k in range(8):  # fail the k-th allocation of the call
        ctx = zmq.Context()
        router, dealer = _connect(ctx, f"ipc://{tmp_path}/m{k}.sock", b"peer")
        dealer.send_multipart([b"PAYLOAD", b"x1", b"x2"])
        dealer.send(b"\x93next")
        deadline = time.monotonic() + 10
        while router.poll(10) == 0 and time.monotonic() < deadline:
            pass
        time.sleep(0.1)
        read = reader.reader(router)
        got = []
        _testcapi.set_nomemory(k)
        try:
            got += read(10, 1 << 30)
        except MemoryError:
            pass
        finally:
            _testcapi.remove_mem_hooks()
        got += read(10, 1 << 30)
        assert {i for i, _, _, _ in got} <= {b"peer"}, (k, got)
        assert [p for _, p, _, _ in got] in ([b"PAYLOAD", b"\x93next"], [b"\x93next"], []), (k, got)
        dealer.close(0)
        router.close(0)
        ctx.term()
