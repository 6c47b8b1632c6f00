"""Two relays on loopback as two hosts, one central watcher: every op of every rank
arrives, exactly once, through the token-guarded TCP listener."""

import time

import pytest

from commviz.events import Goodbye, encode_batch
from commviz.transport.client import Client
from commviz.transport.relay import Relay
from commviz.watcher import LiveFeed
from tests.helpers import free_port, group, hello, op
from tests.helpers import wait_for

WORLD = (0, 1, 2, 3)
STEPS = 300



def rank_frames(rank: int, host: str):
    yield [hello(rank, world=4, host=host), group(ranks=WORLD)]
    for k in range(0, STEPS, 50):  # the probe flushes a run of ops per frame
        evs = []
        for i in range(k, k + 50):
            evs += op(i, 1000 * i + rank, 1000 * i + 600, seq=i, nbytes=1024 * (rank + 1))
        yield evs
    yield [Goodbye(1000 * STEPS + 1)]


def test_two_relays_into_one_watcher_give_exact_counts(tmp_path):
    central = LiveFeed(f"tcp://127.0.0.1:{free_port()}", token="s3cret").start()
    relays, clients = [], []
    try:
        for node in ("nodeA", "nodeB"):
            d = tmp_path / node
            d.mkdir(mode=0o700)
            relays.append(Relay(f"ipc://{d}/r.sock", central.addr, token="s3cret").start())
        for rank in WORLD:
            relay = relays[rank // 2]
            c = Client(relay.addr, identity=f"rank{rank}".encode())
            clients.append(c)
            for evs in rank_frames(rank, f"node{'AB'[rank // 2]}"):
                assert wait_for(lambda: c.send(encode_batch(rank, evs)))
        assert wait_for(lambda: central.model.events == 4 * (2 + 2 * STEPS + 1), timeout=20)
        s = central.model.summary()
        assert [(o["op"], o["count"], o["bytes"]) for o in s["ops"]] == [("all_reduce", STEPS, 4096 * STEPS)]
        assert [r["ops"]["all_reduce"] for r in s["per_rank"]] == [
            {"count": STEPS, "bytes": 1024 * (r + 1) * STEPS} for r in WORLD]
        assert {r["host"] for r in s["ranks"]} == {"nodeA", "nodeB"}
        assert {r["status"] for r in s["ranks"]} == {"exited"}
        assert len(central.server.peers) == 2  # one peer per node, not per rank
        assert all(r.dropped == 0 for r in relays) and central.model.duplicates == 0
    finally:
        for c in clients:
            c.close()
        for r in relays:
            r.close()
        central.close()


def test_a_relay_without_the_token_is_refused(tmp_path):
    central = LiveFeed(f"tcp://127.0.0.1:{free_port()}", token="s3cret").start()
    d = tmp_path / "n"
    d.mkdir(mode=0o700)
    relay = Relay(f"ipc://{d}/r.sock", central.addr, token="wrong").start()
    c = Client(relay.addr, identity=b"rank0")
    try:
        assert wait_for(lambda: c.send(encode_batch(0, [hello(0)])))
        assert wait_for(lambda: central.server.denied > 0, timeout=10)
        time.sleep(0.3)
        assert central.model.events == 0
    finally:
        c.close()
        relay.close()
        central.close()


def test_a_relay_whose_watcher_is_down_gives_up_at_close_after_its_hand_over_and_counts_the_rest(tmp_path, clock):
    """Ranks on a node never wait for the centre, nor does the relay's exit: what it
    could not forward within `hand_over_s` is dropped and counted."""
    d = tmp_path / "n"
    d.mkdir(mode=0o700)
    relay = Relay(f"ipc://{d}/r.sock", f"tcp://127.0.0.1:{free_port()}", clock=clock, sleep=clock.sleep).start()
    c = Client(relay.addr, identity=b"rank0")
    try:
        evs = [hello(0), group(ranks=(0,)), *op(0, 1000, 2000)]
        assert wait_for(lambda: c.send(encode_batch(0, evs)))
        assert wait_for(lambda: relay.held_events == len(evs))  # held: nobody to forward to
    finally:
        c.close()
        t0 = clock()
        relay.close(hand_over_s=2.0)
    assert clock() - t0 == pytest.approx(2.0, abs=0.01)  # tried until then
    assert relay.dropped == len(evs) and relay.forwarded == 0
