"""The one writer of what ingest changes in the model.

Every effect of an event on `Model` and its `RankState`s is written here, once, with
its two entry points side by side: one event at a time (`ingest_one`, the per-event
path, and the slow events of a batch) and a batch's fast collectives at once
(`apply_plan`, given a `plan.Plan`: counts by sums, windows, flows and completions in
columns). `Model` keeps the state and answers questions about it; `model/plan.py`
decides what may go in bulk without writing; `model/columns.py` drives a batch. No
other module assigns to the model's fields (tests/model/test_ledger.py checks).
The model's parts that are classes of their own (`Tracker`, `Traffic`, `Windows`,
`SeenIds`, `OpStats`, `StragglerWatch`) keep their own insides; the ledger says when
they change, through their methods.

The effects that depend on order (statistics and straggler windows, each rank's
window of recent ops and last op, flows) are applied in event order across both
kinds: a slow event's are collected while its batch runs (`Deferred`), the fast
instances' completions are interleaved with the slow events (`apply_plan`).
"""

from __future__ import annotations

import bisect
import itertools
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from commviz import ops as opcat
from commviz.events import (
    Audit,
    Counters,
    Event,
    Goodbye,
    GroupDef,
    Hello,
    HostTopology,
    Mark,
    NcclComm,
    NcclOp,
    OpEnd,
    OpStart,
    Sample,
    Stack,
    Stopped,
)
from commviz.model import audit as audit_mod
from commviz.model import desync as desync_mod
from commviz.model import flows as flows_mod
from commviz.model.audit import WINDOWS
from commviz.model.diagnosis import Diagnosis, RankStatus
from commviz.model.keys import unique, unique_sorted
from commviz.model.merge import offset_ns
from commviz.model.nccl import NcclTally
from commviz.model.plan import FastEnds, Plan, arrivals, ring_next
from commviz.model.rank import PairedOp, RankState
from commviz.model.retired import Retired
from commviz.model.stats import OpStats
from commviz.model.straggler import Arrival
from commviz.model.track import MAX_PENDING, InFlight, Instance, P2PPair

if TYPE_CHECKING:
    from commviz.model.state import Model

# Completed collective instances kept for per-instance views; older ones only live on
# in the aggregated statistics.
RECENT_MARKS = 1000
# Hosts whose GPU topology document is kept (one per host, sent by its local rank 0),
# and the GPUs a document may list (a host has a handful; more is not a host's).
MAX_HOST_TOPOLOGIES = 4096
MAX_HOST_GPUS = 64
# Desyncs found in instances that have since completed (they stay reported).
DESYNC_HISTORY = 64
# Pending instances are checked for staleness (a member's start was lost) once there
# are this many, then whenever their number doubles; the check comes at every
# SWEEP_EVERY-th event, a place that does not depend on how the events were batched,
# so the batch path can stop there and sweep exactly as one event at a time would,
# instead of going one at a time until the sweep has run.
SWEEP_FIRST = 1024
SWEEP_EVERY = 4096


# ---- The batch's deferred effects

class SlowEnd(NamedTuple):
    """A slow end of a batch, for its rank's window of recent ops and its last op."""
    pos: int  # its place in the batch
    rank: int
    group: str
    t0: int  # start and end on the rank's clock
    t1: int
    op: str
    end_wall: int
    start: OpStart


class SlowCredit(NamedTuple):
    """A slow end's flows: `Traffic.op_end(*args, **kwargs)` at its place in the batch."""
    pos: int
    args: tuple
    kwargs: dict


class Deferred:
    """The order-dependent effects of the slow events of a batch, each with the
    position of the event that made it, applied after the batch in order."""

    __slots__ = ("pos", "ends", "traffic")

    def __init__(self) -> None:
        self.pos = 0  # the slow event being ingested
        self.ends: list[SlowEnd] = []
        self.traffic: list[SlowCredit] = []


# ---- One event: `ingest_one` (`Model.ingest`), and what it changes for each kind

def ingest_one(model: Model, rank: int, ev: Event, defer: Deferred | None = None) -> None:
    """One event's effects. `defer`: the event is a slow one of a batch (`apply_plan`),
    whose order-dependent effects are collected there and applied after the batch in
    event order; the sweep check is the batch's then."""
    tp = type(ev)
    if tp is OpEnd or tp is OpStart:  # nearly every event: the short way
        model.events += 1
        r = model.ranks.get(rank)
        if r is None:
            r = rank_state(model, rank)
        tw = ev.t + r.offset_ns
        if tw > r.last_seen:
            r.last_seen = tw
        if tw > model.last_t:
            model.last_t = tw
        if tp is OpEnd:
            on_end(model, r, ev, defer)
        else:
            on_start(model, r, ev)
    else:
        _other(model, rank, ev, defer)
    if not model.events % SWEEP_EVERY and defer is None and len(model.pending) > model.sweep_at:
        sweep(model)


