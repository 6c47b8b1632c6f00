"""The dashboard headless (Textual's run_test) on a synthetic live job: a producer
thread hands ring all_reduce frames to a real `watcher.LiveFeed` (not started on any
socket: frames go in through the callback the transport server calls, so they queue
and reach the model a batch at a time as in `commviz watch`), while the app draws.
`--ingest each` is the older path, each event into the model on its own under the
lock, 256 per acquisition. Prints, per world size, the frames/s the screen actually
repainted, the time one frame took (Textual's compositor update, which calls our
render_line) and our ticks took on the UI thread, how long a snapshot (taken on the
app's update thread) held the lock, and the event rate the producer held at the same
time.

    python bench/render.py [--ranks 8,64,1024] [--rate 100000] [--seconds 5] [--size 160x50]
                           [--ingest batches|each|remote]

`--ingest remote` is `commviz watch` as it runs now: the feed and the HTTP view in a
collector process, fed over the wire by two producer processes (bench/ingest.py's),
the dashboard here reading it (`viewlink`); the frames/s are the view process's own,
the lock hold the collector's, and "events/s held" what the collector ingested.

Frames reach the feed encoded and read into columns (`model.store.decode_frame`), as
the transport server hands them on. Frames are capped by the animation clock (--anim-hz, default 30) and Textual's own
update period (60/s); the figure to compare with the targets is frames/s (>= 30 at 64
ranks, >= 10 at 1024, while ingesting 100k events/s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.events import BASE_SCHEMA, Batch, GroupDef, Hello, OpEnd, OpStart, encode_batch  # noqa: E402
from commviz.model.store import decode_frame  # noqa: E402
from commviz.model.state import Model  # noqa: E402
from commviz.tui.app import WatchApp  # noqa: E402
from commviz.view.feed import ModelFeed  # noqa: E402
from commviz.watcher import LiveFeed  # noqa: E402

CHUNK = 256  # events per lock acquisition (a transport batch)


class BenchFeed(ModelFeed):
    """A live-like feed: wall-clock now, a model, the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.model = Model()

    def status(self) -> str:
        return f"bench · {len(self.model.ranks)} ranks · {self.model.events} events"


class Producer(threading.Thread):
    """Ring all_reduce instances on `n` ranks at up to `rate` events/s, every event
    stamped with the current time so the dashboard sees them as live."""

    def __init__(self, feed, n: int, rate: float) -> None:
        super().__init__(daemon=True, name="bench-producer")
        self.feed, self.n, self.rate = feed, n, rate
        self.stop = threading.Event()
        self.sent = 0
        self.t0 = self.t1 = 0.0
        self.lock_waits: list[float] = []

    def _hellos(self) -> list[list]:
        mono, wall = time.monotonic_ns(), time.time_ns()
        return [[Hello(rank=r, local_rank=r % 8, world_size=self.n, host=f"node{r // 8}", pid=10_000 + r,
                       backend="gloo", device="cpu", torch_version="bench", commviz_version="bench",
                       job="bench", mono_ns=mono, wall_ns=wall), GroupDef("0", list(range(self.n)), "gloo")]
                for r in range(self.n)]

    def hello(self) -> None:
        with self.feed.lock:
            m = self.feed.model
            for r, evs in enumerate(self._hellos()):
                for ev in evs:
                    m.ingest(r, ev)

    def run(self) -> None:
        n, feed = self.n, self.feed
        seq = 0
        self.t0 = time.perf_counter()
        while not self.stop.is_set():
            t = time.monotonic_ns()
            evs = [(r, OpStart(seq, t + r, "all_reduce", "0", seq, 1 << 20)) for r in range(n)]
            evs += [(r, OpEnd(seq, t + 200_000 + r)) for r in range(n)]
            for i in range(0, len(evs), CHUNK):
                w0 = time.perf_counter()
                with feed.lock:
                    self.lock_waits.append(time.perf_counter() - w0)
                    ingest = feed.model.ingest
                    for r, ev in evs[i:i + CHUNK]:
                        ingest(r, ev)
            self.sent += len(evs)
            seq += 1
            self._pace()
        self.t1 = time.perf_counter()

    def _pace(self) -> None:
        ahead = self.sent / self.rate - (time.perf_counter() - self.t0)
        if ahead > 0:
            time.sleep(ahead)


