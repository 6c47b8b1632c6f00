"""What the caller's thread leaves to the probe's: turning queued items into the
start and end records of events.json's layout (events.py), once per drain.

Why: a wrapped call on the deferred path (probe/patch.py, CPU with the crash ring
off) queues one list holding the raw call and its two clock reads, nothing else.
Everything derivable from that — the group, the sequence number, the op id, the
tensor's bytes, dtype and shape — is worked out here, in queue order, so the
training thread pays for none of it. The queued item holds the call's arguments
(and so its tensors) until the drain that handles it, one flush interval (~20 ms).

Sequence numbers are taken here, in queue order, for every op (also the starts the
slower paths queue with their GroupInfo and seq key in place of group id and seq):
one counter per group, one thread. A record the caller could not queue (the queue
at its cap) still takes its number, through a Gap it leaves in the queue, so the
numbers after it stay those torch's peers see. With the crash ring on, the caller
takes numbers itself (its slot needs one at once) and nothing here does.

Tensor metadata is read here for any tensor the caller passed before CUDA was up:
no GPU buffer can be among them; a tensor subclass's metadata getters run on this
thread then.
"""

from __future__ import annotations

import threading
from itertools import chain, groupby, islice, repeat
from operator import itemgetter

from commviz import ops as opcat
from commviz.events import E_ID, END, HOST_TOPOLOGY_SINCE, S_ID, START, GroupDef, HostTopology
from commviz.probe.names import dtype_name, reduce_name

# A deferred item: [derive, t0, args, kwargs, t1, extra, op id]. The op id is the
# caller's: ids follow call order on every path. t1 is 0 while the call runs, then
# the clock when it returned, or one of the two markers below (set last: extra is
# in place by then). One C pass (min) tells a run of plain returns.
FN, T0, ARGS, KW, T1, EXTRA, ID = range(7)
ASYNC = -1  # the end comes as a record of its own (a Work, a coalesced batch)
ENDED = -2  # extra holds the end: (t1, error text, peer), for a failed call or a recv's sender

GAP_LOCK = threading.Lock()  # taken only when the queue is at its cap, and to apply a Gap

# In a start record the slower paths queue with a deferred sequence number, the group
# id's slot holds the GroupInfo and the seq's slot its seq key (None: the group's
# collective counter; (direction, peer): a point-to-point one).
S_GROUP, S_SEQ = S_ID + 3, S_ID + 4


class Gap:
    """Ops the caller could not queue (the queue at its cap): their sequence numbers
    are taken where they would have been. O(1) per (group, seq key); filled under
    the probe's gap lock, closed under it when applied, so an op is never added to a
    gap already applied."""

    __slots__ = ("counts", "closed")

    def __init__(self) -> None:
        self.counts: dict = {}
        self.closed = False


class DefaultIs:
    """Queued when the default group is (re)made: an op queued after it with no
    group is on this one, whatever the default is when the drain comes."""

    __slots__ = ("g",)

    def __init__(self, g) -> None:
        self.g = g


class Forget:
    """Queued by destroy_process_group: ops queued before it still find their
    groups; after it the table no longer holds them."""

    __slots__ = ("groups", "infos", "default")

    def __init__(self, groups: dict, infos: list, default: bool) -> None:
        self.groups = groups  # the probe's table, id(pg) -> GroupInfo
        self.infos = infos
        self.default = default


def take(g, key, n: int = 1) -> int:
    """The next `n` sequence numbers of `g` for `key` (see S_SEQ)."""
    if key is None:
        s = g.seq
        g.seq = s + n
        return s
    s = g.p2p_seq.get(key, 0)
    g.p2p_seq[key] = s + n
    return s


