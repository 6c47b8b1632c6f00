"""A recorded flood into a model, in the watcher's batches, in one thread: what the
ingest thread's model costs on the frames a flooded watcher actually took, apart from
the wire and the box's other processes.

    python bench/ingest.py --ranks 64 --seconds 6 --record /tmp/flood.cvz
    python bench/flood_replay.py /tmp/flood.cvz [--shed] [--frames 1500]

Frames are decoded into columns first (not timed), then handed to `Model.ingest`
`--frames` at a time with the unsettled tail carried, as `LiveFeed._drain_locked`
does; `--shed`: as a watcher shedding detail (from the second batch on, as a spell
begins). Last line: events per CPU-second of the ingest.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.model.state import Model  # noqa: E402
from commviz.model.store import EventStore, decode_frame  # noqa: E402
from commviz.trace.file import Loaded, iter_frames  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--shed", action="store_true", help="as a watcher shedding detail")
    ap.add_argument("--frames", type=int, default=1500, help="frames a batch (~190k events of 128-event frames)")
    a = ap.parse_args(argv)
    frames = [decode_frame(p) for _, p in iter_frames(a.trace, Loaded())]
    m = Model()
    carry, done_total, batches = EventStore.join([]), 0, 0
    c0 = time.process_time()
    for lo in range(0, len(frames), a.frames):
        q = frames[lo:lo + a.frames]
        events = EventStore.join([carry, *q] if len(carry) else q)
        if batches and a.shed:
            m.shed = True
        done = m.ingest(events.rank, events, settle=not m.shed)
        carry, done_total, batches = events[done:], done_total + done, batches + 1
    cpu = time.process_time() - c0
    print(f"{len(frames)} frames, {batches} batches{', shedding' if a.shed else ''}; "
          f"open instances at the end {len(m.pending)}")
    print(f"{done_total:,} events in {cpu:.2f} s CPU: {done_total / max(cpu, 1e-9):,.0f} events per cpu-second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