class FrameProducer(Producer):
    """The same instances as frames, a rank's frame holding `steps` of them (what a
    probe flushes), handed to the feed as the transport server hands them on."""

    def hello(self) -> None:
        for r, evs in enumerate(self._hellos()):
            self.feed._on_batch(Batch(BASE_SCHEMA, r, evs), b"")
        self.feed.drain()

    def run(self) -> None:
        n, feed = self.n, self.feed
        steps = max(1, 8192 // (2 * n))  # about 8k events a round of frames
        seq = 0
        self.t0 = time.perf_counter()
        while not self.stop.is_set():
            t = time.monotonic_ns()
            for r in range(n):
                evs = []
                for k in range(seq, seq + steps):
                    evs.append(OpStart(k, t + r + 1000 * (k - seq), "all_reduce", "0", k, 1 << 20))
                    evs.append(OpEnd(k, t + 200_000 + r + 1000 * (k - seq)))
                w0 = time.perf_counter()
                payload = encode_batch(r, evs)  # as the wire brings it, read into columns as the server does
                feed._on_batch(decode_frame(payload), payload)
                self.lock_waits.append(time.perf_counter() - w0)
                self.sent += len(evs)
            seq += steps
            self._pace()
        self.t1 = time.perf_counter()


def _collector(n: int, rate: float, seconds: float, conn) -> None:
    """`--ingest remote`'s collector, in a process of its own as `commviz watch` now
    runs it: a live feed on a socket, fed over the wire by bench/ingest.py's producer
    processes at `rate`, and the HTTP view a dashboard reads. Answers `sent` with the
    events its model has ingested so far."""
    import multiprocessing as mp

    from bench.ingest import producer
    from commviz.httpview import StateServer
    from commviz.viewlink import ViewSource

    feed = LiveFeed(f"ipc://{tempfile.mkdtemp(prefix='cvz-render-')}/w.sock").start()
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=producer, args=(feed.addr, list(range(n))[i::2], n, seconds, rate, go, out),
                         daemon=True) for i in range(2)]
    for p in procs:
        p.start()
    while True:
        with feed.lock:
            if len(feed.model.ranks) >= n:
                break
        time.sleep(0.05)
    http = StateServer(feed, "127.0.0.1", 0, views=ViewSource(feed, title=f"bench {n} ranks")).start()
    conn.send(http.url)
    t0 = time.perf_counter()
    go.set()
    while conn.recv() == "sent":
        with feed.lock:
            conn.send((feed.model.events, time.perf_counter() - t0))
    for p in procs:
        p.kill()
    http.close()
    feed.close()


def _timed(store: list[float], fn):
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            store.append(time.perf_counter() - t)
    return wrapper


