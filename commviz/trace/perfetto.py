"""Export a trace to the Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open: one process per rank, one track per group, each op a slice
with its bytes, sequence number and peer/root, marks as instants, and the hang of
an op that never finished drawn up to the end of the trace.

It reads the model (made with `keep_ops=True` and fed the whole trace): the pairing of
starts and ends, the clock offsets and what never finished are the model's answers,
the same ones `summary` and `replay` give."""

from __future__ import annotations

from commviz.model.state import Model, PairedOp


def to_chrome_trace(model: Model) -> dict:
    ops = model.paired_ops()
    if not ops and not model.marks:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    events: list[dict] = []
    for rank in sorted({p.rank for p in ops} | {r for _, r, _ in model.marks}):
        r = model.ranks.get(rank)
        host = f" ({r.hello.host})" if r is not None and r.hello is not None else ""
        events.append({"ph": "M", "pid": rank, "name": "process_name", "args": {"name": f"rank {rank}{host}"}})
        events.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
    tids: dict[tuple[int, str], int] = {}
    for p in ops:
        key = (p.rank, p.start.group)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == p.rank]) + 1
            events.append({"ph": "M", "pid": p.rank, "tid": tids[key], "name": "thread_name",
                           "args": {"name": f"group {p.start.group}"}})
        events.append(_slice(p, tids[key]))
    for t, rank, text in model.marks:
        events.append({"ph": "i", "pid": rank, "tid": 0, "s": "p", "name": text, "ts": t / 1e3})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _slice(p: PairedOp, tid: int) -> dict:
    s, e = p.start, p.end
    args: dict = {"bytes": e.bytes if e is not None and e.bytes >= 0 else s.bytes, "seq": s.seq, "dtype": s.dtype}
    if s.peer >= 0 or (e is not None and e.peer >= 0):
        args["peer"] = e.peer if e is not None and e.peer >= 0 else s.peer
    if s.root >= 0:
        args["root"] = s.root
    if e is None:
        args["unfinished"] = "never ended in this trace"
    elif e.error:
        args["error"] = e.error
    t0 = p.t0 / 1e3
    return {"ph": "X", "pid": p.rank, "tid": tid, "name": f"{s.op} #{s.seq}", "cat": s.op,
            "ts": t0, "dur": max(0.0, p.t1 / 1e3 - t0), "args": args}
