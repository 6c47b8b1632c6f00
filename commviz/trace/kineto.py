"""Profiler Chrome traces (`prof.export_chrome_trace`, one file per rank) turned into
commviz events.

NCCL: every collective is a `record_param_comms` CPU op whose args name it
("Collective name", "In/Out msg nelems", "dtype", "Process Group Name"/"Ranks", and on
newer torch "Seq", "Rank", "Src Rank"/"Dst Rank"); its GPU kernel (`ncclKernel_*`,
`ncclDevKernel_*`) shares its "External id", and the op lasts until that kernel ends.
Gloo: the ops are the `c10d::*` dispatcher ops on the caller's thread; their args say
neither the group nor (for tensor lists) the dtype, so those come from the `gloo:*`
annotation that ran the op and from `distributedInfo`. Times are microseconds from
`baseTimeNanoseconds`, the same clock for CPU and GPU events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from commviz import ops as opcat
from commviz.events import SCHEMA_VERSION, Batch, GroupDef, OpEnd, OpStart
from commviz.trace import torchnames as tn

MAX_EVENTS = 20_000_000
_NOT_OPS = {"wait", "init", "split", "comm_split", "coalesced", "abort", ""}
# c10d dispatcher op (trailing "_" dropped) -> the gloo algorithm that runs it
_GLOO_RUNS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "all_reduce", "reduce_scatter_tensor_coalesced": "all_reduce",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "barrier": "barrier", "gather": "gather",
    "scatter": "scatter", "send": "send", "recv": "recv", "recv_any_source": "recvAnySource",
    "monitored_barrier": "",
}


class ProfileError(ValueError):
    """Not a profiler trace with distributed ops; the message says why."""


@dataclass
class RankTrace:
    rank: int
    world: int
    backend: str
    groups: dict[str, list[int]]
    starts: list[OpStart] = field(default_factory=list)
    ends: list[OpEnd] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def is_profile(doc: object) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)


def _args(e: dict) -> dict:
    a = e.get("args")
    return a if isinstance(a, dict) else {}


def _num(v: object) -> float | None:
    """A finite time in µs (or ns for the base); None for anything else."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e20:
        return float(v)
    return None


_NS_MAX = (1 << 63) - 1  # the model keeps times in int64 columns


def _span(e: dict, base: int) -> tuple[int, int] | None:
    """(start, end) in ns; None where either is not a time (or past what an int64
    holds: a duration of millennia is a damaged file, not an op)."""
    ts, dur = _num(e.get("ts")), _num(e.get("dur"))
    if ts is None:
        return None
    t0 = base + int(ts * 1000)
    t1 = t0 + int((dur or 0.0) * 1000)
    if not (-_NS_MAX <= t0 <= _NS_MAX and -_NS_MAX <= t1 <= _NS_MAX):
        return None
    return t0, t1


def parse(doc: dict, rank_hint: int | None) -> RankTrace:
    """One rank's trace; ProfileError when it holds no distributed ops or no rank."""
    events = doc["traceEvents"]
    if len(events) > MAX_EVENTS:
        raise ProfileError(f"{len(events)} events, over the {MAX_EVENTS} limit")
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = _int_arg(info, "rank") if _int_arg(info, "rank") >= 0 else rank_hint
    if rank is None or rank < 0:
        raise ProfileError("no distributedInfo.rank and no rank in the file name (use --rank-map NAME=RANK)")
    groups = {}
    for c in info.get("pg_config") or []:
        ranks = tn.parse_ranks(c.get("ranks")) if isinstance(c, dict) else None
        if ranks and isinstance(c.get("pg_name"), str):
            groups[c["pg_name"]] = ranks
    world = max(0, _int_arg(info, "world_size"))
    backend = info.get("backend") if isinstance(info.get("backend"), str) else ""
    base = _num(doc.get("baseTimeNanoseconds")) or 0
    rt = RankTrace(rank, world, backend, groups)
    evs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("name"), str)]
    if any(e["name"] == "record_param_comms" for e in evs):
        _nccl(rt, evs, int(base))
    elif any(e["name"].startswith("c10d::") for e in evs):
        _gloo(rt, evs, int(base))
    else:
        raise ProfileError("a profiler trace without record_param_comms or c10d:: ops (no distributed ops profiled)")
    rt.world = rt.world or max([rank + 1] + [max(m) + 1 for m in rt.groups.values() if m])
    return rt


def _nccl(rt: RankTrace, evs: list[dict], base: int) -> None:
    kernel_end: dict[object, int] = {}
    for e in evs:
        if e["name"].startswith(("ncclKernel_", "ncclDevKernel_")):
            span, xid = _span(e, base), _int_arg(_args(e), "External id")
            if span is not None and xid >= 0:
                kernel_end[xid] = max(kernel_end.get(xid, 0), span[1])
    seqs: dict[str, int] = {}
    p2p: dict[tuple[str, int], int] = {}
    calls = sorted((e for e in evs if e["name"] == "record_param_comms"), key=lambda e: _num(e.get("ts")) or 0)
    for e in calls:
        a, span = _args(e), _span(e, base)
        name = a.get("Collective name")
        if span is None or not isinstance(name, str) or name in _NOT_OPS:
            continue
        op = tn.op_name(name)
        group = str(a.get("Process Group Name", "0"))
        ranks = tn.parse_ranks(a.get("Process Group Ranks"))
        if ranks and group not in rt.groups:
            rt.groups[group] = ranks
        dt = tn.dtype(a.get("dtype"))
        nel = a.get("Out msg nelems" if tn.payload_from_output(op) else "In msg nelems")
        nbytes = nel * dt[1] if isinstance(nel, int) and nel >= 0 and dt else 0
        i = len(rt.starts)
        peer = -1
        if op in ("send", "recv"):
            peer = _int_arg(a, "Dst Rank" if op == "send" else "Src Rank")
            if peer < 0:
                continue
            k = p2p[(op, peer)] = p2p.get((op, peer), -1) + 1
        else:
            seq_arg = _int_arg(a, "Seq")
            k = seq_arg if seq_arg >= 0 else seqs.get(group, -1) + 1
            seqs[group] = k
        rt.starts.append(OpStart(i, span[0], op, group, k, nbytes, dt[0] if dt else "", [], peer=peer))
        rt.ends.append(OpEnd(i, max(span[1], kernel_end.get(_int_arg(a, "External id"), 0))))


