"""The probe's added cost per op in CPU instructions, which a shared box does not
move: the same loop as bench/overhead.py (fake backend, a flush every 2,000 calls on
the calling thread) run under valgrind's callgrind at two lengths, the difference
divided by the extra calls, for the bare op, the minimal recorder (two clock reads
and one tuple append) and the instrumented op. Slow: each run is a few minutes
under valgrind; the two lengths of one mode run at once.

    python bench/overhead_instructions.py [--op all_reduce|send|all_gather_into_tensor] [--modes bare,minimal,probe,probe+ring]
    python bench/overhead_instructions.py --parts probe+ring   # where the instructions go, per call

`probe+ring` is the probe with its crash ring on (in a temporary directory), as it
is with COMMVIZ_TRACE_DIR.

Compare trees by running it with each on PYTHONPATH. Instructions are not time (a
cache miss costs more than an add), but a change that removes work shows here
whatever the box is doing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SHORT, LONG = 1000, 5000
FLUSH_EVERY = 2000


def loop(mode: str, n: int, op: str) -> None:
    """The measured process: set up, warm up, then `n` calls of `op` in `mode`."""
    import collections
    import time

    import torch
    import torch.distributed as dist

    from overhead import stopped_fake_probe

    probe, sender, suspended = stopped_fake_probe(stop_sampler=True)  # flushed here, every FLUSH_EVERY calls
    if mode == "probe+ring":
        import dataclasses

        os.environ["COMMVIZ_RING_DIR"] = tempfile.mkdtemp()
        probe.shutdown()
        probe.cfg = dataclasses.replace(probe.cfg, ring=True)
        probe.ensure_started()
        sender = probe.sender
        sender._stop.set()
        sender._wake.set()
        sender.thread.join()
        if probe.sampler is not None:
            probe.sampler.stop()
        assert probe.ring_start is not None
    x, out = torch.ones(256), torch.empty(1024)
    fn, fargs = {"all_reduce": (dist.all_reduce, (x,)), "send": (dist.send, (x, 1)),
                 "all_gather_into_tensor": (dist.all_gather_into_tensor, (out, x))}[op]
    for _ in range(200):
        fn(*fargs)
    sender.flush()
    orig, clock, q = fn._commviz_original, time.monotonic_ns, collections.deque()
    app = q.append

    def minimal(*args, **kwargs):
        t0 = clock()
        r = orig(*args, **kwargs)
        app((t0, clock()))
        return r

    call = {"bare": orig, "minimal": minimal, "probe": fn, "probe+ring": fn}[mode]
    with suspended() if not mode.startswith("probe") else _nothing():
        for i in range(n):
            call(*fargs)
            if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                q.clear()
                sender.flush()
        sender.flush()
    os._exit(0)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def instructions(mode: str, op: str) -> float:
    """Instructions per call in `mode`: two runs at once, their difference, counted on
    the calling thread alone (it does the flushes too). Other threads — zmq's I/O
    thread retrying its connection, say — work per second of wall time, and under
    valgrind a longer run lasts minutes longer: counting them made the figure move by
    thousands of instructions per call with the box's load."""
    py = os.path.realpath(sys.executable)
    out = tempfile.mkdtemp()
    procs = []
    for n in (SHORT, LONG):
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}/cg.{n}", py,
               __file__, "--loop", mode, str(n), "--op", op]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    counts = []
    for n, p in zip((SHORT, LONG), procs):
        _, err = p.communicate()
        main_thread = f"{out}/cg.{n}-01"
        if not os.path.exists(main_thread):
            raise SystemExit(f"valgrind wrote no count:\n{err[-2000:]}")
        with open(main_thread) as f:
            m = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
        counts.append(int(m.group(1)))
    shutil.rmtree(out, ignore_errors=True)
    return (counts[1] - counts[0]) / (LONG - SHORT)


# (label, function, callees): the inclusive cost of `function`, less that of each
# "-callee" and, if a callee has no sign, only that callee's; per call
PARTS = [
    ("the C wrapper: checks, group, seq, op id, clock, records, queue", "fw_vectorcall",
     ["-PyObject_Vectorcall", "-PyObject_GetAttr", "-tensor_field"]),  # torch's function, the ring's writers; the reads
    ("  its tensor reads for the ring (nbytes, dtype, shape: torch's getters)", "fw_vectorcall", ["tensor_field"]),
    ("  the ring's start: the slot packed and written", "sw_start", []),
    ("  the ring's end: stamped", "sw_end", []),
    ("the sender's drain (in flight, tensor fields)", "fast_drain", []),
    ("the frame's encoding", "encode_batch", []),
]
PARTS_N = 20_000


def parts(mode: str, op: str) -> None:
    """One long run under callgrind, and the inclusive cost of each part above per
    call; what is left of the probe's total (the `instructions` figure less the bare
    op's) is Python: the flush's own code, the records' allocation and freeing."""
    py = os.path.realpath(sys.executable)
    out = tempfile.mkdtemp()
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}/cg", py,
           __file__, "--loop", mode, str(PARTS_N), "--op", op]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    tree = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--tree=calling", "--threshold=100",
                           f"{out}/cg-01"], capture_output=True, text=True).stdout
    shutil.rmtree(out, ignore_errors=True)
    print_parts(tree, PARTS_N + 200)  # and the warm-up


def print_parts(tree: str, calls: int) -> None:
    for label, fn, callees in PARTS:
        m = re.search(rf"^ *([\d,]+) \([ \d.]+%\)  \*  \S*:{fn} \[.*?(?=^\s*$)", tree, re.M | re.S)
        if m is None:
            print(f"{label:<72} {'-':>7}")
            continue
        total = int(m.group(1).replace(",", ""))
        for callee in callees:
            c = re.search(rf"^ *([\d,]+) \([ \d.]+%\)  >   \S*:{callee.lstrip('-')} ", m.group(0), re.M)
            cost = int(c.group(1).replace(",", "")) if c else 0
            total = total - cost if callee.startswith("-") else cost
        print(f"{label:<72} {total / calls:>7,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="all_reduce")
    ap.add_argument("--modes", default="bare,minimal,probe", help="probe alone: another tree's probe, same bare")
    ap.add_argument("--parts", metavar="MODE", help="where the instructions of MODE go, per call")
    ap.add_argument("--loop", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        loop(args.loop[0], int(args.loop[1]), args.op)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    if args.parts:
        parts(args.parts, args.op)
        return
    for mode in args.modes.split(","):
        print(f"{args.op}, {mode}: {instructions(mode, args.op):,.0f} instructions per call", flush=True)


if __name__ == "__main__":
    main()
