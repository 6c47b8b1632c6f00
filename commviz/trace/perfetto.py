"""Export a trace to the Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open: one process per rank, one track per group, each op a slice
with its bytes, sequence number and peer/root, marks (and where commviz stopped the
job) as instants, and the hang of an op that never finished drawn up to the end of
the trace.

It reads the model: the pairing of starts and ends, the clock offsets and what never
finished are the model's answers, the same ones `summary` and `replay` give.

Slices on one track must nest, so ops of a rank and group that overlap in time
(isend beside irecv, async collectives in flight together) go on extra tracks of
that group, "group G · lane k", sorted under it. A slice spans host time (call to
the end the probe saw); a CUDA op's GPU time is its `device_us` argument. Times are microseconds since the
trace's first whole second (`otherData.origin_wall_ns`): wall-clock microseconds
since 1970 are too big for a double to keep nanoseconds, and slices that touch would
seem to overlap.

Two ways in, one output. `to_chrome_trace(model)` reads a model made with
`keep_ops=True` and fed the whole trace, and builds the document in memory.
`export_stream(stream, path)` (what `commviz export --perfetto` runs) feeds a model
from a `trace.stream` in bounded memory and writes each op as it ends
(`ChromeTraceWriter`, the model's `on_op` hook): the model keeps no op, the writer
only each track's lanes and the ops it holds back for a while (below). The two give
the same events — the same slices on the same lanes with the same names and sort
indexes, the same instants and metadata — in another order and, where tracks first
appear in another order, with other `tid` numbers (only ids: the viewers show the
thread names, ordered by `thread_sort_index`). Where they can differ, see
`ChromeTraceWriter`."""

from __future__ import annotations

import bisect
import json
from typing import TextIO

from commviz.model import traces
from commviz.model.state import Model, PairedOp
from commviz.trace.lanes import assign_lanes, take_lane

# Ops the streaming writer holds back at most, over all tracks, waiting for an op of
# their track that started before them and is still in flight (to give lanes in the
# order of starts, as `assign_lanes` does); past it the biggest tracks go out anyway.
HOLD_MAX = 65536
# Events written in one go (`json.dumps` of a list, one C call).
WRITE_EVERY = 4096


SLICE_TIME = ("host: a slice runs from the call to when the probe saw the op end; "
              "args.device_us is the GPU time (CUDA events on the op's stream), which summary uses where present")


def to_chrome_trace(model: Model) -> dict:
    ops = model.paired_ops()
    instants = list(model.marks) + [(r.stopped.t + r.offset_ns, r.rank, r.stopped.text())
                                    for r in model.ranks.values() if r.stopped is not None]
    if not ops and not instants:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    origin = min([p.t0 for p in ops] + [t for t, _, _ in instants]) // 10**9 * 10**9
    events = _processes(model, {p.rank for p in ops} | {r for _, r, _ in instants})
    events += _slices(ops, origin)
    events += [_instant(t, rank, text, origin) for t, rank, text in instants]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": _other(origin)}


def _processes(model: Model, ranks) -> list[dict]:
    """A process per rank, named by its host (from the hello the model has last)."""
    events: list[dict] = []
    for rank in sorted(ranks):
        r = model.ranks.get(rank)
        host = f" ({r.hello.host})" if r is not None and r.hello is not None else ""
        events.append({"ph": "M", "pid": rank, "name": "process_name", "args": {"name": f"rank {rank}{host}"}})
        events.append({"ph": "M", "pid": rank, "name": "process_sort_index", "args": {"sort_index": rank}})
    return events


def _instant(t: int, rank: int, text: str, origin: int) -> dict:
    return {"ph": "i", "pid": rank, "tid": 0, "s": "p", "name": text, "ts": _us(t - origin)}


def _other(origin: int) -> dict:
    return {"origin_wall_ns": origin, "slice_time": SLICE_TIME}