async def run_one(n: int, rate: float, seconds: float, size: tuple[int, int], anim_hz: float, warmup: float,
                  ingest: str = "batches") -> dict:
    each, remote = ingest == "each", ingest == "remote"
    if remote:
        import multiprocessing as mp

        from commviz.viewlink import RemoteFeed

        conn, theirs = mp.Pipe()
        child = mp.get_context("spawn").Process(target=_collector, args=(n, rate, warmup + seconds + 5, theirs))
        child.start()
        feed = RemoteFeed(conn.recv())
        prod = _RemoteCount(conn)
    elif each:
        feed = BenchFeed()
        prod = Producer(feed, n, rate)
    else:
        feed = LiveFeed(f"ipc://{tempfile.mkdtemp(prefix='cvz-render-')}/w.sock")
        feed.start()
        prod = FrameProducer(feed, n, rate)
    if not remote:
        prod.hello()
    frames: list[float] = []
    data_ticks: list[float] = []
    anim_ticks: list[float] = []
    holds: list[float] = []

    class BenchApp(WatchApp):
        def on_snapshot_fetched(self, message) -> None:
            # what a data tick costs the UI thread: drawing the snapshot the update
            # thread took (the snapshot itself is `lock hold`, off the UI thread)
            t = time.perf_counter()
            super().on_snapshot_fetched(message)
            data_ticks.append(time.perf_counter() - t)
            holds.append(message.fetched.lock_hold_s)

        def animate_tick(self) -> None:
            t = time.perf_counter()
            super().animate_tick()
            anim_ticks.append(time.perf_counter() - t)

    app = BenchApp(feed, title=f"bench {n} ranks", refresh_hz=4, anim_hz=anim_hz)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        screen._compositor_refresh = _timed(frames, screen._compositor_refresh)
        prod.start()
        await pilot.pause(warmup)
        for lst in (frames, data_ticks, anim_ticks, holds):
            lst.clear()
        sent0, t0 = prod.sent, time.perf_counter()
        await asyncio.sleep(seconds)
        sent1, t1 = prod.sent, time.perf_counter()
        nframes = len(frames)
        prod.stop.set()
        prod.join(5)
        if not each:
            feed.close()
        if remote:
            child.join(10)
        flow = app.query_one("#flow")
        kind = flow.flow_layout.kind if flow.flow_layout else "-"
    span = t1 - t0
    return {
        "ranks": n,
        "layout": kind,
        "fps": nframes / span,
        "frame_ms": 1e3 * statistics.mean(frames) if frames else 0.0,
        "frame_p95_ms": 1e3 * _p95(frames),
        "data_tick_ms": 1e3 * statistics.mean(data_ticks) if data_ticks else 0.0,
        "anim_tick_ms": 1e3 * statistics.mean(anim_ticks) if anim_ticks else 0.0,
        "lock_hold_ms": 1e3 * statistics.mean(holds) if holds else 0.0,
        "lock_hold_max_ms": 1e3 * max(holds) if holds else 0.0,
        "events_per_s": (sent1 - sent0) / span,
        "producer_lock_wait_ms": 1e3 * max(prod.lock_waits) if prod.lock_waits else 0.0,
        "model_events": None if remote else feed.model.events,  # (remote: in the collector's process)
    }


class _RemoteCount:
    """The producer as `run_one` reads it, when it runs in the collector's process."""

    def __init__(self, conn) -> None:
        self.conn, self.lock_waits = conn, []
        self.stop = self

    @property
    def sent(self) -> int:
        self.conn.send("sent")
        return self.conn.recv()[0]

    def start(self) -> None:
        pass

    def set(self) -> None:
        self.conn.send("stop")

    def join(self, timeout: float) -> None:
        pass


def _p95(xs: list[float]) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8,64,1024")
    ap.add_argument("--rate", type=float, default=100_000, help="target events/s (default 100k)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--size", default="160x50", help="terminal WxH (default 160x50)")
    ap.add_argument("--anim-hz", type=float, default=30.0)
    ap.add_argument("--ingest", choices=("batches", "each", "remote"), default="batches",
                    help="frames through the live feed's queue in this process, each event on its own, or "
                         "(remote) a collector in another process that this dashboard reads as `commviz watch` does")
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.lower().split("x"))
    print(f"terminal {w}x{h}, animation {args.anim_hz:g}/s, data 4/s, target {args.rate:,.0f} events/s, "
          f"{args.seconds:g} s per size, ingest {args.ingest}, {os.cpu_count()} CPUs")
    head = (f"{'ranks':>6} {'layout':>6} {'frames/s':>9} {'frame ms':>9} {'p95 ms':>7} {'data tick':>10} "
            f"{'anim tick':>10} {'lock hold (max)':>16} {'events/s held':>14}")
    print(head)
    for n in (int(x) for x in args.ranks.split(",")):
        r = asyncio.run(run_one(n, args.rate, args.seconds, (w, h), args.anim_hz, args.warmup, args.ingest))
        print(f"{r['ranks']:>6} {r['layout']:>6} {r['fps']:>9.1f} {r['frame_ms']:>9.2f} {r['frame_p95_ms']:>7.2f} "
              f"{r['data_tick_ms']:>8.2f}ms {r['anim_tick_ms']:>8.2f}ms "
              f"{r['lock_hold_ms']:>6.2f}ms ({r['lock_hold_max_ms']:>5.1f}) "
              f"{r['events_per_s']:>14,.0f}", flush=True)


if __name__ == "__main__":
    main()