def _other(model: Model, rank: int, ev: Event, defer: Deferred | None) -> None:
    model.events += 1
    if isinstance(ev, Hello):
        on_hello(model, rank, ev)
        return
    r = rank_state(model, rank)
    t = getattr(ev, "t", None)
    if t is not None:
        tw = t + r.offset_ns
        if tw > r.last_seen and type(ev) is not Stopped:  # (the watcher's time, not a sign of the rank's life)
            r.last_seen = tw
        if tw > model.last_t:
            model.last_t = tw
    if isinstance(ev, OpStart):
        on_start(model, r, ev)
    elif isinstance(ev, OpEnd):
        on_end(model, r, ev, defer)
    elif isinstance(ev, GroupDef):
        on_group(model, ev)
    elif isinstance(ev, Stack):
        r.stacks.add(ev, ev.t + r.offset_ns)
    elif isinstance(ev, Counters):
        r.dropped = max(r.dropped, ev.dropped)
        r.internal_errors = max(r.internal_errors, ev.internal_errors)
        r.trace_errors = max(r.trace_errors, ev.trace_errors)
        if r.behind < 0 or ev.behind < r.behind:
            # the first this watcher hears of it, or a new process: what the probe
            # left out before is another watcher's loss, not this one's
            r.behind = ev.behind
        elif ev.behind > r.behind:
            model.behind_events += ev.behind - r.behind
            r.behind = ev.behind
    elif isinstance(ev, Sample):
        r.sample.update(ev.values)
    elif isinstance(ev, Mark):
        model.marks.append((ev.t + r.offset_ns, rank, ev.text))
        if model.on_mark is not None:
            model.on_mark(ev.t + r.offset_ns, rank, ev.text)
        if not model.keep_ops:
            del model.marks[:-RECENT_MARKS]
    elif isinstance(ev, Stopped):
        if not r.gone:
            r.stopped = ev
    elif isinstance(ev, Audit):
        inflight = [(f.start.group, f.start.t) for f in r.inflight.values()]
        r.audit = audit_mod.compare(r.windows, inflight, r.hello, ev)
    elif isinstance(ev, HostTopology):
        on_host_topology(model, ev)
    elif isinstance(ev, (NcclOp, NcclComm)):
        if r.nccl is None:
            r.nccl = NcclTally()
        r.nccl.add(ev)
    elif isinstance(ev, Goodbye):
        r.dropped = max(r.dropped, ev.dropped)
        r.status = RankStatus.EXITED
        r.gone_reason = ev.reason
        r.gone_t = ev.t + r.offset_ns


def rank_state(model: Model, rank: int) -> RankState:
    r = model.ranks.get(rank)
    if r is None:
        r = model.ranks[rank] = RankState(rank)
    return r


def on_hello(model: Model, rank: int, h: Hello) -> None:
    if model.job and h.job != model.job and model.ranks and all(r.gone for r in model.ranks.values()):
        # The previous job is over and a new one is saying hello: start afresh so
        # a long-running watcher shows one job at a time.
        model.reset()
    r = rank_state(model, rank)
    if r.hello is not None and r.hello.pid == h.pid:
        model.duplicates += 1  # a reconnecting rank says hello again
    elif r.hello is not None:
        # Same rank number, new process (an elastic restart): fresh counters, and
        # its old process's ops no longer take part in any instance or pair.
        r = model.ranks[rank] = RankState(rank)
        model.tracker.forget_rank(rank)
        # its sequence numbers start again at 0, below what a spell of shedding
        # counted: its groups' keys must open instances again
        for gid, g in model.groups.items():
            if rank in g.ranks:
                model.retired.pop(gid, None)
    r.hello = h
    r.offset_ns = offset_ns(h)
    r.last_seen = max(r.last_seen, h.wall_ns)
    if r.status is RankStatus.DEAD:
        r.status = RankStatus.OK
        r.gone_t = 0
    model.job = model.job or h.job
    model.world_size = max(model.world_size, h.world_size)
    model.backend = model.backend or h.backend


def on_group(model: Model, g: GroupDef) -> None:
    known = model.groups.get(g.group)
    model.groups[g.group] = g
    if known is not None and known.ranks == g.ranks:
        return  # every member announces it, and again after each reconnect
    # Instances every member has already left, seen before their group was
    # known, are complete now.
    members = len(g.ranks)
    for key, inst in list(model.pending.items()):
        if key[0] == g.group and members and len(inst.ended) >= members:
            fold(model, inst)