def _int_arg(a: dict, key: str) -> int:
    v = a.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else -1


def _gloo(rt: RankTrace, evs: list[dict], base: int) -> None:
    runs = _Runs(evs)
    one_group = len(rt.groups) <= 1
    group = next(iter(rt.groups), "0") if one_group else "?"
    if not one_group:
        rt.notes.append(f"gloo's profiler ops do not say their group and this job has {len(rt.groups)}: "
                        "collectives are counted per rank, not matched across ranks; send/recv left out")
    rt.groups.setdefault(group, sorted(range(rt.world)) if one_group and rt.world else [])
    seq, p2p = -1, {}
    calls = sorted((e for e in evs if e["name"].startswith("c10d::")), key=lambda e: _num(e.get("ts")) or 0)
    for e in calls:
        raw = e["name"][len("c10d::"):].rstrip("_")
        span = _span(e, base)
        if raw not in _GLOO_RUNS or span is None:
            continue
        op = tn.op_name(raw)
        run = runs.take(_GLOO_RUNS[raw], _num(e.get("ts")) or 0) if _GLOO_RUNS[raw] else None
        nbytes, dt = _gloo_bytes(_args(e), _args(run) if run else {}, op, len(rt.groups.get(group, [])))
        end = max(span[1], _span(run, base)[1]) if run else span[1]
        i = len(rt.starts)
        if op in ("send", "recv"):
            peer = _concrete_int(_args(e), 2)
            if peer < 0 or not one_group:
                continue
            k = p2p[(op, peer)] = p2p.get((op, peer), -1) + 1
            rt.starts.append(OpStart(i, span[0], op, group, k, nbytes, dt, [], peer=peer))
        else:
            seq = seq + 1 if one_group else -1
            rt.starts.append(OpStart(i, span[0], op, group, seq, nbytes, dt, []))
        rt.ends.append(OpEnd(i, end))


class _Runs:
    """The `gloo:*` annotations (the work gloo ran), taken in order per algorithm: an
    op's run is the first not yet taken that began after the op did."""

    def __init__(self, evs: list[dict]) -> None:
        self.by_algo: dict[str, list[dict]] = {}
        for e in sorted((e for e in evs if e["name"].startswith("gloo:")), key=lambda e: _num(e.get("ts")) or 0):
            self.by_algo.setdefault(e["name"][5:], []).append(e)
        self.next: dict[str, int] = {}

    def take(self, algo: str, ts_us: float) -> dict | None:
        runs, j = self.by_algo.get(algo, []), self.next.get(algo, 0)
        while j < len(runs) and (_num(runs[j].get("ts")) or 0) < ts_us:
            j += 1
        self.next[algo] = j + 1
        return runs[j] if j < len(runs) else None


def _concrete_int(a: dict, i: int) -> int:
    c = a.get("Concrete Inputs")
    if isinstance(c, list) and len(c) > i and isinstance(c[i], str) and c[i].isdigit():
        return int(c[i])
    return -1


# c10d ops whose bytes rule reads their second argument (they take (output, input))
_READS_INPUT = {"reduce_scatter", "_reduce_scatter_base", "all_to_all", "all_to_all_single", "gather"}
_TIMES_N = {"gather", "scatter"}  # one chunk × the group's size


def _gloo_bytes(a: dict, run: dict, op: str, n: int) -> tuple[int, str]:
    """Bytes by the DESIGN rule from the op's recorded shapes (record_shapes=True),
    the dtype from the op or, for tensor lists, from the gloo run."""
    spec = opcat.spec(op)
    if spec is not None and spec.bytes_rule == opcat.NONE:
        return 0, ""
    dims, types = a.get("Input Dims"), a.get("Input type")
    if not isinstance(dims, list) or not dims or not isinstance(types, list) or not types:
        return 0, ""
    dt = tn.dtype(types[0])
    if dt is None:
        rtypes = run.get("Input type")
        dt = tn.dtype(rtypes[0]) if isinstance(rtypes, list) and rtypes else None
    if dt is None:
        return 0, ""
    pick = 1 if op in _READS_INPUT and len(dims) > 1 else 0
    nel = _numel(dims[pick])
    if op in _TIMES_N:
        nel = _first_numel(dims[pick]) * n
    return nel * dt[1], dt[0]


def _first_numel(d: object) -> int:
    while isinstance(d, list) and d and isinstance(d[0], list):
        d = d[0]
    return _numel(d)


def _numel(d: object) -> int:
    if isinstance(d, list) and d and all(isinstance(x, list) for x in d):
        return sum(_numel(x) for x in d)
    if isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
        n = 1
        for x in d:
            n *= x
        return n
    return 0


def to_batch(rt: RankTrace, job: str) -> Batch:
    t0 = min([s.t for s in rt.starts], default=0)
    evs: list = [tn.hello(rt.rank, rt.world, rt.backend, job, t0)]
    evs += [GroupDef(g, list(r), rt.backend or "?") for g, r in sorted(rt.groups.items()) if r]
    for s, e in zip(rt.starts, rt.ends):
        evs += [s, e]
    return Batch(SCHEMA_VERSION, rt.rank, evs)
