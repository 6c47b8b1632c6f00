"""Export a trace to the Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open: one process per rank, one track per group, each op a slice
with its bytes, sequence number and peer/root, marks as instants, and the hang of
an op that never finished drawn up to the end of the trace."""

from __future__ import annotations

from commviz.events import Batch, Hello, Mark, OpEnd, OpStart


def to_chrome_trace(batches: list[Batch]) -> dict:
    offsets: dict[int, int] = {}
    hosts: dict[int, str] = {}
    for b in batches:
        for e in b.events:
            if isinstance(e, Hello):
                offsets[b.rank] = e.wall_ns - e.mono_ns
                hosts[b.rank] = e.host
    starts: dict[tuple[int, int], OpStart] = {}
    ends: dict[tuple[int, int], OpEnd] = {}
    marks: list[tuple[int, Mark]] = []
    latest: dict[int, int] = {}  # newest timestamp per rank, heartbeats and stacks included
    for b in batches:
        for e in b.events:
            t = getattr(e, "t", None)
            if t is not None and t > latest.get(b.rank, -1):
                latest[b.rank] = t
            if isinstance(e, OpStart):
                starts.setdefault((b.rank, e.id), e)
            elif isinstance(e, OpEnd):
                ends.setdefault((b.rank, e.id), e)
            elif isinstance(e, Mark):
                marks.append((b.rank, e))
    if not starts and not marks:
        return {"traceEvents": [], "displayTimeUnit": "ms"}

    def us(rank: int, t: int) -> float:
        return (t + offsets.get(rank, 0)) / 1e3

    last = max(us(r, t) for r, t in latest.items())  # where unfinished ops are drawn to
    events: list[dict] = []
    tids: dict[tuple[int, str], int] = {}
    for rank in sorted({r for r, _ in starts} | {r for r, _ in marks}):
        events.append({"ph": "M", "pid": rank, "name": "process_name",
                       "args": {"name": f"rank {rank}" + (f" ({hosts[rank]})" if rank in hosts else "")}})
        events.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
    for (rank, op_id), s in sorted(starts.items(), key=lambda kv: (kv[0][0], kv[1].t)):
        key = (rank, s.group)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == rank]) + 1
            events.append({"ph": "M", "pid": rank, "tid": tids[key], "name": "thread_name",
                           "args": {"name": f"group {s.group}"}})
        e = ends.get((rank, op_id))
        t0 = us(rank, s.t)
        args = {"bytes": e.bytes if e is not None and e.bytes >= 0 else s.bytes, "seq": s.seq, "dtype": s.dtype}
        if s.peer >= 0 or (e is not None and e.peer >= 0):
            args["peer"] = e.peer if e is not None and e.peer >= 0 else s.peer
        if s.root >= 0:
            args["root"] = s.root
        if e is None:
            args["unfinished"] = "never ended in this trace"
        elif e.error:
            args["error"] = e.error
        events.append({"ph": "X", "pid": rank, "tid": tids[key], "name": f"{s.op} #{s.seq}", "cat": s.op,
                       "ts": t0, "dur": max(0.0, (us(rank, e.t) if e is not None else last) - t0), "args": args})
    for rank, m in marks:
        events.append({"ph": "i", "pid": rank, "tid": 0, "s": "p", "name": m.text, "ts": us(rank, m.t)})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