def on_host_topology(model: Model, ev: HostTopology) -> None:
    """Kept as sent: a resync sends the same document again, and a host past the
    cap, or a document that is not a host's, is shown as one that sent nothing."""
    docs = model.host_topologies
    gpus = ev.document.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_HOST_GPUS or docs.get(ev.host) == ev.document:
        return
    if ev.host in docs or len(docs) < MAX_HOST_TOPOLOGIES:
        docs[ev.host] = ev.document
        model.topology_version += 1


def restore(model: Model, saved: Model) -> None:
    """`model` becomes `saved` (a replay's checkpoint, trace/seek.py) in place: the
    views hold the one object."""
    model.__dict__.clear()
    model.__dict__.update(saved.__dict__)


def flush_flows(model: Model) -> None:
    """The ends a shedding model sampled and holds until they span a bucket go into
    the flows: a view asks before it reads them."""
    model.traffic.flush_sample()


def mark_gone(model: Model, rank: int, reason: str, t_ns: int | None = None) -> None:
    """The transport or the file says this rank's process is gone. `t_ns` (wall
    clock) is when it was last known alive; by default its newest event, which the
    probe's 1 s heartbeat keeps recent."""
    r = rank_state(model, rank)
    if r.status is not RankStatus.EXITED:
        r.status = RankStatus.DEAD
        r.gone_reason = r.stopped.text() if r.stopped is not None else reason
        r.gone_t = r.last_seen if t_ns is None else t_ns


def note_decode_error(model: Model, message: str) -> None:
    model.decode_errors += 1
    model.last_decode_error = message


def note_decode_errors(model: Model, at_least: int) -> None:
    if at_least > model.decode_errors:
        model.decode_errors = at_least


def set_shed(model: Model, on: bool) -> None:
    """A watcher fell behind, or caught up (model/overload.py: `Model.shed`)."""
    if on and not model.shedding:
        raise_floors(model, model.groups)
    if model.shedding and not on:
        model.traffic.flush_sample()  # the spell's estimate goes in before exact flows resume
    model.shedding = bool(on)


# ---- An op starts (a batch's starts: `ends_many`, below)

def on_start(model: Model, r: RankState, s: OpStart) -> None:
    if s.id in r.seen_ids:
        model.duplicates += 1  # resent after a reconnect
        return
    r.seen_ids.add(s.id)
    fl = r.inflight[s.id] = InFlight(s, s.t + r.offset_ns)
    if is_p2p(s.op):
        model.tracker.post(r.rank, fl)
    elif s.seq >= 0:
        if not (model.retired and model.counted(s.group, s.seq)):
            model.tracker.enter(r.rank, fl)
        if s.seq > r.seqs.get(s.group, -1):
            r.seqs[s.group] = s.seq


# ---- An op ends: one (`on_end`), a batch's fast ones (`ends_many`: counts, bytes, seqs, last-seen times, seen ids)

def on_end(model: Model, r: RankState, e: OpEnd, defer: Deferred | None) -> None:
    fl = r.inflight.pop(e.id, None)
    if fl is None:
        model.orphan_ends += 1  # its start was dropped or predates this watcher
        return
    s = fl.start
    nbytes = e.bytes if e.bytes >= 0 else s.bytes
    end_wall = e.t + r.offset_ns
    r.ops_done += 1
    r.bytes_done += nbytes
    c = r.per_op.setdefault(s.op, [0, 0])
    c[0] += 1
    c[1] += nbytes
    c = r.per_group.setdefault((s.op, s.group), [0, 0])
    c[0] += 1
    c[1] += nbytes
    if defer is None:
        r.windows.add(s.group, s.t, e.t)
        r.last_op = s.op
        r.last_op_end = end_wall
        r.last_start = s
    else:  # (windows_many puts it in its place among the batch's fast ends)
        defer.ends.append(SlowEnd(defer.pos, r.rank, s.group, s.t, e.t, s.op, end_wall, s))
    if model.keep_ops:
        model.done_ops.append(PairedOp(r.rank, s, fl.t_wall, e, end_wall))
    if model.on_op is not None:
        model.on_op(r.rank, s, fl.t_wall, e, end_wall)
    g = model.groups.get(s.group)
    members = g.ranks if g is not None else None
    p2p = is_p2p(s.op)
    if p2p or s.seq < 0:
        peer = e.peer if e.peer >= 0 else s.peer
        if model.flows:
            credit(model, (r.rank, s.op, nbytes, fl.t_wall, end_wall),
                   dict(failed=bool(e.error), peer=peer, root=s.root, members=members), defer)
        stat(model, s.op, s.group).add(nbytes, None if model.shedding else op_time_ns(e, s), bool(e.error))
        pair = model.tracker.finish(r.rank, fl, end_wall, e.error) if p2p else None
        if pair is not None and not model.shedding:
            note_p2p_desync(model, pair)
        return
    if model.retired and model.counted(s.group, s.seq):  # a late member of an instance counted while shedding
        if model.flows:
            credit(model, (r.rank, s.op, nbytes, fl.t_wall, end_wall),
                   dict(failed=bool(e.error), root=s.root, members=members, arrived=fl.t_wall), defer)
        return
    inst = model.tracker.leave(r.rank, fl, end_wall, nbytes, e.error, device_time_ns(e))
    if model.flows:
        credit(model, (r.rank, s.op, nbytes, fl.t_wall, end_wall),
                   dict(failed=bool(e.error), root=s.root, members=members, arrived=inst.last_arrival), defer)
    if members and len(inst.ended) >= len(members):
        fold(model, inst)


