"""The watcher's ingest without the wire: frames as `bench/ingest.py`'s producers
encode them (ring all_reduce, a rank's frame holding `--steps` of them), decoded and
put into a live model (flows on) in one process, one thread. Separates what the
model and the decoder cost from what zmq, the server and the GIL cost.

    python bench/ingest_model.py --ranks 64 [--rounds 40] [--steps 64] [--mode batches|each|decode|decode-kept]
                                 [--decoder columns|objects] [--drop P] [--shed] [--keep-heap]

Modes: `batches` queues decoded frames and hands them on as `watcher.LiveFeed` does
(`Model.ingest`, `DRAIN_EVENTS` at a time, the unsettled tail carried to the
next); `each` puts every event in on its own (`Model.ingest`); `decode` only decodes,
each frame freed at once; `decode-kept` decodes and keeps `DRAIN_EVENTS` events alive,
as the queue does. `--decoder columns` (the watcher's: `model.store.decode_frame`,
frames read straight into columns, joined into an `EventStore`) or `objects`
(msgspec Structs, as before). `--drop P`: a share P of the op frames never arrives (a
client's queue full), as when producers outrun the watcher. `--shed`: as a watcher past its lag bound
(model/overload.py). Last line: events per
CPU-second.
"""

from __future__ import annotations

import argparse
import random
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.events import GroupDef, Hello, OpEnd, OpStart, batch_len, decode_batch, encode_batch  # noqa: E402
from commviz.model.state import Model  # noqa: E402
from commviz.model.store import EventStore, decode_frame  # noqa: E402
from commviz.watcher import DRAIN_EVENTS  # noqa: E402


def frames(world: int, rounds: int, steps: int) -> tuple[list[bytes], list[bytes]]:
    mono, wall = time.monotonic_ns(), time.time_ns()
    hellos = [encode_batch(r, [Hello(r, r % 8, world, f"node{r // 8}", 10_000 + r, "gloo", "cpu", "2.13.0", "0.1.0",
                                     "bench", mono, wall), GroupDef("0", list(range(world)), "gloo")])
              for r in range(world)]
    out, seq = [], 0
    for _ in range(rounds):
        for r in range(world):
            now = mono + 1000 * seq + 10 * r
            evs = []
            for k in range(seq, seq + steps):
                at = now + 2000 * (k - seq)
                evs += [OpStart(k, at, "all_reduce", "0", k, 4 << 20, "float32", [1 << 20]), OpEnd(k, at + 1000)]
            out.append(encode_batch(r, evs))
        seq += steps
    return hellos, out


def run(world: int, rounds: int, steps: int, mode: str, decoder: str = "columns",
        drop: float = 0.0, shed: bool = False) -> tuple[int, float]:
    hellos, data = frames(world, rounds, steps)
    if drop:
        rng = random.Random(0)
        data = [f for f in data if rng.random() >= drop]
    m = Model()
    for f in hellos:
        b = decode_batch(f)
        for ev in b.events:
            m.ingest(b.rank, ev)
    n = sum(len(decode_batch(f).events) for f in data)
    m.shed = shed  # a watcher past its lag bound: per-event detail shed (model/overload.py)
    decode = decode_frame if decoder == "columns" else decode_batch
    t0 = time.process_time()
    if mode == "decode":
        for f in data:
            decode(f)
    elif mode == "decode-kept":
        kept, held = [], 0
        for f in data:
            b = decode(f)
            kept.append(b)
            held += batch_len(b)
            if held >= DRAIN_EVENTS:
                kept, held = [], 0
    elif mode == "each":
        for f in data:
            b = decode(f)
            for ev in b.events:
                m.ingest(b.rank, ev)
    elif decoder == "columns":  # as watcher.LiveFeed drains
        queue, held, carry = [], 0, EventStore.join([])
        for f in data:
            b = decode(f)
            queue.append(b)
            held += batch_len(b)
            if held >= DRAIN_EVENTS:
                store = EventStore.join([carry, *queue])
                done = m.ingest(store.rank, store, settle=not shed)  # as LiveFeed: no carry while shedding
                queue, held, carry = [], 0, store[done:]
        store = EventStore.join([carry, *queue])
        m.ingest(store.rank, store)
    else:
        ranks: list[int] = []
        events: list = []
        for f in data:
            b = decode_batch(f)
            ranks += [b.rank] * len(b.events)
            events += b.events
            if len(events) >= DRAIN_EVENTS:
                done = m.ingest(ranks, events, settle=True)
                ranks, events = ranks[done:], events[done:]
        m.ingest(ranks, events)
    cpu = time.process_time() - t0
    if mode in ("each", "batches"):
        assert m.events == n + 2 * world, (m.events, n)
    return n, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=40, help="rounds of frames, one per rank each")
    ap.add_argument("--steps", type=int, default=64, help="all_reduce steps per frame (bench/ingest.py: 64)")
    ap.add_argument("--mode", choices=("batches", "each", "decode", "decode-kept"), default="batches")
    ap.add_argument("--decoder", choices=("columns", "objects"), default="columns")
    ap.add_argument("--drop", type=float, default=0.0, help="share of op frames lost on the way")
    ap.add_argument("--shed", action="store_true", help="as a watcher too far behind: per-event detail shed")
    ap.add_argument("--keep-heap", action="store_true",
                    help="glibc told to keep freed heap, as the watcher's server does (transport/server.keep_heap)")
    args = ap.parse_args()
    if args.keep_heap:
        from commviz.transport.server import keep_heap

        if not keep_heap():
            raise SystemExit("--keep-heap: glibc's mallopt is not here (or COMMVIZ_KEEP_HEAP=0)")
    n, cpu = run(args.ranks, args.rounds, args.steps, args.mode, args.decoder, args.drop, args.shed)
    lost = f", {args.drop:.1%} of frames lost" if args.drop else ""
    lost += ", detail shed" if args.shed else ""
    lost += ", heap kept" if args.keep_heap else ""
    print(f"{args.ranks} ranks, {args.steps} steps a frame, {args.mode}, {args.decoder}{lost}: {n:,} events in {cpu:.2f} s CPU: "
          f"{n / cpu:,.0f} events per cpu-second")


if __name__ == "__main__":
    main()
