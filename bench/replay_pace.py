"""How long a short trace takes to replay by default: the dashboard headless
(Textual's run_test) on a synthetic two-rank trace of `--span` seconds (an
all_reduce every 10 ms, a mark every 100 ms), timed on the wall clock from the
first frame to the end of the trace. Also, for a bigger trace, how long the replay
takes to be ready to draw and to have its diagnoses on the timeline.

    python bench/replay_pace.py [--span 0.4] [--events 200000]

The last line is the figure: seconds a `--span` s trace plays for (target: about 10).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.events import SCHEMA_VERSION, Batch, GroupDef, Goodbye, Hello, Mark, OpEnd, OpStart  # noqa: E402
from commviz.tui.app import WatchApp  # noqa: E402
from commviz.tui.feed import ReplayFeed  # noqa: E402

MS = 1_000_000


def trace(span_s: float, every_ms: float = 10.0) -> list[Batch]:
    span = int(span_s * 1e9)
    step = int(every_ms * MS)
    batches = []
    for r in (0, 1):
        evs: list = [Hello(rank=r, local_rank=r, world_size=2, host="h", pid=1 + r, backend="gloo", device="cpu",
                           torch_version="2.13.0", commviz_version="0.1.0", job="bench", mono_ns=0, wall_ns=0),
                     GroupDef("0", [0, 1], "gloo")]
        for i, t in enumerate(range(0, span - step, step)):
            if r == 0 and i % 10 == 0:
                evs.append(Mark(t=t, text=f"step {i // 10}"))
            evs += [OpStart(id=i, t=t + r * 1000, op="all_reduce", group="0", seq=i, bytes=4096),
                    OpEnd(id=i, t=t + step // 2)]
        evs.append(Goodbye(t=span))
        batches.append(Batch(SCHEMA_VERSION, r, evs))
    return batches


class FirstRead:
    """time.monotonic, remembering its first reading: the feed's first advance, when
    playback starts."""

    def __init__(self) -> None:
        self.first: float | None = None

    def __call__(self) -> float:
        t = time.monotonic()
        if self.first is None:
            self.first = t
        return t


async def play(feed: ReplayFeed, clock: FirstRead) -> float:
    app = WatchApp(feed, title="bench")
    async with app.run_test(size=(120, 40)) as pilot:
        while not feed.done:
            await pilot.pause(0.02)
        return time.monotonic() - clock.first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--span", type=float, default=0.4, help="trace length, seconds (default 0.4)")
    p.add_argument("--events", type=int, default=200_000, help="events in the load-time trace (default 200000)")
    args = p.parse_args()
    big = trace(args.events / 4 * 0.01e-3, every_ms=0.01)  # two ranks, two events per op, one per 10 µs
    t0 = time.perf_counter()
    feed = ReplayFeed(big, speed=None)
    t1 = time.perf_counter()
    feed.timeline_done.wait()
    t2 = time.perf_counter()
    n = sum(len(b.events) for b in big)
    print(f"replay of {n:,} events: ready to draw after {t1 - t0:.2f} s, diagnoses on its timeline "
          f"(found on a thread) after {t2 - t0:.2f} s")
    clock = FirstRead()
    feed = ReplayFeed(trace(args.span), speed=None, name="bench", clock=clock)
    print(f"default speed for a {args.span:g} s trace: {feed.speed:.3g}x")
    print(f"a {args.span:g} s trace played for {asyncio.run(play(feed, clock)):.1f} s")


if __name__ == "__main__":
    main()