def ends_many(model: Model, p: Plan) -> None:
    """The order-free effects: counts, bytes, seqs, last-seen times, seen ids."""
    nr = len(p.ur)
    model.events += 2 * len(p.ri)
    n_ends = np.bincount(p.ri, minlength=nr)
    b_ends = np.zeros(nr, np.int64)
    np.add.at(b_ends, p.ri, p.nbytes)
    seen = np.full(nr, np.iinfo(np.int64).min)
    np.maximum.at(seen, p.ri, np.maximum(p.s_wall, p.e_wall))
    # per (rank, op) and (rank, group) from the few signatures
    key = p.ri * len(p.sig_list) + p.sig
    uk, inv = unique(key, inverse=True)
    kc = np.bincount(inv)
    kb = np.zeros(len(uk), np.int64)
    np.add.at(kb, inv, p.nbytes)
    kseq = np.full(len(uk), -1)
    np.maximum.at(kseq, inv, p.seq)
    states = _states(model, p)
    for i in np.flatnonzero(n_ends).tolist():
        r = states[i]
        r.ops_done += int(n_ends[i])
        r.bytes_done += int(b_ends[i])
        if seen[i] > r.last_seen:
            r.last_seen = int(seen[i])
        if seen[i] > model.last_t:
            model.last_t = int(seen[i])
    for k, c, b, sq in zip(uk.tolist(), kc.tolist(), kb.tolist(), kseq.tolist()):
        i, sig = divmod(k, len(p.sig_list))
        r = states[i]
        op, group = p.sig_list[sig][:2]
        cell = r.per_op.setdefault(op, [0, 0])
        cell[0] += c
        cell[1] += b
        cell = r.per_group.setdefault((op, group), [0, 0])
        cell[0] += c
        cell[1] += b
        if sq > r.seqs.get(group, -1):
            r.seqs[group] = sq
    _seen_ids_many(model, p)


def _states(model: Model, p: Plan) -> list[RankState]:
    """Each rank of a plan (`p.ur`) as the model holds it: every rank with a fast op
    was known when the batch was planned (an unknown one cannot go fast), and none is
    replaced during the batch (a hello, which can, never lies inside one)."""
    get = model.ranks.get
    return [get(r) for r in p.ur.tolist()]


def _seen_ids_many(model: Model, p: Plan) -> None:
    """Each rank's SeenIds as adding its batch's ids one by one leaves it (the slow
    path has added some of them already; the result does not depend on the order)."""
    for i in np.flatnonzero(p.rank_ok).tolist():
        model.ranks[int(p.ur[i])].seen_ids.add_sorted(p.ids[p.first[i]:p.first[i] + p.cnt[i]])


# ---- A rank's window of recent ops and its last op: one in `on_end`, a batch's in `windows_many`

