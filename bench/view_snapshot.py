"""What one remote view costs the collector: a dashboard snapshot (a feed's `fetch`)
of N synthetic ranks encoded as `commviz serve` answers `GET /view` (msgspec), and
read back as `watch --connect` reads it (commviz/viewlink.py). Best of `--rounds`.

    python bench/view_snapshot.py [--ranks 16,1024] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(ranks: int, rounds: int) -> tuple[int, float, float, float]:
    from commviz.view.feed import ViewQuery
    from commviz.view.snapshot import Fetched
    from commviz.viewlink import decode, encode
    from tests.tui.scenes import busy_ring

    feed = busy_ring(ranks, ops=5)
    take = dump = load = float("inf")
    size = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        got = feed.fetch(ViewQuery())
        t1 = time.perf_counter()
        body = encode(got)
        t2 = time.perf_counter()
        decode(body, Fetched)
        t3 = time.perf_counter()
        take, dump, load, size = min(take, t1 - t0), min(dump, t2 - t1), min(load, t3 - t2), len(body)
    return size, take, dump, load


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="16,1024")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    print("ranks  body KB  snapshot ms  encode ms  decode ms")
    for n in (int(x) for x in a.ranks.split(",")):
        size, take, dump, load = measure(n, a.rounds)
        print(f"{n:5d}  {size / 1024:7.0f}  {take * 1e3:11.1f}  {dump * 1e3:9.1f}  {load * 1e3:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