def _threads(rank: int, tid: int, group: str, lane: int, g: int) -> list[dict]:
    name = f"group {group}" + (f" · lane {lane + 1}" if lane else "")
    return [{"ph": "M", "pid": rank, "tid": tid, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": g * 1000 + lane}}]


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
            out += _threads(p.rank, tid, p.start.group, key[2], g)
        out.append(_slice(p, tids[key], origin))
    return out


def _slice(p: PairedOp, tid: int, origin: int) -> dict:
    return _slice_of(p.rank, p.start, p.t0, p.end, p.t1, tid, origin)


def _slice_of(rank: int, s, t0: int, e, t1: int, tid: int, origin: int) -> dict:
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
        if e.first:
            args["first"] = "first op on its communicator: its time includes NCCL's setup"
    return {"ph": "X", "pid": rank, "tid": tid, "name": f"{s.op} #{s.seq}", "cat": s.op,
            "ts": _us(t0 - origin), "dur": _us(max(0, t1 - t0)), "args": args}


def _us(t_ns: int) -> float:
    return round(t_ns / 1e3, 3)


class ChromeTraceWriter:
    """`to_chrome_trace`'s document written as the model is fed: hand `op` and `mark`
    to `Model(on_op=..., on_mark=...)`, call `flush(model)` after each chunk the model
    takes (`traces.ingest_chunks(Model, after_chunk=...)`) and `finish(model)` at the end. What
    it keeps: each track's lanes (when each is free), its tids, the ranks seen, the
    ops handed on since the last flush (a chunk's) and those it holds back (at most
    `HOLD_MAX` after a flush).

    Lanes. `assign_lanes` gives them per track in the order of starts; ops end in
    another order (an irecv posted before an all_reduce may end after it). So at each
    flush an op goes out only once no op of its track that started before it is still
    in flight (the model's in-flight table): the lanes are then `assign_lanes`'s, and
    the groups of a rank are numbered (`thread_sort_index`) in the order their first
    ops started, as in memory. Times are each op's on the wall clock, the order the
    model is fed (`merge.order_stream`): by the same times, so no op still to come can
    start before one already out. Where that does not hold, the output still nests
    (an op goes on a lane only after everything on it has ended) but its lanes, or
    sort indexes, may not be the in-memory ones: when more than `HOLD_MAX` ops wait on
    an op that stays in flight (a hung irecv while the rank's sends go on: `forced`
    counts them), when a rank's clock runs back (`order_stream` clamps it, the model
    does not), or for ops that start at the same ns.

    Origin. Every `ts` is relative to `origin`, the whole second at or before the
    earliest slice or instant, which has to be known before anything is written:
    unless given, it is taken at the first flush from what the model has seen (ops
    ended, held or in flight, marks), the earliest of all in a stream fed in time
    order. `origin_ok` says
    whether that was the true one (`to_chrome_trace`'s); when not, `export_stream`
    writes the file again with `true_origin`.

    Not the same as in memory: a model that restarts (a new job saying hello once all
    ranks of the last are gone, `Model.reset`) drops the ops it kept, while what was
    written stays written."""

    def __init__(self, out: TextIO, origin: int | None = None) -> None:
        self.out = out
        self.origin = origin
        self.earliest: int | None = None  # wall ns of the earliest slice or instant written
        self.ops = 0  # "X" slices written
        self.events = 0  # events written
        self.forced = 0  # ops sent out past HOLD_MAX before an earlier-started op of their track
        self._new: list[tuple] = []  # (rank, group, t0, t1, start, end) handed on since the last flush
        self._instants: list[tuple[int, int, str]] = []
        self._held: dict[tuple[int, str], list[tuple]] = {}  # per track, ops waiting for an earlier start
        self._n_held = 0
        self._free: dict[tuple[int, str], list[int]] = {}  # per track, per lane: when its last slice ends
        self._tids: dict[tuple[int, str, int], int] = {}
        self._n_tids: dict[int, int] = {}
        self._group_ix: dict[tuple[int, str], int] = {}  # per rank, its groups in the order their ops began
        self._n_groups: dict[int, int] = {}
        self._ranks: set[int] = set()
        self._buf: list[dict] = []
        out.write('{"traceEvents": [')

    # the model's hooks
    def op(self, rank: int, start, t0: int, end, t1: int) -> None:
        self._new.append((rank, start.group, t0, t1, start, end))

    def mark(self, t: int, rank: int, text: str) -> None:
        self._instants.append((t, rank, text))

    @property
    def true_origin(self) -> int | None:
        """The origin `to_chrome_trace` takes: the whole second before the earliest
        slice or instant (None while nothing was written)."""
        return None if self.earliest is None else self.earliest // 10**9 * 10**9

    @property
    def origin_ok(self) -> bool:
        return self.earliest is None or self.origin == self.true_origin

    def flush(self, model: Model) -> None:
        """Write what the model handed on that can go out now."""
        self._flush(model, final=False)

    def finish(self, model: Model) -> None:
        """The trace is over: the ops still in flight (they run to the newest time in
        the model) and where commviz stopped a rank, then the processes, then the end
        of the document."""
        for r in model.ranks.values():
            self._new += [(r.rank, f.start.group, f.t_wall, model.last_t, f.start, None) for f in r.inflight.values()]
            if r.stopped is not None:
                self._instants.append((r.stopped.t + r.offset_ns, r.rank, r.stopped.text()))
        self._flush(model, final=True)
        self._write(_processes(model, self._ranks))
        self._drain()
        if self.events:
            tail = {"displayTimeUnit": "ms", "otherData": _other(self.origin)}
        else:
            tail = {"displayTimeUnit": "ms"}
        self.out.write("], " + json.dumps(tail)[1:])

    def _flush(self, model: Model, final: bool) -> None:
        held = self._held
        for op in self._new:
            held.setdefault((op[0], op[1]), []).append(op)
        self._n_held += len(self._new)
        self._new = []
        # per track, the earliest start still in flight: nothing after it may go out yet
        block: dict[tuple[int, str], int] = {}
        if not final:
            for r in model.ranks.values():
                for f in r.inflight.values():
                    key = (r.rank, f.start.group)
                    if f.t_wall < block.get(key, f.t_wall + 1):
                        block[key] = f.t_wall
        self._number_groups(held, block)
        if self.origin is None and (held or self._instants):
            known = [min(op[2] for op in ops) for ops in held.values() if ops]
            known += block.values()
            known += [t for t, _, _ in self._instants]
            self.origin = min(known) // 10**9 * 10**9
        out: list[tuple] = []  # (rank, t0, lane, op) going out
        for key, ops in held.items():
            if not ops:
                continue
            ops.sort(key=_span)
            b = block.get(key)
            n = len(ops) if b is None else bisect.bisect_right(ops, b, key=_t0)
            if n:
                self._lanes(key, ops[:n], out)
                del ops[:n]
        if self._n_held - len(out) > HOLD_MAX:  # an op stays in flight while its track goes on
            for key, ops in sorted(held.items(), key=lambda kv: -len(kv[1])):
                if self._n_held - len(out) <= HOLD_MAX // 2:
                    break
                self.forced += len(ops)
                self._lanes(key, ops, out)
                ops.clear()
        self._n_held -= len(out)
        for key in [k for k, ops in held.items() if not ops]:
            del held[key]
        out.sort(key=_rank_t0)
        origin = self.origin
        tids, earliest = self._tids, self.earliest
        events = self._buf
        for rank, t0, lane, op in out:
            group = op[1]
            tid = tids.get((rank, group, lane))
            if tid is None:
                tid = tids[(rank, group, lane)] = self._n_tids[rank] = self._n_tids.get(rank, 0) + 1
                events += _threads(rank, tid, group, lane, self._group_ix[(rank, group)])
                self._ranks.add(rank)
            events.append(_slice_of(rank, op[4], t0, op[5], op[3], tid, origin))
            if earliest is None or t0 < earliest:
                earliest = t0
            if len(events) >= WRITE_EVERY:
                self._drain()
                events = self._buf
        self.ops += len(out)
        for t, rank, text in self._instants:
            events.append(_instant(t, rank, text, origin))
            self._ranks.add(rank)
            if earliest is None or t < earliest:
                earliest = t
        self._instants = []
        self.earliest = earliest
        self._buf = events
        self._drain()

    def _number_groups(self, held: dict, block: dict) -> None:
        """Number each rank's groups in the order their first ops began: a group seen
        for the first time now (an op held or in flight) began after every group
        numbered before, and the groups seen now in the order of their earliest op."""
        new: dict[tuple[int, str], int] = {}
        for key, ops in held.items():
            if ops and key not in self._group_ix:
                new[key] = min(op[2] for op in ops)
        for key, t in block.items():
            if key not in self._group_ix and t < new.get(key, t + 1):
                new[key] = t
        for key in sorted(new, key=lambda k: (k[0], new[k])):
            n = self._n_groups.get(key[0], 0)
            self._group_ix[key] = n
            self._n_groups[key[0]] = n + 1

    def _lanes(self, key: tuple[int, str], ops: list[tuple], out: list) -> None:
        """`assign_lanes` over the track's ops, carried on from its earlier ones."""
        free_at = self._free.setdefault(key, [])
        for op in ops:
            out.append((key[0], op[2], take_lane(free_at, op[2], op[3]), op))

    def _write(self, events: list[dict]) -> None:
        self._buf += events

    def _drain(self) -> None:
        if self._buf:
            text = json.dumps(self._buf)[1:-1]
            self.out.write(", " + text if self.events else text)
            self.events += len(self._buf)
            self._buf = []


def _span(op: tuple) -> tuple[int, int]:
    return op[2], op[3]


def _t0(op: tuple) -> int:
    return op[2]


def _rank_t0(item: tuple) -> tuple[int, int]:
    return item[0], item[1]


# Events a streaming export sorts and feeds at a time: the writer holds a chunk's ops
# (their OpStart and OpEnd made for it) until the chunk is in, so its chunks are half
# of `summary`'s, which holds none (a quarter costs ~15 % more time, for 20 MB less).
EXPORT_CHUNK = 32768


def export_stream(stream, path: str) -> ChromeTraceWriter:
    """The trace of a `trace.stream.TraceStream` written to `path` as
    `to_chrome_trace` would give it, in bounded memory: fed to a model that keeps no
    op, each written as it ends (`ChromeTraceWriter`). One pass over the trace, a
    second only where the origin taken at the first flush was not the earliest time
    (a stream not fed in time order: see `ChromeTraceWriter`)."""
    origin = None
    for _ in range(2):
        with open(path, "w") as f:
            w = ChromeTraceWriter(f, origin)
            model = Model(flows=False, on_op=w.op, on_mark=w.mark)
            traces.ingest_chunks(model, stream.chunks(EXPORT_CHUNK), cut_off=stream.truncated, snapshot=stream.snapshot,
                                after_chunk=lambda: w.flush(model))
            w.finish(model)
        if w.origin_ok:
            break
        origin = w.true_origin
    return w