def windows_many(model: Model, p: Plan, d: Deferred) -> None:
    """Each rank's window of recent ops and its last op, from every end of the batch
    (fast and slow) in position order."""
    states = _states(model, p)
    slow_by: dict[int, list[SlowEnd]] = {}
    for e in d.ends:  # in order
        slow_by.setdefault(e.rank, []).append(e)
    code_of: dict[str, int] = {}  # group -> its code in `names`
    sig_code = np.array([code_of.setdefault(k[1], len(code_of)) for k in p.sig_list], np.int64)
    names = list(code_of)
    fast_last: list[tuple] = []  # (rank state, fast start) whose last op is a fast one
    order = np.lexsort((p.e_pos, p.ri))
    ri_o = p.ri[order]
    bounds = np.flatnonzero(np.r_[True, ri_o[1:] != ri_o[:-1], True]).tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        i = int(ri_o[a])
        r = states[i]
        cut = max(a, b - WINDOWS)  # only the newest WINDOWS can stay in the window
        idx = order[cut:b]
        pushed = int(p.s_t[order[a:cut]].max()) if cut > a else None
        k = int(order[b - 1])
        last_pos = int(p.e_pos[k])
        last = None
        extra = slow_by.pop(int(p.ur[i]), None)
        codes, t0s, t1s = sig_code[p.sig[idx]], p.s_t[idx], p.e_t[idx]
        if extra:  # the rank's slow ends go in among its fast ones, by position
            xcodes = [code_of.setdefault(e.group, len(code_of)) for e in extra]
            if len(code_of) > len(names):
                names = list(code_of)
            x_pos = [e.pos for e in extra]
            parts = ((codes, np.array(xcodes, np.int64)), (t0s, np.array([e.t0 for e in extra], np.int64)),
                     (t1s, np.array([e.t1 for e in extra], np.int64)))
            if x_pos[0] > last_pos:  # all after the fast ones (the batch's edges): no sort
                codes, t0s, t1s = (np.concatenate(c) for c in parts)
            elif x_pos[-1] < p.e_pos[idx[0]]:  # all before them
                codes, t0s, t1s = (np.concatenate(c[::-1]) for c in parts)
            else:
                o = np.argsort(np.concatenate([p.e_pos[idx], np.array(x_pos, np.int64)]), kind="stable")
                codes, t0s, t1s = (np.concatenate(c)[o] for c in parts)
            if x_pos[-1] > last_pos:
                last = extra[-1]
        r.windows.extend_columns(names, codes, t0s, t1s, pushed)
        if last is not None:
            r.last_op, r.last_op_end, r.last_start = last.op, last.end_wall, last.start
        else:
            r.last_op, r.last_op_end = p.sig_list[p.sig[k]][0], int(p.e_wall[k])
            fast_last.append((r, k))
    if fast_last:  # their OpStarts, made in one go
        ks = np.array([k for _, k in fast_last], np.int64)
        for (r, _), s in zip(fast_last, p.chunk.events(p.s_pos[ks])):
            r.last_start = s
    for rank, extra in slow_by.items():  # ranks with only slow ends
        r = model.ranks[rank]
        r.windows.extend([e.group for e in extra], [e.t0 for e in extra], [e.t1 for e in extra])
        e = extra[-1]
        r.last_op, r.last_op_end, r.last_start = e.op, e.end_wall, e.start


# ---- Flows: one end (`credit`), a batch's (`traffic_many`)

def credit(model: Model, args: tuple, kwargs: dict, defer: Deferred | None) -> None:
    """An end's flows (`Traffic.op_end`), now, or in its place after the batch."""
    if model.shedding:  # an estimate, as the batch path makes it: one end in k, weighing k
        k = flows_mod.SHED_FLOW_SAMPLE
        if not model.traffic.drawn_one():
            return
        rank, op, nbytes, t0, t1 = args
        args, kwargs = (rank, op, nbytes * k, t0, t1), {**kwargs, "weight": float(k)}
    if defer is None:
        model.traffic.op_end(*args, **kwargs)
    else:
        defer.traffic.append(SlowCredit(defer.pos, args, kwargs))


def traffic_many(model: Model, p: Plan, d: Deferred, every: int = 1) -> None:
    """Flows as `on_end` feeds them, every end of the batch in position order.

    `every` > 1 (while the model sheds detail): an estimate from about one end in
    `every`, drawn at random and weighing `every` ends each (its bytes and its op);
    ring transfers are credited in bulk where they end (`Traffic.sample`), any other
    end as `op_end` would. With no flows at all while shedding, the flow view, the
    links and the sparklines went dark exactly when the job was busiest."""
    if every > 1:
        _sampled_traffic_many(model, p, every)
        for _, args, kwargs in d.traffic:  # the batch's slow ends, sampled as `credit` drew them
            model.traffic.op_end(*args, **kwargs)
        return
    model.traffic.flush_sample()  # what a spell of shedding sampled goes in first
    arrived = arrivals(p)
    order = np.argsort(p.e_pos, kind="stable")
    ranks, nbytes = p.ur[p.ri[order]], p.nbytes[order]
    t0, t1, arr = p.s_wall[order], p.e_wall[order], arrived[order]
    start = np.where((t0 < arr) & (arr < t1), arr, t0)  # a transfer starts at the last arrival
    sig = p.sig[order]
    dst, v = ring_next(p, sig, ranks, nbytes)
    ends = flows_mod.RingEnds(p.e_pos[order], ranks, nbytes, t0, t1, arr, dst, v, start, sig,
                              [k[0] for k in p.sig_list], [k[4] for k in p.sig_list],
                              [p.members[g] for g in p.sig_group.tolist()])
    model.traffic.ring_ends(ends, d.traffic)


