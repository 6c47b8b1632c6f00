"""A local flood against a watcher, to check its memory bound and its rejection rate.

A watcher (LiveFeed + the dashboard headless, in its own process) listens on a private
ipc socket (or tcp loopback with --tcp); flooder processes open PEERS connections and
send as fast as zmq takes them for SECONDS, then stop by themselves. The watcher keeps
running a moment after the flood (to drain), then reports what it read, what it turned
away, and its peak RSS (ru_maxrss) and its RSS at the end.

    python bench/flood.py [--peers 50] [--seconds 4] [--mix random|hostile|big] [--tcp] [--no-dashboard]
                          [--min-rejected N] [--stall S] [--pyzmq]

Mixes: `random` is random 64-byte frames (the cheapest frame to send, so the most
frames per second); `hostile` adds deeply nested msgpack, multi-part messages, 1 MB
frames of garbage and a 20 MB frame per peer (over the size limit); `big` is only
garbage frames of the largest size the watcher takes (MAX_WIRE_FRAME, 128 KiB: the
worst case for its memory).

Floods are local only (ipc or 127.0.0.1), bounded in count and time (never more than
60 s; --min-rejected makes a flood last until the watcher has turned away that many
frames, for a loaded box where the flood is slow to arrive). The last line
is the figure: peers, frames/s sent, frames/s rejected, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLOODERS = 2  # processes sending; peers are split between them


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _counters(feed) -> dict:
    """What the watcher read and turned away; getattr so that older code (main) runs too."""
    s = feed.server
    if hasattr(s, "rejected"):  # per-peer tallies
        rejected, shed = s.bad_frames + s.refused, s.shed_frames
    else:
        rejected, shed = s.bad_frames + sum(s.flooded.values()) + s.refused, 0
    conns = getattr(s, "conns", None)  # connection cap and eviction (older code has none)
    return {"frames": s.frames, "rejected": rejected, "shed": shed, "denied": getattr(s, "denied", 0),
            "turned_away": getattr(conns, "turned_away", 0), "evicted": getattr(conns, "evicted", 0)}


CAP_S = 60.0  # no flood runs longer than this, whatever else is asked


def _stall(server, stall_s: float) -> None:
    """The reader takes nothing for `stall_s` from the first frame on, as a watcher whose
    reader is starved: zmq's queues fill to whatever bounds them."""
    drain, until = server._drain, []

    def stalled() -> bool:
        if not until:
            until.append(time.monotonic() + stall_s)
        if time.monotonic() < until[0]:
            time.sleep(0.01)
            return False
        return drain()

    server._drain = stalled


