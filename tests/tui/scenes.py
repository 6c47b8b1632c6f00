"""Deterministic dashboard scenes for Pilot and snapshot tests: a fake live feed with a
model filled from real events and a clock that stands still."""

from __future__ import annotations

import threading

from commviz.events import GroupDef, Hello, OpEnd, OpStart, Sample
from commviz.model.state import Model
from commviz.view.feed import ModelFeed

from .helpers import MS, WALL0, hello


class FakeFeed(ModelFeed):
    """A live-like feed: a model we fill by hand and a fixed clock."""

    def __init__(self, now: int = WALL0 + 100 * MS) -> None:
        self.lock = threading.Lock()
        self.model = Model()
        self.now = now
        self.advanced = 0

    def now_ns(self) -> int:
        return self.now

    def status(self) -> str:
        return "listening on ipc:///tmp/commviz-test · 2 ranks connected"

    def fetch(self, query, hosts=None):
        self.advance()
        return super().fetch(query, hosts)

    def advance(self) -> None:
        """Counts the ticks that read it (on whichever thread asked)."""
        self.advanced += 1


def gpu_hello(rank: int, world: int, per_host: int = 8) -> Hello:
    local = rank % per_host
    return Hello(
        rank=rank, local_rank=local, world_size=world, host=f"node{rank // per_host}", pid=2000 + rank,
        backend="nccl", device=f"cuda:{local}", torch_version="2.5.0", commviz_version="0.1.0", job="job-gpu",
        mono_ns=WALL0, wall_ns=WALL0,
    )


def busy_ring(world: int = 8, ops: int = 40, nbytes: int = 64 << 20, gpu: bool = False, per_host: int = 8,
              op: str = "all_reduce", period_ms: int = 25) -> FakeFeed:
    """`world` ranks doing `ops` collectives, one every `period_ms`, ending just before now."""
    start = 1000 * MS
    feed = FakeFeed(now=WALL0 + start + ops * period_ms * MS)
    m = feed.model
    for r in range(world):
        m.ingest(r, gpu_hello(r, world, per_host) if gpu else hello(r, mono_ns=WALL0, wall_ns=WALL0, world_size=world))
        m.ingest(r, GroupDef("0", list(range(world)), "nccl" if gpu else "gloo"))
    for i in range(ops):
        t = WALL0 + start + i * period_ms * MS
        for r in range(world):
            m.ingest(r, OpStart(id=i, t=t + r * 10_000, op=op, group="0", seq=i, bytes=nbytes))
        for r in range(world):
            m.ingest(r, OpEnd(id=i, t=t + 5 * MS))
    return feed


def with_p2p(feed: FakeFeed, src: int, dst: int, nbytes: int = 256 << 20, count: int = 10) -> FakeFeed:
    """Add `count` send/recv pairs src→dst over the last second."""
    m = feed.model
    for k in range(count):
        t = feed.now - 900 * MS + k * 80 * MS
        oid = 10_000 + k
        m.ingest(src, OpStart(id=oid, t=t, op="send", group="0", seq=k, bytes=nbytes, peer=dst))
        m.ingest(dst, OpStart(id=oid, t=t, op="recv", group="0", seq=k, bytes=nbytes, peer=src))
        m.ingest(src, OpEnd(id=oid, t=t + 20 * MS))
        m.ingest(dst, OpEnd(id=oid, t=t + 20 * MS))
    return feed


def hang(world: int = 8, missing: int = 5, gpu: bool = False) -> FakeFeed:
    """Everyone but `missing` entered reduce_scatter #40 and waits 12 s for it."""
    feed = busy_ring(world, ops=40, gpu=gpu)
    m = feed.model
    t = feed.now
    for r in range(world):
        if r != missing:
            m.ingest(r, OpStart(id=40, t=t, op="reduce_scatter_tensor", group="0", seq=40, bytes=1 << 30))
    feed.now = t + 12_000 * MS
    return feed


def nvlink_samples(feed: FakeFeed, host: str = "node0", gpus: int = 8, tx_Bps: float = 120e9) -> FakeFeed:
    """Host samples from local rank 0 (rank 0) with measured NVLink rates per GPU."""
    vals = {"cpu.percent": 35.0}
    for i in range(gpus):
        vals[f"gpu{i}.nvlink.tx_Bps"] = tx_Bps * (1 + i / 20)
        vals[f"gpu{i}.nvlink.rx_Bps"] = tx_Bps * (1 + i / 25)
    feed.model.ingest(0, Sample(t=feed.now - 100 * MS, values=vals))
    return feed


def straggler_job_that_ended(world: int = 4, ops: int = 20, late_ms: int = 30, goodbye: bool = True) -> FakeFeed:
    """`world` ranks, one all_reduce every 100 ms, the last rank `late_ms` late to each;
    then (with `goodbye`) every rank exits. Now is a second after the last op."""
    from commviz.events import Goodbye

    start = 1000 * MS
    feed = FakeFeed(now=WALL0 + start + (ops * 100 + 1000) * MS)
    m = feed.model
    for r in range(world):
        m.ingest(r, hello(r, mono_ns=WALL0, wall_ns=WALL0, world_size=world))
        m.ingest(r, GroupDef("0", list(range(world)), "gloo"))
    for i in range(ops):
        t = WALL0 + start + i * 100 * MS
        for r in range(world):
            m.ingest(r, OpStart(id=i, t=t + (late_ms * MS if r == world - 1 else r * 100_000), op="all_reduce",
                                group="0", seq=i, bytes=1 << 20))
        for r in range(world):
            m.ingest(r, OpEnd(id=i, t=t + (late_ms + 2) * MS))
    if goodbye:
        for r in range(world):
            m.ingest(r, Goodbye(WALL0 + start + (ops * 100 + 100) * MS))
    return feed
