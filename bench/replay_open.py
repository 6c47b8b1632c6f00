"""Replay of a big trace: how long until it plays, how long its seek index takes,
what a seek costs once the index is in, and the memory all that needs.

    python bench/synth.py --ranks 256 --ops 20000 -o /tmp/t10m.cvz   # 10.24M events
    python bench/replay_open.py /tmp/t10m.cvz

"open" is what `commviz replay` does before the dashboard draws: the first pass over
the frames, each rank's last frame, the first events, the index started. Peak RSS is
this process's and, separately, the index process's (`ru_maxrss` of the children).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from commviz.commands._trace import open_stream  # noqa: E402
from commviz.tui.feed import ReplayFeed  # noqa: E402
from commviz.tui.snapshot import take_snapshot  # noqa: E402


def mb(kb: int) -> str:
    return f"{kb / 1024:.0f} MB"


def rss_now() -> str:
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    return f"{mb(now)} (peak {mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--seeks", default="0.9,0.1,0.5,0.75,0.25,1.0",
                    help="fractions to seek to once the index is in")
    ap.add_argument("--no-wait", action="store_true", help="report the open and stop")
    args = ap.parse_args()

    t0 = time.perf_counter()
    stream = open_stream(args.path, note=False)
    feed = ReplayFeed(stream, cut_off=stream.truncated, name=os.path.basename(args.path))
    feed.advance()
    take_snapshot(feed.model, feed.now_ns(), None, None)
    opened = time.perf_counter() - t0
    print(f"open: {opened:.2f} s to the first frame, RSS {rss_now()} ({len(stream.ranks)} ranks, {stream.total_bytes >> 20} MiB)")
    if args.no_wait:
        feed.close()
        return
    feed.index.done.wait()
    indexed = time.perf_counter() - t0
    st = feed.index.state
    if st.error:
        print(f"index failed: {st.error}")
    print(f"index: {indexed:.1f} s after open began, {st.total} events, {len(st.checkpoints)} checkpoints, "
          f"RSS {rss_now()}")
    for f in (float(x) for x in args.seeks.split(",")):
        t = time.perf_counter()
        feed.seek(f)
        take_snapshot(feed.model, feed.now_ns(), None, None)
        print(f"seek to {f:.0%}: {time.perf_counter() - t:.2f} s ({feed.position} events in), RSS {rss_now()}")
    feed.close()
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"peak RSS: replay {mb(own)}, index process {mb(child)}")
    print(f"opened in {opened:.2f} s; seeks through {len(st.checkpoints)} checkpoints")


if __name__ == "__main__":
    main()