def watcher(addr: str, seconds: float, settle: float, min_rejected: int, stop_file: str,
            dashboard: bool, token: str | None, stall_s: float = 0.0, pyzmq: bool = False) -> None:
    """The watcher process: listen, say 'ready'; once the flood has run `seconds` and
    it has turned away `min_rejected` frames (or CAP_S passed), create `stop_file` (the
    flooders stop on it), run `settle` more seconds, print one JSON line."""
    from commviz.watcher import LiveFeed

    kw = {"token": token} if token else {}
    feed = LiveFeed(addr, **kw)
    if pyzmq:  # the reader loop without its C part, to compare in one run
        from commviz.transport import reader

        feed.server._read = reader.reader(feed.server._sock, prefer_c=False)
    feed.start()
    if stall_s:
        _stall(feed.server, stall_s)
    peak = [_rss_mb()]
    busy = [0.0, 0.0, 0]  # first and last time the rejected count moved, and that count
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], _rss_mb())
            try:
                n = _counters(feed)["rejected"]
            except RuntimeError:  # a dict resized under us (older code): next time
                continue
            if n != busy[2]:
                busy[0] = busy[0] or time.monotonic()
                busy[1], busy[2] = time.monotonic(), n

    def flood_over(t0: float) -> bool:
        """`seconds` count from the first frame turned away (flooders take a while to start)."""
        now = time.monotonic()
        return now - t0 >= CAP_S or (busy[0] > 0 and now - busy[0] >= seconds and busy[2] >= min_rejected)

    threading.Thread(target=sample, daemon=True).start()
    base = _rss_mb()
    if dashboard:
        import asyncio

        from commviz.tui.app import WatchApp

        async def run() -> None:
            app = WatchApp(feed, title="flood")
            async with app.run_test(size=(160, 50)) as pilot:
                print("ready", flush=True)
                t0 = time.monotonic()
                while not flood_over(t0):
                    await pilot.pause(0.05)
                open(stop_file, "w").close()
                await pilot.pause(settle)

        asyncio.run(run())
    else:
        print("ready", flush=True)
        t0 = time.monotonic()
        while not flood_over(t0):
            time.sleep(0.05)
        open(stop_file, "w").close()
        time.sleep(settle)
    stop.set()
    end = _rss_mb()  # while still listening: what the watcher kept after the flood
    feed.close()
    out = _counters(feed)
    out.update(reject_s=max(busy[1] - busy[0], 0.02), base_mb=base, end_mb=end,
               peak_mb=max(peak[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3),
               reader_cpu_s=getattr(feed.server, "cpu_s", 0.0))
    print(json.dumps(out), flush=True)


def _frames(mix: str, rng: random.Random) -> list:
    """A pool of frames to cycle through (built once: the flooders measure zmq, not urandom)."""
    if mix == "big":
        try:
            from commviz.events import MAX_WIRE_FRAME as size
        except ImportError:  # older code
            size = 256 * 1024
        return [rng.randbytes(size) for _ in range(4)]
    pool = [rng.randbytes(64) for _ in range(256)]
    if mix == "hostile":
        nested = b"\x91" * 200_000 + b"\xc0"  # 200k nested one-element arrays
        batchish = b"\x93\x01\x00" + b"\x91" * 50_000 + b"\xc0"  # a batch whose events nest
        pool += [nested, batchish, [b"two", b"parts"], [b"a", b"b", b"c"], rng.randbytes(1 << 20)]
    return pool


def flooder(addr: str, peers: int, stop_file: str, mix: str, token: str | None, seed: int) -> None:
    import zmq

    rng = random.Random(seed)
    ctx = zmq.Context(io_threads=1)
    socks = []
    for i in range(peers):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, f"flood{seed}-{i}".encode())
        s.setsockopt(zmq.LINGER, 0)
        if token:
            s.setsockopt(zmq.PLAIN_USERNAME, b"commviz")
            s.setsockopt(zmq.PLAIN_PASSWORD, token.encode())
        s.connect(addr)
        socks.append(s)
    pool = _frames(mix, rng)
    time.sleep(0.3)  # connections up
    if mix == "hostile":
        huge = rng.randbytes(20 << 20)
        for s in socks:
            try:
                s.send(huge, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass
    sent = 0
    k = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < CAP_S and not os.path.exists(stop_file):
        for s in socks:
            for _ in range(64):
                f = pool[k % len(pool)]
                k += 1
                try:
                    if type(f) is list:
                        s.send_multipart(f, zmq.NOBLOCK)
                    else:
                        s.send(f, zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    break
    for s in socks:
        s.close(0)
    ctx.term()
    print(json.dumps({"sent": sent, "seconds": time.monotonic() - t0}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=4.0, help="flood duration (default 4)")
    ap.add_argument("--settle", type=float, default=2.0, help="watcher runs this long after the flood")
    ap.add_argument("--min-rejected", type=int, default=0,
                    help="flood on (at most 60 s) until the watcher has turned away this many frames")
    ap.add_argument("--mix", choices=("random", "hostile", "big"), default="random")
    ap.add_argument("--tcp", action="store_true", help="tcp://127.0.0.1 (with a token) instead of ipc")
    ap.add_argument("--no-dashboard", action="store_true")
    ap.add_argument("--stall", type=float, default=0.0,
                    help="the watcher's reader takes nothing for this long once frames arrive (zmq's queues fill)")
    ap.add_argument("--pyzmq", action="store_true",
                    help="the watcher reads through pyzmq, not its C loop (what an install without a compiler gets)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object (for tests)")
    ap.add_argument("--_watcher", help=argparse.SUPPRESS)
    ap.add_argument("--_flood", help=argparse.SUPPRESS)
    ap.add_argument("--_peers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_stop", help=argparse.SUPPRESS)
    ap.add_argument("--_seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    token = os.environ.get("FLOOD_TOKEN")
    if args._watcher:
        return watcher(args._watcher, args.seconds, args.settle, args.min_rejected, args._stop,
                       not args.no_dashboard, token, args.stall, args.pyzmq)
    if args._flood:
        return flooder(args._flood, args._peers, args._stop, args.mix, token, args._seed)

    tmp = tempfile.mkdtemp(prefix="commviz-flood-")
    os.chmod(tmp, 0o700)
    if args.tcp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        addr = f"tcp://127.0.0.1:{port}"
        os.environ["FLOOD_TOKEN"] = os.urandom(12).hex()
    else:
        addr = f"ipc://{tmp}/w.sock"
    me = [sys.executable, os.path.abspath(__file__)]
    stop = os.path.join(tmp, "stop")
    common = ["--_stop", stop, "--seconds", str(args.seconds), "--settle", str(args.settle), "--mix", args.mix,
              "--min-rejected", str(args.min_rejected)]
    dash = (["--no-dashboard"] if args.no_dashboard else []) + ["--stall", str(args.stall)] + (["--pyzmq"] if args.pyzmq else [])
    w = subprocess.Popen(me + ["--_watcher", addr] + common + dash, stdout=subprocess.PIPE, text=True)
    if w.stdout.readline().strip() != "ready":
        sys.exit("the watcher did not start")
    split = [args.peers // FLOODERS + (1 if i < args.peers % FLOODERS else 0) for i in range(FLOODERS)]
    fl = [subprocess.Popen(me + ["--_flood", addr, "--_peers", str(n), "--_seed", str(i)] + common,
                           stdout=subprocess.PIPE, text=True)
          for i, n in enumerate(split) if n]
    done = [json.loads(p.communicate(timeout=CAP_S + 60)[0]) for p in fl]
    sent = sum(d["sent"] for d in done)
    flood_s = max(d["seconds"] for d in done)
    got = json.loads(w.communicate(timeout=CAP_S + args.settle + 120)[0].strip().splitlines()[-1])
    if args.json:
        print(json.dumps(dict(got, peers=args.peers, sent=sent, seconds=flood_s)))
        return
    print(f"{os.cpu_count()} CPUs, {'tcp loopback + token' if args.tcp else 'ipc'}, mix {args.mix}, "
          f"reader {'pyzmq' if args.pyzmq else 'C'}, "
          f"dashboard {'off' if args.no_dashboard else 'on'}, {flood_s:.1f} s flood")
    print(f"connections: {got.get('turned_away', 0):,} refused over the cap, {got.get('evicted', 0):,} closed after a bad frame")
    print(f"watcher read {got['frames']:,} valid frames, turned away {got['rejected']:,}, shed {got['shed']:,}; "
          f"RSS {got['base_mb']:.0f} MB at start, {got['end_mb']:.0f} MB {args.settle:g} s after the flood")
    if got["reader_cpu_s"]:
        print(f"reader thread: {got['reader_cpu_s']:.2f} CPU s, {got['rejected'] / got['reader_cpu_s']:,.0f} "
              "frames rejected per CPU second (the rate on one core of its own)")
    print(f"peers {args.peers} · sent {sent / flood_s:,.0f} frames/s · rejected "
          f"{got['rejected'] / got['reject_s']:,.0f} frames/s · peak RSS {got['peak_mb']:.0f} MB")


if __name__ == "__main__":
    main()