def _sampled_traffic_many(model: Model, p: Plan, every: int) -> None:
    """`traffic_many`'s estimate: the drawn ends' ring transfers held by `Traffic.sample`
    to be credited in bulk, any other end through `op_end` now."""
    drawn = model.traffic.drawn(len(p.e_pos))
    if not len(drawn):
        return
    order = drawn[np.argsort(p.e_pos[drawn], kind="stable")]
    ranks, nbytes = p.ur[p.ri[order]], p.nbytes[order] * every
    t0, t1, sig = p.s_wall[order], p.e_wall[order], p.sig[order]
    dst, v = ring_next(p, sig, ranks, nbytes)
    names = [k[0] for k in p.sig_list]
    ring = dst >= 0
    tr = model.traffic
    k = np.flatnonzero(ring)
    tr.sample(ranks[k], dst[k], v[k], t1[k], [names[g] for g in sig[k].tolist()], float(every))
    other = np.flatnonzero(~ring)
    arrived = arrivals(p)[order[other]] if len(other) else ()
    for i, arr in zip(other.tolist(), arrived.tolist() if len(other) else ()):  # any other pattern
        g = int(sig[i])
        tr.op_end(int(ranks[i]), names[g], int(nbytes[i]), int(t0[i]), int(t1[i]), root=p.sig_list[g][4],
                  members=p.members[p.sig_group[g]], arrived=int(arr), weight=float(every))


# ---- An instance completes: one (`fold`), a batch's fast one (`fold_fast`)

def fold(model: Model, inst: Instance, completed: bool = True) -> None:
    """Fold an instance every member has left (or one that can no longer complete)
    into the statistics; keep what the diagnoses need from it."""
    model.pending.pop((inst.group, inst.seq), None)
    if inst.ended:
        finish(model, inst)
    if model.shedding:
        model.shed_ops += 1
        retired_of(model, inst.group).add(inst.seq)
        return
    g = model.groups.get(inst.group)
    members = list(g.ranks) if g is not None else sorted(inst.starts)
    if completed:
        model.stragglers.add(inst, members)
    d = desync_mod.collective_desync(inst, members, model.gone_note, finished=True)
    if d is not None:
        remember_desync(model, ("c", inst.group, inst.seq), d)


def finish(model: Model, inst: Instance, into: dict | None = None) -> None:
    stats = model.stats if into is None else into
    st = stats.get((inst.op, inst.group))
    if st is None:
        st = stats[(inst.op, inst.group)] = OpStats()
    # The instance's time is the shortest rank-side duration (device time where
    # measured, `device_time_ns`): the last rank to arrive waits for nobody, so its
    # time is the transfer itself.
    dur = min(inst.durations.values()) if inst.durations else None
    # Shedding detail (model/overload.py): counted and sized, not timed.
    st.add(inst.bytes, None if model.shedding else dur, error=inst.errors > 0 and dur is None)


def stat(model: Model, op: str, group: str) -> OpStats:
    st = model.stats.get((op, group))
    if st is None:
        st = model.stats[(op, group)] = OpStats()
    return st


def note_p2p_desync(model: Model, pair: P2PPair) -> None:
    d = desync_mod.p2p_desync(pair)
    if d is not None:
        remember_desync(model, ("p", pair.group, pair.src, pair.dst, pair.seq), d)


def remember_desync(model: Model, key: tuple, d: Diagnosis) -> None:
    model.desync_history[key] = d
    while len(model.desync_history) > DESYNC_HISTORY:
        model.desync_history.popitem(last=False)


def fold_fast(model: Model, p: Plan, i: int, stats: dict, shed: bool) -> None:
    """A fast instance's completion, as `fold` makes it: one statistics row,
    one straggler arrival."""
    op, group = p.sig_list[p.i_sig[i]][:2]
    st = stats.get((op, group))
    if st is None:
        st = stats[(op, group)] = OpStats()
    st.add(int(p.i_bytes[i]), None if shed else int(p.i_dur[i]), error=False)
    if shed:
        model.shed_ops += 1
        return
    n = len(p.members[p.sig_group[p.i_sig[i]]])
    if n < 2:
        return
    t_last, t_prev = int(p.t_last[i]), int(p.t_prev[i])
    last = int(p.last_rank[i]) if t_last > t_prev else -1
    model.stragglers.append(group, Arrival(int(p.i_seq[i]), op, last, t_last - t_prev, t_last, int(p.i_dur[i])))


# ---- An instance left open: one member at a time (`Tracker.enter`, `leave`), a batch's (`Openings`)

