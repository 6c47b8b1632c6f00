"""Replay of a big trace: how long until it plays, how long its seek index takes,
what a seek costs once the index is in, and the memory all that needs.

    python bench/synth.py --ranks 256 --ops 20000 -o /tmp/t10m.cvz   # 10.24M events
    python bench/replay_open.py /tmp/t10m.cvz

"open" is what `commviz replay` does before the dashboard draws: the first pass over
the frames, each rank's last frame, the first events, the index started. Peak RSS is
this process's and, separately, the index process's (`ru_maxrss` of the children).
`--whole` opens the trace the way replay did before it streamed (loaded whole,
ordered in memory, every seek rebuilt from the start): run it with `PYTHONPATH` at
an older tree to measure that one.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from commviz.tui.feed import ReplayFeed
from commviz.view.snapshot import take_snapshot


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
    ap.add_argument("--whole", action="store_true", help="load the trace whole, as replay did before it streamed")
    args = ap.parse_args()

    t0 = time.perf_counter()
    if args.whole:
        from commviz.commands._trace import load_trace

        loaded = load_trace(args.path, note=False)
        feed = ReplayFeed(loaded.batches, cut_off=loaded.truncated, name=os.path.basename(args.path))
    else:
        from commviz.commands._trace import open_stream

        stream = open_stream(args.path, note=False)
        feed = ReplayFeed(stream, cut_off=stream.truncated, name=os.path.basename(args.path))
    feed.advance()
    take_snapshot(feed.model, feed.now_ns(), None, None)
    opened = time.perf_counter() - t0
    print(f"open: {opened:.2f} s to the first frame, RSS {rss_now()} ({os.path.getsize(args.path) >> 20} MiB)")
    if args.no_wait:
        getattr(feed, "close", lambda: None)()
        return
    feed.timeline_done.wait()  # the index's pass is over (before: the diagnoses' pass)
    indexed = time.perf_counter() - t0
    st = feed.index.state if getattr(feed, "index", None) is not None else None
    if st is not None and st.error:
        print(f"index failed: {st.error}")
    n_ck = len(st.checkpoints) if st is not None else 0
    on_disk = sum(os.path.getsize(ck.file) for ck in st.checkpoints) >> 20 if st is not None else 0
    print(f"index: {indexed:.1f} s after open began, {feed.total} events, {n_ck} checkpoints "
          f"({on_disk} MiB on disk), RSS {rss_now()}")
    for f in (float(x) for x in args.seeks.split(",")):
        t = time.perf_counter()
        feed.seek(f)
        take_snapshot(feed.model, feed.now_ns(), None, None)
        print(f"seek to {f:.0%}: {time.perf_counter() - t:.2f} s ({feed.position} events in), RSS {rss_now()}")
    getattr(feed, "close", lambda: None)()
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"peak RSS: replay {mb(own)}, index process {mb(child)}")
    print(f"opened in {opened:.2f} s; seeks through {n_ck} checkpoints")


if __name__ == "__main__":
    main()