class Drain:
    """One sender's state across drains: the group ops without one are on, the
    deferred items still in their call, and one batch's tensor metadata."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self.default = None
        self.pending: list = []  # deferred items whose call had not returned at their drain
        self.out: list = []
        self.tensors: dict = {}

    def fields(self, x) -> tuple:
        """(x, bytes, dtype, shape), once per tensor per drain: the cache holds each
        tensor while it does, so an id stands for one tensor throughout."""
        hit = self.tensors.get(id(x))
        if hit is None:
            hit = self.tensors[id(x)] = (x, x.nbytes, dtype_name(x.dtype), x.shape)
        return hit


def drain(sender, got: list) -> list:
    """The events for the records `got` (in queue order), stamping seqs and resolving
    what the caller left raw. Called by Sender._drain."""
    d = getattr(sender, "_derive", None)
    if d is None:
        d = sender._derive = Drain(sender)
    out = d.out = []
    inflight = sender.inflight
    if d.pending:
        _recheck(d, inflight)
    health = sender.health
    for kind, recs in groupby(got, type):
        if kind is list:  # deferred items: runs of one op in C where they can (op_deriver's run)
            for fn, items in groupby(recs, _FN):
                items = list(items)
                if len(items) > 2:
                    try:
                        fn.run(items, d)
                        continue
                    except Exception as exc:
                        health.internal("derive run", exc)
                each(items, d)
        elif kind is tuple:  # the slower paths' records
            for rec in recs:
                if rec[0] == START:
                    if type(rec[S_SEQ]) is not int:
                        rec = _stamp(rec)
                    inflight[rec[S_ID]] = rec
                else:
                    op_id = rec[E_ID]
                    if type(op_id) is list:  # the end of a deferred item
                        op_id = op_id[ID]
                        rec = (rec[0], op_id, *rec[2:])
                    inflight.pop(op_id, None)
                out.append(rec)
        else:
            for rec in recs:
                _other(d, kind, rec)
    d.tensors = {}
    d.out = []
    return out


_FN, _T0, _ARGS, _KW, _T1, _EXTRA, _ID = (itemgetter(i) for i in range(7))
_1, _2, _3 = itemgetter(1), itemgetter(2), itemgetter(3)


def each(items: list, d: Drain) -> None:
    for rec in items:
        try:
            rec[FN](rec, d)
        except Exception as exc:
            if rec[T1] != ENDED or not rec[EXTRA][1]:  # a call torch rejected has bad arguments: no event, no error of ours
                d.sender.health.internal("derive", exc)


def _other(d: Drain, kind, rec) -> None:
    """Samples, groups, markers: what is neither a deferred item nor an op record."""
    sender = d.sender
    if kind is Gap:
        with GAP_LOCK:
            rec.closed = True
        for (g, key), n in rec.counts.items():
            take(g, key, n)
    elif kind is DefaultIs:
        d.default = rec.g
    elif kind is Forget:
        _forget(d, rec)
    else:
        if kind is GroupDef:
            sender.groups.append(rec)
        elif kind is HostTopology:
            # schema 2's kind, queued once by the sampler thread: this rank's frames
            # say 2 from here on (as after an Audit), a resync's too
            sender.topology = rec
            sender.schema = max(sender.schema, HOST_TOPOLOGY_SINCE)
        d.out.append(rec)


def _recheck(d: Drain, inflight: dict) -> None:
    keep = []
    for item in d.pending:
        t1 = item[T1]
        if t1 == 0:
            keep.append(item)
        elif t1 != ASYNC:
            _end(d, item, item[ID], t1)
            inflight.pop(item[ID], None)
    d.pending = keep


def _end(d: Drain, item, op_id: int, t1: int) -> None:
    if t1 == ENDED:
        t1, error, peer = item[EXTRA]
        d.out.append((END, op_id, t1, error, -1, peer))
    else:
        d.out.append((END, op_id, t1, "", -1, -1))


def _stamp(rec: tuple) -> tuple:
    g = rec[S_GROUP]
    return (*rec[:S_GROUP], g.gid, take(g, rec[S_SEQ]), *rec[S_SEQ + 1:])


def _forget(d: Drain, f: Forget) -> None:
    if f.default:
        d.default = None
    for info in f.infos:
        if f.groups.get(id(info.pg)) is info:
            del f.groups[id(info.pg)]


def op_deriver(probe, spec: opcat.OpSpec, am):
    """The derive step of one op that passes one tensor (the deferred path's ops),
    specialised here, at patch time, as the wrapper is."""
    p2p, always_async, seq_key, bi, gi, ai, ri, pi, red_default, red_default_name = am.fast_positions()
    name, groups = spec.name, probe.groups
    non_member = probe.c10d.GroupMember.NON_GROUP_MEMBER

    def group_of(d: Drain, group):
        if group is None:
            g = d.default
            if g is None:
                g = d.default = probe.group_info(None, d.out)
            return g
        g = groups.get(id(group))
        if g is None or g.pg is not group:
            if group is non_member:
                return None
            g = probe.group_info(group, d.out)
        return g

    def derive(item, d: Drain) -> None:
        args, kwargs = item[ARGS], item[KW]
        if kwargs:
            x, group, peer, is_async, red = am.keyword_fields(args, kwargs)
        else:
            n = len(args)
            x = args[bi]
            group = args[gi] if n > gi else None
            peer = (args[pi] if n > pi else None) if p2p else -1
            is_async = always_async or (n > ai and bool(args[ai]))
            red = red_default_name if n <= ri or args[ri] is red_default else reduce_name(args[ri])
        g = d.default if group is None else groups.get(id(group))
        if g is None or group is not None and g.pg is not group:
            g = group_of(d, group)
            if g is None:
                return  # this rank is not in the group: torch did nothing either
        if p2p:
            if peer is None:
                peer = am.rooted(args, kwargs, g)
            seq = take(g, (seq_key, peer))
        else:
            seq = g.seq
            g.seq = seq + 1
        op_id = item[ID]
        tensors = d.tensors
        hit = tensors.get(id(x))
        if hit is None:
            hit = d.fields(x)
        start = (START, op_id, item[T0], name, g.gid, seq, hit[1], hit[2], hit[3], peer, -1, is_async, red)
        t1 = item[T1]
        if t1 > 0:  # the common case: returned, no inflight entry
            d.out += (start, (END, op_id, t1, "", -1, -1))
            return g, start
        d.out.append(start)
        if t1 == 0:
            item[ARGS] = item[KW] = None  # the caller holds them while it is in the call
            d.pending.append(item)
        elif t1 != ASYNC:
            _end(d, item, op_id, t1)
            return g, start
        d.sender.inflight[op_id] = start
        return g, start

    head, tail = itemgetter(slice(0, bi)), itemgetter(slice(bi + 1, None))

    def run(items: list, d: Drain) -> None:
        """Three or more calls of this op in a row: when they differ only in their
        tensor, ids and times (a training loop's calls do), their records are built in
        C (zip, map) from the first one's; else one by one."""
        t1s = list(map(_T1, items))
        if min(t1s) <= 0:
            return each(items, d)  # in flight, async, failed, or a recv's rank: one by one
        first, rest = items[0], items[1:]
        args_l, kws = list(map(_ARGS, rest)), list(map(_KW, rest))
        args0, kw0 = first[ARGS], first[KW]
        try:  # equal heads and tails: equal lengths too
            same = (set(map(tail, args_l)) == {tail(args0)} and (bi == 0 or set(map(head, args_l)) == {head(args0)})
                    and (not any(kws) and not kw0 or set(map(frozenset, map(dict.items, kws))) == {frozenset(kw0.items())}))
        except TypeError:  # an argument that cannot be hashed
            same = False
        if not same:
            return each(items, d)
        got = derive(first, d)
        if got is None:
            return  # not in the group, nor are the others
        try:
            _rest(got, rest, args_l, t1s, args0, d)
        except Exception as exc:  # the first is out: the others one by one
            d.sender.health.internal("derive run", exc)
            each(rest, d)

    def _rest(got, rest, args_l, t1s, args0, d: Drain) -> None:
        g, start = got
        k = len(rest)
        if len(args0) > bi:
            xs = list(map(itemgetter(bi), args_l))
            if set(map(id, xs)) == {id(args0[bi])}:
                nb, dt, sh = repeat(start[6], k), repeat(start[7], k), repeat(start[8], k)
            else:
                fields = list(map(d.fields, xs))
                nb, dt, sh = map(_1, fields), map(_2, fields), map(_3, fields)
        else:  # passed by keyword, and the same in every call
            nb, dt, sh = repeat(start[6], k), repeat(start[7], k), repeat(start[8], k)
        s0 = take(g, None if not p2p else (seq_key, start[9]), k)
        ids = list(map(_ID, rest))
        starts = zip(repeat(START), ids, map(_T0, rest), repeat(name), repeat(start[4]), range(s0, s0 + k), nb, dt, sh,
                     repeat(start[9]), repeat(-1), repeat(start[11]), repeat(start[12]))
        ends = zip(repeat(END), ids, islice(t1s, 1, None), repeat(""), repeat(-1), repeat(-1))
        d.out += chain.from_iterable(zip(starts, ends))

    derive.run = run

    def seq_target(args, kwargs, default):
        """(GroupInfo, seq key) of a call the caller could not queue (a Gap's entry), or
        None when this rank is not in its group."""
        if kwargs:
            _, group, peer, _, _ = am.keyword_fields(args, kwargs)
        else:
            group = args[gi] if len(args) > gi else None
            peer = (args[pi] if len(args) > pi else None) if p2p else -1
        g = default() if group is None else probe.group_info(group)
        if g is None:
            return None
        if not p2p:
            return g, None
        return g, (seq_key, am.rooted(args, kwargs, g) if peer is None else peer)

    derive.seq_target = seq_target
    return derive
