"""Export a trace to the Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open: one process per rank, one track per group, each op a slice
with its bytes, sequence number and peer/root, marks (and where commviz stopped the
job) as instants, and the hang of an op that never finished drawn up to the end of
the trace.

It reads the model (made with `keep_ops=True` and fed the whole trace): the pairing of
starts and ends, the clock offsets and what never finished are the model's answers,
the same ones `summary` and `replay` give.

Slices on one track must nest, so ops of a rank and group that overlap in time
(isend beside irecv, async collectives in flight together) go on extra tracks of
that group, "group G · lane k", sorted under it. A slice spans host time (call to
the end the probe saw); a CUDA op's GPU time is its `device_us` argument. Times are microseconds since the
trace's first whole second (`otherData.origin_wall_ns`): wall-clock microseconds
since 1970 are too big for a double to keep nanoseconds, and slices that touch would
seem to overlap."""

from __future__ import annotations

from commviz.model.state import Model, PairedOp
from commviz.trace.lanes import assign_lanes


SLICE_TIME = ("host: a slice runs from the call to when the probe saw the op end; "
              "args.device_us is the GPU time (CUDA events on the op's stream), which summary uses where present")


def to_chrome_trace(model: Model) -> dict:
    ops = model.paired_ops()
    instants = list(model.marks) + [(r.stopped.t + r.offset_ns, r.rank, r.stopped.text())
                                    for r in model.ranks.values() if r.stopped is not None]
    if not ops and not instants:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    origin = min([p.t0 for p in ops] + [t for t, _, _ in instants]) // 10**9 * 10**9
    events: list[dict] = []
    for rank in sorted({p.rank for p in ops} | {r for _, r, _ in instants}):
        r = model.ranks.get(rank)
        host = f" ({r.hello.host})" if r is not None and r.hello is not None else ""
        events.append({"ph": "M", "pid": rank, "name": "process_name", "args": {"name": f"rank {rank}{host}"}})
        events.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
    events += _slices(ops, origin)
    for t, rank, text in instants:
        events.append({"ph": "i", "pid": rank, "tid": 0, "s": "p", "name": text, "ts": _us(t - origin)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"origin_wall_ns": origin, "slice_time": SLICE_TIME}}


def _slices(ops: list[PairedOp], origin: int) -> list[dict]:
    """An "X" slice per op, on its (rank, group) track or, where it overlaps an
    earlier op of that track, on the first lane of the group where it fits."""
    by_track: dict[tuple[int, str], list[int]] = {}
    for k, p in enumerate(ops):
        by_track.setdefault((p.rank, p.start.group), []).append(k)
    lane_of = [0] * len(ops)
    for idx in by_track.values():
        for k, lane in zip(idx, assign_lanes([(ops[k].t0, ops[k].t1) for k in idx])):
            lane_of[k] = lane
    out: list[dict] = []
    tids: dict[tuple[int, str, int], int] = {}
    groups: dict[tuple[int, str], int] = {}  # per rank, the order its groups appear in
    for k, p in enumerate(ops):
        key = (p.rank, p.start.group, lane_of[k])
        if key not in tids:
            tids[key] = tid = len([t for t in tids if t[0] == p.rank]) + 1
            g = groups.setdefault(key[:2], len([x for x in groups if x[0] == p.rank]))
            name = f"group {p.start.group}" + (f" · lane {key[2] + 1}" if key[2] else "")
            out.append({"ph": "M", "pid": p.rank, "tid": tid, "name": "thread_name", "args": {"name": name}})
            out.append({"ph": "M", "pid": p.rank, "tid": tid, "name": "thread_sort_index",
                        "args": {"sort_index": g * 1000 + key[2]}})
        out.append(_slice(p, tids[key], origin))
    return out


def _slice(p: PairedOp, tid: int, origin: int) -> dict:
    s, e = p.start, p.end
    args: dict = {"bytes": e.bytes if e is not None and e.bytes >= 0 else s.bytes, "seq": s.seq, "dtype": s.dtype}
    if s.peer >= 0 or (e is not None and e.peer >= 0):
        args["peer"] = e.peer if e is not None and e.peer >= 0 else s.peer
    if s.root >= 0:
        args["root"] = s.root
    if s.is_async:
        args["async"] = True
    if e is None:
        args["unfinished"] = "never ended in this trace"
    elif e.error:
        args["error"] = e.error
    if e is not None:
        # The slice spans host time (call to the end the probe saw), so slices line up
        # with marks and other ranks; the GPU's own time, which summary's p50 and
        # busbw use where it is known, is an argument.
        if e.device_ns >= 0:
            args["device_us"] = _us(e.device_ns)
        if e.enqueue_ns >= 0:
            args["enqueue_us"] = _us(e.enqueue_ns)
        if e.captured:
            args["captured"] = "recorded into a CUDA graph: runs at each replay"
    return {"ph": "X", "pid": p.rank, "tid": tid, "name": f"{s.op} #{s.seq}", "cat": s.op,
            "ts": _us(p.t0 - origin), "dur": _us(max(0, p.t1 - p.t0)), "args": args}


def _us(t_ns: int) -> float:
    return round(t_ns / 1e3, 3)
