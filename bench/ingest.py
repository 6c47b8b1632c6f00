"""Live ingest: N synthetic ranks in a few processes send ring all_reduce events
through the real client (transport/client.py) to the real server and model
(watcher.LiveFeed), as fast as they can or at `--rate`. Every event carries the
sender's clock at the moment it was sent, so the watcher's lag is real.

    python bench/ingest.py --ranks 64 [--seconds 10] [--procs 2] [--rate 0] [--record TRACE]

Prints what was sent, dropped at the client (zmq queue full) or shed by the
server (its inbox full: the watcher fell behind), ingested, and — last line, the figure — ingested events/s and the lag
(now minus the newest event's time, at the end of the run).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.events import GroupDef, Hello, OpEnd, OpStart, encode_batch  # noqa: E402

STEPS_PER_FRAME = 64  # all_reduce steps per frame: 128 events, ~ a probe flush at 6k ops/s
# A client (zmq context and socket, one connection, as a relay's) carries 8 ranks'
# frames, as a node's relay does, or more where that would open more than CLIENTS
# connections (its ranks are every other rank: the producers share them out). The
# server sheds a connection's frames past FLOOD_FRAMES_PER_S (2,000 a second): with 16
# ranks a client, 64 ranks were 4 connections, and what this measured there was that
# limit (4 × 2,000 × 128 = 1.02M events/s), not the watcher.
RANKS_PER_NODE = 8
CLIENTS = 64


def ranks_per_client(world: int) -> int:
    return max(RANKS_PER_NODE, -(-world // CLIENTS))


def producer(addr: str, ranks: list[int], world: int, seconds: float, rate: float, go, out) -> None:
    from commviz.transport.client import Client

    per = ranks_per_client(world)
    clients = [Client(addr, f"bench-{ranks[i]}".encode()) for i in range(0, len(ranks), per)]
    wall, mono = time.time_ns(), time.monotonic_ns()
    for i, r in enumerate(ranks):
        h = Hello(rank=r, local_rank=r % 8, world_size=world, host=f"node{r // 8}", pid=os.getpid() * 10_000 + r,
                  backend="gloo", device="cpu", torch_version="2.13.0", commviz_version="0.1.0", job="ingest",
                  mono_ns=mono, wall_ns=wall)
        while not clients[i // per].send(encode_batch(r, [h, GroupDef("0", list(range(world)), "gloo")])):
            time.sleep(0.01)
    go.wait()
    shape = [1 << 20]
    sent = dropped = 0
    seq = 0
    t_end = time.monotonic() + seconds
    per_s = rate / max(1, world) * len(ranks)  # this process's share, events/s
    t0 = time.monotonic()
    while time.monotonic() < t_end:
        for i, r in enumerate(ranks):
            c = clients[i // per]
            if not c.writable():  # zmq's queue is full: counted, not encoded (a probe asks first too)
                dropped += 2 * STEPS_PER_FRAME
                continue
            now = time.monotonic_ns()
            evs = []
            for k in range(seq, seq + STEPS_PER_FRAME):
                evs.append(OpStart(k, now, "all_reduce", "0", k, 4 << 20, "float32", shape))
                evs.append(OpEnd(k, now + 1000))
            if c.send(encode_batch(r, evs)):
                sent += len(evs)
            else:
                dropped += len(evs)
        seq += STEPS_PER_FRAME
        for c in clients:  # take the acks, or the window's list grows a tag per frame
            c.poll()  # (its room is not waited for: these producers model zmq flat out)
        if per_s:
            ahead = (sent + dropped) / per_s - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    out.put((sent, dropped))
    time.sleep(0.5)  # let zmq hand over what it queued
    for c in clients:
        c.close()


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by its Python name
    where it is a Python thread (zmq's io thread is not: "other")."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "other")
        out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / tick
    return out


def run(ranks: int, seconds: float, procs: int, rate: float, record: str | None = None) -> dict:
    from commviz.watcher import LiveFeed

    addr = f"ipc://{tempfile.mkdtemp(prefix='cvz-ingest-')}/w.sock"
    feed = LiveFeed(addr, record_to=record).start()
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    parts = [list(range(ranks))[i::procs] for i in range(procs)]
    ps = [ctx.Process(target=producer, args=(addr, p, ranks, seconds, rate, go, out)) for p in parts if p]
    for p in ps:
        p.start()
    while True:
        feed.drain()  # every frame that has arrived, into the model
        with feed.lock:
            if len(feed.model.ranks) >= ranks:
                base = feed.model.events
                break
        time.sleep(0.05)
    t0 = time.monotonic()
    cpu0 = time.process_time()
    threads0 = thread_cpu()
    go.set()
    time.sleep(seconds)
    feed.drain()
    with feed.lock:
        got = feed.model.events - base
        lag_s = (time.time_ns() - feed.model.last_t) / 1e9
    threads = {k: v - threads0.get(k, 0.0) for k, v in thread_cpu().items()}
    shed = feed.server.shed_frames
    dt = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    sent = dropped = 0
    for _ in ps:
        s, d = out.get()
        sent, dropped = sent + s, dropped + d
    for p in ps:
        p.join()
    feed.close()
    return {"ingested": got, "seconds": dt, "cpu": cpu, "sent": sent, "dropped": dropped, "lag_s": lag_s,
            "shed_frames": shed, "threads": threads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--procs", type=int, default=2, help="producer processes")
    ap.add_argument("--rate", type=float, default=0.0, help="events/s all ranks together (0: as fast as they can)")
    ap.add_argument("--record", metavar="TRACE", help="also record what the watcher took (bench/flood_replay.py)")
    a = ap.parse_args(argv)
    r = run(a.ranks, a.seconds, a.procs, a.rate, a.record)
    print(f"sent {r['sent']} events, dropped at the client {r['dropped']}, frames shed by the server "
          f"{r['shed_frames']} (both: the watcher fell behind)")
    print(f"watcher cpu {r['cpu']:.1f} s in {r['seconds']:.1f} s: {r['ingested'] / max(r['cpu'], 1e-9):,.0f} events per cpu-second")
    print("  by thread: " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(r["threads"].items(), key=lambda kv: -kv[1])
                                      if v >= 0.05))
    print(f"{a.ranks} ranks: {r['ingested'] / r['seconds']:,.0f} events/s ingested, lag {r['lag_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