class Openings:
    """The holed instances of a plan, each put into `model.pending` as the per-event
    path leaves it once its members present have entered and left: their starts (the
    OpStarts made in one call), arrival, bytes, durations, who left."""

    def __init__(self, model: Model, p: Plan) -> None:
        k = np.flatnonzero(p.holed[p.finv])  # the fast starts of holed instances
        k = k[np.lexsort((p.s_pos[k], p.finv[k]))]  # by instance, members in the order they entered
        self.model, self.p = model, p
        self.starts = p.chunk.events(p.s_pos[k])
        self.bounds = dict(zip(*unique_sorted(p.finv[k], index=True)))
        self.ranks = p.ur[p.ri[k]].tolist()
        self.walls, self.nbytes, self.durs = p.s_wall[k].tolist(), p.nbytes[k].tolist(), p.dur[k].tolist()
        self.n = np.bincount(p.finv[k], minlength=p.nf)

    def open(self, i: int) -> None:
        p = self.p
        lo = int(self.bounds[i])
        hi = lo + int(self.n[i])
        op, group = p.sig_list[p.i_sig[i]][:2]
        ranks, walls = self.ranks[lo:hi], self.walls[lo:hi]
        # (built in the order the members entered, as Tracker.enter and leave fill them)
        inst = Instance(op, group, int(p.i_seq[i]), durations=dict(zip(ranks, self.durs[lo:hi])),
                        ended=set(ranks), starts=dict(zip(ranks, map(InFlight, self.starts[lo:hi], walls))))
        inst.last_arrival = max(0, *walls)  # as Tracker.enter and leave keep them, from 0
        inst.bytes = max(0, *self.nbytes[lo:hi])
        self.model.pending[(group, inst.seq)] = inst


# ---- Shedding: instances counted before they complete (model/retired.py); one, or a batch's (`retire_plan`)

def retired_of(model: Model, group: str) -> Retired:
    rt = model.retired.get(group)
    if rt is None:
        rt = model.retired[group] = Retired()
    return rt


def raise_floors(model: Model, groups) -> None:
    """Each group's instances at or below the lowest one still open and the lowest
    seq every member has reached are folded already (or every member's frame of
    them was lost): the counted keys go on from above them. Asked when a spell
    begins, after each batch and each sweep during it, so a key whose every frame
    was lost does not hold the floor back."""
    low: dict[str, int] = {}
    for g, seq in model.pending:
        if seq <= low.get(g, seq):
            low[g] = seq
    for gid in groups:
        g = model.groups.get(gid)
        if g is None:
            continue
        reached = min((model.ranks[m].seqs.get(gid, -1) if m in model.ranks else -1 for m in g.ranks), default=-1)
        retired_of(model, gid).raise_floor(min(reached, low[gid] - 1) if gid in low else reached)


def count_idle_pending(model: Model) -> int:
    """While shedding: count every open instance nobody is inside (each member
    present has left), as a batch counts a holed one where its last member present
    leaves. Left open, the per-event path holds one until every member has come,
    and a batch whose instances are held open cannot go in bulk: behind producers
    that lose most of their frames, every later batch then went one event at a
    time, each leaving more open (bench/ingest.py flat out: ~85k events/s)."""
    idle = [inst for inst in model.pending.values() if inst.starts.keys() <= inst.ended]
    for inst in idle:
        fold(model, inst, completed=False)
    if idle:
        raise_floors(model, {inst.group for inst in idle})
    return len(idle)


def retire_many(model: Model, seqs_by_group: dict) -> None:
    """The batch path folded these instances (group -> their seqs) while shedding."""
    for group, seqs in seqs_by_group.items():
        retired_of(model, group).add_many(seqs)
    raise_floors(model, seqs_by_group)


def retire_plan(model: Model, p: Plan) -> None:
    """While shedding: the instances this batch counted, remembered per group so a
    member that comes later opens nothing (model/retired.py)."""
    folded = np.flatnonzero(~p.late)
    if not len(folded):
        return
    g = p.sig_group[p.i_sig[folded]]
    retire_many(model, {p.group_names[code]: p.i_seq[folded[g == code]] for code in np.unique(g).tolist()})


# ---- Sweeps of stale instances

def sweep(model: Model) -> None:
    """Retire instances that can never complete because a member's start was lost
    (dropped events, a watcher that came late): nobody is inside them and every
    member that did not leave them has since started a later op in the group.

    Behind a flood most instances are stale, so each is not asked of every member
    (at 1,024 ranks that, for every pending instance, cost more than the ingest):
    only the members not yet past its seq, found by bisection, must have left it."""
    ranks = model.ranks
    # group -> its members by the latest seq each has started (-1: none, or not a
    # rank yet): those at or below an instance's seq must all have left it
    behind: dict[str, tuple[list[int], list[int]]] = {}
    for inst in list(model.pending.values()):
        ended = inst.ended
        if not inst.starts.keys() <= ended:
            continue  # a rank is inside
        b = behind.get(inst.group)
        if b is None:
            g = model.groups.get(inst.group)
            if g is None:
                continue
            by = sorted((ranks[m].seqs.get(inst.group, -1) if m in ranks else -1, m)
                        for m in dict.fromkeys(g.ranks))  # a member named twice is one member
            b = behind[inst.group] = ([q for q, _ in by], [m for _, m in by])
        n = bisect.bisect_right(b[0], inst.seq)
        if n <= len(ended) and all(m in ended for m in itertools.islice(b[1], n)):
            fold(model, inst, completed=False)
    while len(model.pending) > MAX_PENDING:
        model.tracker.evicted_instances += 1
        fold(model, next(iter(model.pending.values())), completed=False)
    model.sweep_at = max(SWEEP_FIRST, 2 * len(model.pending))
    model.sweeps += 1
    if model.shedding:
        raise_floors(model, list(model.retired))


def sweep_if_due(model: Model) -> None:
    """The check one event at a time makes after every SWEEP_EVERY-th event; the
    batch path calls it where it stops at one. Twice at one place is once: a
    sweep leaves fewer instances pending than its new mark."""
    if not model.events % SWEEP_EVERY and len(model.pending) > model.sweep_at:
        sweep(model)


# ---- A batch: its plan applied, its slow events in their places

def apply_plan(model: Model, p: Plan) -> None:
    """A batch as its plan says, in event order: each fast instance completes (or is
    left open) at its place among the slow events, which go in one at a time with
    their order-dependent effects held back (`Deferred`); then the batch's counts,
    windows, retirements and flows, the held-back effects in their places."""
    shed = model.shed
    stats = model.stats
    c = p.chunk

    # each whole instance completes where its last member leaves; each holed one
    # opens where its first member enters (while shedding: is counted where its last
    # member present leaves); a late member's instance does neither
    opening = p.holed & ~p.late if not shed else np.zeros(p.nf, bool)
    at = np.where(opening, p.first_pos, p.done_pos)
    act = np.flatnonzero(~p.late)
    order = act[np.argsort(at[act], kind="stable")]
    done = at[order].tolist()
    nf = len(order)
    opens = Openings(model, p) if opening.any() else None
    slow_at = np.flatnonzero(~p.fast)
    slow = slow_at.tolist()
    # `Model.on_op`: each fast op handed on at its end's place among the slow events,
    # as the per-event path would
    ended = FastEnds(c, p) if model.on_op is not None else None
    on_op, k, ne = model.on_op, 0, len(ended) if ended is not None else 0
    d = Deferred()
    j = 0
    one, ranks = ingest_one, c.rank[slow_at].tolist()
    past = (len(c), -1, None)  # after the last slow event: what is left of the fast ones
    for pos, rank, ev in itertools.chain(zip(slow, ranks, c.events(slow_at)), (past,)):
        while j < nf and done[j] < pos:
            i = int(order[j])
            if opens is not None and opening[i]:
                opens.open(i)
            else:
                fold_fast(model, p, i, stats, shed)
            j += 1
        while k < ne and ended.pos[k] < pos:
            on_op(*ended.args(k))
            k += 1
        if ev is None:
            break
        d.pos = pos
        one(model, rank, ev, d)
    ends_many(model, p)
    windows_many(model, p, d)
    if shed:
        retire_plan(model, p)
    if model.flows:
        traffic_many(model, p, d, flows_mod.SHED_FLOW_SAMPLE if shed else 1)


# ---- Rules both paths follow

def device_time_ns(e: OpEnd) -> int | None:
    """The duration an op's statistics use, where it is not the host's: its GPU time
    where the probe measured one (CUDA events around the op on its stream: no queueing
    behind earlier kernels, no poll latency); None for a captured op, which ran nothing
    when it was issued (it runs at each graph replay), and for the first op on a
    communicator, whose time is NCCL's setup: untimed; -1 otherwise, host time from the
    call to the end the probe saw."""
    if e.captured or e.first:
        return None
    return e.device_ns if e.device_ns >= 0 else -1


def op_time_ns(e: OpEnd, s: OpStart) -> int | None:
    """`device_time_ns`, with host time for -1."""
    d = device_time_ns(e)
    return e.t - s.t if d == -1 else d


_P2P: dict[str, bool] = {}  # op name -> is it point-to-point (names come from the wire: capped)


def is_p2p(op: str) -> bool:
    got = _P2P.get(op)
    if got is None:
        got = opcat.is_p2p(op)
        if len(_P2P) < 4096:
            _P2P[op] = got
    return got
