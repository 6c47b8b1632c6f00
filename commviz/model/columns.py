"""Ingesting a run of events a batch at a time, leaving exactly the state that
`Model.ingest` leaves one event at a time — except while the model sheds detail
(model/overload.py): then a collective whose members present all entered and left in
the batch is counted at once (model/retired.py), where one event at a time holds it
open until a late member or the sweep; ranks' counts, bytes, seqs and ids, and each
collective's count, are the same either way, `pending` and the sweeps are not.

A Python call per event costs microseconds; a job of a thousand ranks sends far more
than a million events a second. Nearly all of them are the starts and ends of
collectives that run cleanly: every member enters once with the same arguments,
leaves once without error. Such an instance whose whole life lies inside the batch —
its key unseen before, every member's start and end in the batch — changes the model
only by sums and maxima (counts, bytes, sequence numbers, last-seen times), by one
statistics row and one straggler arrival when its last member leaves, and by each
rank's recent-op window. Those are computed here with numpy, a batch at a time.

Everything else — hellos, group definitions, p2p, errors, instances that straddle
the batch's edges, ranks whose op ids have gaps — goes through `Model.ingest` in its
place in the order. The few effects that depend on order (statistics and straggler
windows, each rank's window of recent ops and last op, flows) are applied in
position order across both kinds: the slow path's are deferred while the batch runs
(`Deferred`), the fast instances' completions are interleaved with the slow events.

A model with an `on_op` hook (the streaming Perfetto export) is handed each fast op
at its end's place among the slow events, so the hook sees every op once, in the
order the per-event path would hand them on (a `keep_ops` model goes one event at a
time).

The invariants that make this exact are checked, not assumed; a batch that breaks
one (an audit inside it) is ingested one event at a time, and one that reaches a
check of the stale-instance sweep with too many instances open stops there, lets
the model check (`Model.sweep_if_due`), and goes on in bulk.
"""

from __future__ import annotations

import gc
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from commviz import ops as opcat
from commviz.events import OpStart
from commviz.model import flows as flows_mod
from commviz.model.audit import WINDOWS
from commviz.model.keys import unique, unique_sorted
from commviz.model.seen import SeenIds
from commviz.model.store import END, OTHER, START, Chunk
from commviz.model.straggler import Arrival
from commviz.model.track import InFlight, Instance

if TYPE_CHECKING:
    from commviz.model.state import Model

# Kinds a batch may hold and still take the fast path: none of them reads or changes
# state a fast instance touches (an Audit reads the in-flight table and windows, a
# Hello moves a clock offset, a GroupDef can complete instances, a Goodbye or Stack
# is rare enough to go slowly). The kinds and the readers live in model/store.py.
MIN_BATCH = 256  # below this the per-event path is as quick
TAIL = 8192  # events at a trace chunk's end where `tail_cut` looks for a cut
SETTLE_MIN = 32768  # a smaller live batch is ingested whole: carrying its tail costs more than it saves
# Cuts for ranks whose ids span too far (`_span_cut`) per batch: behind a flood a
# few; one per start only from a rank far from itself every time, which planning the
# rest again after each would make quadratic.
MAX_SPAN_CUTS = 16
MAX_BATCH = 262144  # a collective of 1,024 ranks whose frames carry 64 steps spans 131,072 events
ID_BITS = 40  # (rank, op id) and (group, seq) packed into one int64 key
ID_MAX = 1 << ID_BITS

def rank_durations(start_t: np.ndarray, end_t: np.ndarray, device_ns: np.ndarray) -> np.ndarray:
    """Each rank's time in an op, as `Tracker.leave` takes it (`state.device_time_ns`):
    its device time where the probe measured one, else end minus start on the rank's
    clock. (Captured ops, untimed, never reach the batch path.)"""
    return np.where(device_ns >= 0, device_ns, end_t - start_t)


class Deferred:
    """The order-dependent effects of the slow events of a batch, each with the
    position of the event that made it, applied after the batch in order."""

    __slots__ = ("pos", "ends", "traffic")

    def __init__(self) -> None:
        self.pos = 0
        self.ends: list[tuple] = []  # (pos, rank, group, start t, end t, op, end wall, OpStart)
        self.traffic: list[tuple] = []  # (pos, args, kwargs) of Traffic.op_end

    def end(self, rank: int, s: OpStart, end_t: int, end_wall: int) -> None:
        self.ends.append((self.pos, rank, s.group, s.t, end_t, s.op, end_wall, s))

    def credit(self, args: tuple, kwargs: dict) -> None:
        self.traffic.append((self.pos, args, kwargs))



def ingest_events(model: Model, ranks: Sequence[int], events: Sequence, settle: bool = False) -> int:
    """`model.ingest(ranks[i], events[i])` for every i, in order — in batches.

    `settle`: a live source that will hand on more — ingest only up to a point in the
    second half where the fewest collectives are half-way (begun before it, ended
    after it); returns how many were ingested, the caller keeps the rest and hands
    them on first next time. Without it (or if there is no better point), all."""
    if model.shed and model.pending:
        model.count_idle_pending()
    if len(events) < MIN_BATCH or model.keep_ops or model.deferring:
        _one_by_one(model, ranks.tolist() if isinstance(ranks, np.ndarray) else ranks, events)
        return len(events)
    with no_gc():
        rk = ranks if isinstance(ranks, np.ndarray) else np.fromiter(ranks, np.int64, len(ranks))
        chunk = Chunk(events, rk)
        cut = settle_point(chunk, model.groups) if settle and len(chunk) >= SETTLE_MIN else len(chunk)
        ingest_chunk(model, chunk.part(0, cut) if cut < len(chunk) else chunk)
    return cut


def tail_cut(c: Chunk, groups: dict | None = None) -> int:
    """`settle_point` among a trace chunk's last TAIL events only: the collectives a
    merged trace's chunk cuts lie at its end (a pass over the whole chunk cost more
    than the per-event path it saves)."""
    n = len(c)
    if n < SETTLE_MIN:
        return n
    lo = n - min(n, TAIL)
    return lo + settle_point(c.part(lo, n), groups)


def settle_point(c: Chunk, groups: dict | None = None) -> int:
    """The cut in the second half of `c` that leaves the fewest collective instances
    with events on both sides (the latest such cut). An instance still missing an end,
    or (by `groups`, name -> GroupDef) a member's start, runs past the end of `c`."""
    n = len(c)
    sp = np.flatnonzero((c.kind == START) & (c.seq >= 0))
    ep = np.flatnonzero(c.kind == END)
    if not len(sp) or n < 2 * MIN_BATCH:
        return n
    skey = (c.rank[sp] << ID_BITS) | (c.id[sp] & (ID_MAX - 1))
    o = np.argsort(skey, kind="stable")
    ekey = (c.rank[ep] << ID_BITS) | (c.id[ep] & (ID_MAX - 1))
    j = np.minimum(np.searchsorted(skey[o], ekey), len(sp) - 1)
    hit = skey[o][j] == ekey
    last = np.full(len(sp), n)  # an instance's events run from its first start to its last end
    ended = np.zeros(len(sp), bool)
    ended[o[j[hit]]] = True
    last[ended] = sp[ended]
    np.maximum.at(last, o[j[hit]], ep[hit])
    gidx: dict[str, int] = {}
    gsig = np.array([gidx.setdefault(k[1], len(gidx)) for k in c.sigs], np.int64)
    group = gsig[c.sig[sp]]
    _, inst, count = unique((group << ID_BITS) | (c.seq[sp] & (ID_MAX - 1)), inverse=True, counts=True)
    first_i = np.full(len(count), n)
    last_i = np.full(len(count), -1)
    np.minimum.at(first_i, inst, sp)
    np.maximum.at(last_i, inst, last)
    if groups:
        size = np.array([len(groups[g].ranks) if g in groups else 0 for g in gidx], np.int64)
        g_of = np.zeros(len(count), np.int64)
        g_of[inst] = group
        last_i[count < size[g_of]] = n  # a member has not started it yet
    # halfway[P]: instances with an event before P and one at or after it
    diff = np.zeros(n + 2, np.int64)
    np.add.at(diff, first_i + 1, 1)
    np.add.at(diff, last_i + 1, -1)
    halfway = np.cumsum(diff)[: n + 1]
    lo = n // 2
    best = halfway[lo:].min()
    return int(lo + np.flatnonzero(halfway[lo:] == best)[-1])


class no_gc:
    """The batch builds many short-lived tuples and lists, none in a cycle: the cyclic
    collector, which would walk every object the model holds each time, is held off."""

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc) -> None:
        if self.was:
            gc.enable()


def ingest_chunk(model: Model, chunk: Chunk) -> None:
    """Every event of `chunk` in order; an event of a kind outside `store._KIND` is
    ingested on its own, between the batches before and after it."""
    if model.keep_ops or model.deferring:
        _chunk_one_by_one(model, chunk)
        return
    lo = 0
    n = len(chunk)
    for i in np.flatnonzero(chunk.kind == OTHER).tolist() + [n]:
        while lo < i:
            hi = min(i, lo + MAX_BATCH)
            _batch(model, chunk.part(lo, hi))
            lo = hi
        if i < n:
            model.ingest(int(chunk.rank[i]), chunk.event(i))
        lo = i + 1


def _one_by_one(model: Model, ranks: Sequence[int], events: Sequence) -> None:
    ingest = model.ingest
    for r, ev in zip(ranks, events):
        ingest(r, ev)


def _chunk_one_by_one(model: Model, c: Chunk) -> None:
    ingest = model.ingest
    for r, ev in zip(c.rank.tolist(), c.events(np.arange(len(c)))):
        ingest(r, ev)


def _batch(model: Model, c: Chunk, span_cuts: list | None = None) -> None:
    # the span cuts left to this batch, its parts included: the rest is planned again
    # after each, so at most MAX_SPAN_CUTS
    span_cuts = [MAX_SPAN_CUTS] if span_cuts is None else span_cuts
    while len(c):
        if len(c) < MIN_BATCH:
            _chunk_one_by_one(model, c)
            return
        plan = _plan(model, c, span_cuts[0] > 0)
        if type(plan) is _SpanCut:
            span_cuts[0] -= 1
        if plan is None:
            _chunk_one_by_one(model, c)
            return
        if not isinstance(plan, int):
            _apply(model, c, plan)
            model.sweep_if_due()  # where the batch ends on a check, as the per-event path would
            return
        if not 0 < plan < len(c):  # a cut that would not shorten the batch: never loop on it
            _chunk_one_by_one(model, c)
            return
        # The per-event path may sweep just before event `plan`: the events before it
        # go in bulk, the model checks, and the rest follow.
        _batch(model, c.part(0, plan), span_cuts)
        c = c.part(plan, len(c))


class _Plan:
    """What the fast instances of a batch do, in columns."""


class _SpanCut(int):
    """A cut `_span_cut` asked for (an int, as a sweep's cut is)."""


def _plan(model: Model, c: Chunk, span_cuts: bool = True):
    """The fast instances of `c` and what they do; None where the batch is better
    taken one event at a time; a position where the batch must stop for a sweep the
    per-event path may run just before it (`_sweep_point`), or where a rank's ids
    would span too far to go fast (`_span_cut`, if `span_cuts`)."""
    x = _columns(c)
    if x is None:
        return None
    sigs = _signatures(model, c.sigs)
    r = _rank_floors(model, x)
    cut = _span_cut(x, r) if span_cuts else None
    if cut is not None:
        return _SpanCut(cut)
    m = _match_ends(x, sigs, r)
    inst = _instances(x, sigs)
    if inst is None:
        return None
    reopen, touched = _reopening(model, x, m)
    ok, holed, late = _fast_mask(model, x, sigs, inst, m.start_ok, touched)
    take = ok | holed | late
    if not take.any():  # nothing to gain: no halves either
        return None
    # while shedding a holed instance is counted where its last member present leaves
    closes = ok | holed if model.shed else ok
    cut = _sweep_point(model, c, x, sigs, m, inst, closes, late, reopen)
    if cut < len(c):
        return cut
    return _build_plan(c, x, sigs, r, m, inst, take, holed, late)


class _Cols(NamedTuple):
    """The starts' and ends' columns of a batch: `sp`, `ep` their positions in it."""
    sp: np.ndarray
    ep: np.ndarray
    s_id: np.ndarray
    s_t: np.ndarray
    s_seq: np.ndarray
    s_sig: np.ndarray
    s_bytes: np.ndarray
    s_rank: np.ndarray
    e_id: np.ndarray
    e_t: np.ndarray
    e_err: np.ndarray
    e_bytes: np.ndarray
    e_dev: np.ndarray
    e_rank: np.ndarray


def _columns(c: Chunk) -> _Cols | None:
    """None where there is nothing to pair (no start or no end), or where a rank, op id
    or seq would not fit the int64 keys the later phases pack them into."""
    sp = np.flatnonzero(c.kind == START)
    ep = np.flatnonzero(c.kind == END)
    if not len(sp) or not len(ep):
        return None
    rk = c.rank
    s_id, s_t, s_seq, s_sig = c.id[sp], c.t[sp], c.seq[sp], c.sig[sp]
    e_id, e_t = c.id[ep], c.t[ep]
    table = c.sigs
    s_bytes = np.array([k[2] for k in table], np.int64)[s_sig]
    # an error or a captured op (untimed) goes the per-event way
    e_err, e_bytes, e_dev = c.err[ep], c.ebytes[ep], c.dev[ep]
    s_rank = rk[sp]
    e_rank = rk[ep]
    if (s_id.min() < 0 or s_id.max() >= ID_MAX or rk.min() < 0 or rk.max() >= (1 << (62 - ID_BITS))
            or s_seq.max() >= ID_MAX):
        return None
    return _Cols(sp, ep, s_id, s_t, s_seq, s_sig, s_bytes, s_rank, e_id, e_t, e_err, e_bytes, e_dev, e_rank)


class _Sigs(NamedTuple):
    """Per signature: its group (a code into `group_names`, `members`), whether it is
    not p2p, whether it can be a fast collective; per group code, its member count."""
    sig_list: list
    group_names: list
    members: list
    sig_group: np.ndarray
    sig_np2p: np.ndarray
    sig_coll: np.ndarray
    sig_members: np.ndarray


def _signatures(model: Model, table: list) -> _Sigs:
    """The facts that hang on a start's signature, worked out once per signature (a
    batch has few) rather than once per start."""
    sig_list = list(table)
    group_names = list(dict.fromkeys(k[1] for k in sig_list))
    gcode = {g: i for i, g in enumerate(group_names)}
    members = [model.groups[g].ranks if g in model.groups else None for g in group_names]
    sig_group = np.array([gcode[k[1]] for k in sig_list], np.int64)
    sig_np2p = np.array([not opcat.is_p2p(k[0]) for k in sig_list], bool)
    sig_coll = sig_np2p & np.array([bool(members[gcode[k[1]]]) for k in sig_list], bool)
    sig_members = np.array([len(m) if m else 0 for m in members], np.int64)
    return _Sigs(sig_list, group_names, members, sig_group, sig_np2p, sig_coll, sig_members)


class _Ranks(NamedTuple):
    """Per rank of the batch's starts (`ur`, sorted): its start count, state, clock
    offset and whether its starts can go fast; `skey` each start's (rank, id), `s_ri`
    each start's index into `ur`; `ids`, from `first`, each rank's ids in order;
    `order` sorts `skey` into `sk`; `distinct` whether no two starts share a (rank, id);
    `falls` per rank whether its ids go down somewhere in the batch's order."""
    skey: np.ndarray
    ur: np.ndarray
    cnt: np.ndarray
    offsets: np.ndarray
    states: list
    rank_ok: np.ndarray
    s_ri: np.ndarray
    ids: np.ndarray
    first: np.ndarray
    order: np.ndarray
    sk: np.ndarray
    distinct: bool
    falls: np.ndarray


def _rank_floors(model: Model, x: _Cols) -> _Ranks:
    """Ranks whose op ids in the batch are new and distinct: all above the highest seen
    (`_floors`), none twice. Then no start is a duplicate, and SeenIds ends the same
    whatever the order they are added in (`_seen_ids`). A gap among them (a frame
    lost on the way) costs only the instances that frame's ops belonged to: the
    rank's other ops still go fast."""
    s_rank, s_id = x.s_rank, x.s_id
    skey = (s_rank << ID_BITS) | s_id
    order = np.argsort(skey, kind="stable")
    sk = skey[order]
    if len(sk) > 1 and not (np.diff(sk) > 0).all():
        distinct_ok = False
    else:
        distinct_ok = True
    ur, first, cnt = unique_sorted(s_rank[order], index=True, counts=True)
    ids_sorted = s_id[order]
    floors, offsets, states = _floors(model, ur)
    lo_id, hi_id = ids_sorted[first], ids_sorted[first + cnt - 1]
    # A rank's ids go down where, sorted by id, a start came before the one below it.
    # (a rank's first start compares with the rank before it: not counted)
    down = np.flatnonzero(np.diff(order) < 0) + 1
    g = np.searchsorted(first, down, "right") - 1
    falls = np.zeros(len(ur), bool)
    falls[g[first[g] != down]] = True
    # ids further apart than SeenIds.SPAN that go down: one by one, the newest would
    # make the oldest count as seen (a duplicate) before it came. Ids that only rise,
    # as a probe numbers its ops, never meet that however far apart (behind a flood a
    # batch holds a few of each rank's frames from far apart: ~5 cuts a batch at 64 ranks).
    rank_ok = (floors > -2) & (lo_id > floors) & ((hi_id - lo_id < SeenIds.SPAN) | ~falls)
    if not distinct_ok:
        dup = np.zeros(len(sk), bool)
        dup[1:] = np.diff(sk) == 0
        bad = np.unique(s_rank[order][dup | np.roll(dup, -1)])
        rank_ok &= ~np.isin(ur, bad)
    s_ri = np.searchsorted(ur, s_rank)  # index into ur of each start's rank
    return _Ranks(skey, ur, cnt, offsets, states, rank_ok, s_ri, ids_sorted, first, order, sk, distinct_ok,
                  falls)


def _span_cut(x: _Cols, r: _Ranks) -> int | None:
    """Where to cut a batch in which a rank's ids span `SeenIds.SPAN` or more and go
    down somewhere (two processes claiming the rank, a resend among new ops): just
    before its first start that far from its first one in the batch, so the part
    before goes fast and the rest is planned again. Such a rank cannot go fast
    (`_rank_floors`), and every instance it is in goes one event at a time with it.
    None where no rank needs a cut."""
    # (from each rank's first start in the batch's order, which is never far: the cut
    # is past it, so each part is shorter; ids that go down that far are cut too)
    if not r.falls.any():
        return None
    first_at = np.full(len(r.ur), len(x.s_id))
    np.minimum.at(first_at, r.s_ri, np.arange(len(x.s_id)))
    far = (np.abs(x.s_id - x.s_id[first_at][r.s_ri]) >= SeenIds.SPAN) & r.falls[r.s_ri]
    if not far.any():
        return None
    return int(x.sp[far].min())


def _floors(model: Model, ur: np.ndarray) -> tuple:
    """Per rank (`ur`): the op id its new ids must all be above (the highest it has
    started: then none is a duplicate, `SeenIds.add_sorted`), its clock offset and
    its state."""
    floors = np.full(len(ur), -2, np.int64)  # -2: the rank cannot take the fast path
    offsets = np.zeros(len(ur), np.int64)
    states = []
    for i, r in enumerate(ur.tolist()):
        st = model.ranks.get(r)
        states.append(st)
        if st is None:
            continue
        seen = st.seen_ids
        offsets[i] = st.offset_ns
        floors[i] = seen.top
    return floors, offsets, states


class _Ends(NamedTuple):
    """`ekey` each end's (rank, id); `match` each start's end (an index into the end
    columns, valid where `start_ok`); `start_ok` whether the start can go fast;
    `loose` the ends that may leave an op begun before the batch."""
    ekey: np.ndarray
    match: np.ndarray
    start_ok: np.ndarray
    loose: np.ndarray


def _match_ends(x: _Cols, sigs: _Sigs, r: _Ranks) -> _Ends:
    """Each start's end: exactly one in the batch with its (rank, id), after it, clean.
    A start can go fast only with such an end, a collective signature, a seq and a
    rank whose ids run on (`_rank_floors`)."""
    s_id, s_sig, s_seq, e_id, skey = x.s_id, x.s_sig, x.s_seq, x.e_id, r.skey
    ekey = (x.e_rank << ID_BITS) | np.clip(e_id, 0, ID_MAX - 1)
    e_order = np.argsort(ekey, kind="stable")
    ek = ekey[e_order]
    # looked up in sorted order (each search starts where the last ended: a third of
    # the time of searching them as they lie), then put back in the starts' order
    lo, hi = np.empty(len(skey), np.int64), np.empty(len(skey), np.int64)
    lo[r.order] = np.searchsorted(ek, r.sk, "left")
    hi[r.order] = np.searchsorted(ek, r.sk, "right")
    once = hi - lo == 1
    match = e_order[np.minimum(lo, len(ek) - 1)]  # index into ends (valid where once)
    valid_e = (e_id[match] == s_id) & (e_id[match] >= 0)
    start_ok = (sigs.sig_coll[s_sig] & (s_seq >= 0) & r.rank_ok[r.s_ri] & once & valid_e
                & (x.ep[match] > x.sp) & ~x.e_err[match])
    # An end may leave an op begun before the batch (and so enter its collective) only
    # if no start of a rank whose ids are new pairs with it
    loose = np.ones(len(ekey), bool)
    loose[match[r.rank_ok[r.s_ri] & once]] = False
    return _Ends(ekey, match, start_ok, loose)


class _Inst(NamedTuple):
    """The batch's collective starts (`coll`, indices into the start columns) by
    instance: `uk` each instance's (group, seq), `inv` each start's instance, `icnt`
    each instance's start count."""
    coll: np.ndarray
    uk: np.ndarray
    inv: np.ndarray
    icnt: np.ndarray


def _instances(x: _Cols, sigs: _Sigs) -> _Inst | None:
    """Instances: every collective start of the batch, fast or not, by (group, seq);
    None where there is none."""
    coll = np.flatnonzero(sigs.sig_coll[x.s_sig] & (x.s_seq >= 0))
    if not len(coll):
        return None
    ikey = (sigs.sig_group[x.s_sig[coll]] << ID_BITS) | x.s_seq[coll]
    uk, inv, icnt = unique(ikey, inverse=True, counts=True)
    return _Inst(coll, uk, inv, icnt)


def _sweep_point(model: Model, c: Chunk, x: _Cols, sigs: _Sigs, m: _Ends, inst: _Inst, whole: np.ndarray,
                 never: np.ndarray, reopen: int) -> int:
    """No sweep of stale instances may run inside a batch: the per-event path checks
    after every few thousand events (`model.sweep_checks`) and sweeps if more than
    `model.sweep_room()` more instances are open by then. In its order every instance
    is open from its first start (whole ones until their last member leaves; any
    other, as far as this can tell, to the end of the batch; an end that leaves an op
    begun before the batch may re-open one: `reopen` of them). Just past the first
    check where that bound passes the mark (the batch stops there and the model
    checks); len(c) where it never does."""
    checks = model.sweep_checks(len(c))
    # (`whole`: the instances that close where their last member present leaves;
    # `never`: late members of instances counted while shedding, which open nothing)
    np2p = sigs.sig_np2p[x.s_sig] & (x.s_seq >= 0)
    if not len(checks) or not np2p.any():
        return len(c)
    keys = (sigs.sig_group[x.s_sig[np2p]] << ID_BITS) | x.s_seq[np2p]
    uk, inv = unique(keys, inverse=True)
    first = np.full(len(uk), len(c))
    np.minimum.at(first, inv, x.sp[np2p])
    close = np.full(len(uk), len(c) + 1)
    w = np.flatnonzero(whole)
    if len(w):  # a whole instance closes after its last member's end
        last = np.full(len(inst.uk), -1)
        np.maximum.at(last, inst.inv, x.ep[m.match[inst.coll]])
        close[np.searchsorted(uk, inst.uk[w])] = last[w] + 1
    v = np.flatnonzero(never)
    if len(v):
        at_v = np.searchsorted(uk, inst.uk[v])
        close[at_v] = first[at_v]
    diff = np.zeros(len(c) + 2, np.int64)
    np.add.at(diff, first, 1)
    np.add.at(diff, close, -1)
    at = np.asarray(checks)
    over = np.flatnonzero(np.cumsum(diff)[at] > model.sweep_room() - reopen)
    return int(at[over[0]]) + 1 if len(over) else len(c)


def _reopening(model: Model, x: _Cols, m: _Ends) -> tuple[int, set]:
    """How many ends of the batch leave an op in flight since an earlier one (a frame
    whose start was lost leaves orphans: they change nothing), and the (group, seq) of
    those ops: such an end enters its collective again (one evicted from `pending`
    while a rank was inside, say), so no instance of that key may go in bulk."""
    u = np.flatnonzero(m.loose)
    n, keys = 0, set()
    if not len(u):
        return n, keys
    get = model.ranks.get
    for rank, i in zip(x.e_rank[u].tolist(), x.e_id[u].tolist()):
        st = get(rank)
        fl = st.inflight.get(i) if st is not None else None
        if fl is not None:
            n += 1
            keys.add((fl.start.group, fl.start.seq))
    return n, keys


def _fast_mask(model: Model, x: _Cols, sigs: _Sigs, inst: _Inst, start_ok: np.ndarray, touched: set) -> tuple:
    """Per instance, whether it goes fast: only one whose whole life lies cleanly in the
    batch (each member's start exactly once, each able to go fast, one signature) and
    that the model does not already hold open changes the model by sums alone."""
    coll, uk, inv, icnt = inst
    s_sig, s_rank, sig_group, members = x.s_sig, x.s_rank, sigs.sig_group, sigs.members
    ni = len(uk)
    i_group = uk >> ID_BITS
    whole = icnt == sigs.sig_members[i_group]
    ok = np.bincount(inv, weights=~start_ok[coll], minlength=ni) == 0
    sig_c = s_sig[coll]
    smin = np.full(ni, np.iinfo(np.int64).max)
    smax = np.full(ni, -1)
    np.minimum.at(smin, inv, sig_c)
    np.maximum.at(smax, inv, sig_c)
    ok &= smin == smax
    # Members exactly: as many starts as members, distinct ranks, all of them members.
    rank_c = s_rank[coll]
    o2 = np.lexsort((rank_c, inv))
    same = (inv[o2][1:] == inv[o2][:-1]) & (rank_c[o2][1:] == rank_c[o2][:-1])
    if same.any():
        ok[np.unique(inv[o2][1:][same])] = False
    member = np.zeros(len(coll), bool)
    for g, mem in enumerate(members):
        sel = sig_group[sig_c] == g
        if mem and sel.any():
            member[sel] = np.isin(rank_c[sel], np.fromiter(mem, np.int64, len(mem)))
    ok &= np.bincount(inv, weights=~member, minlength=ni) == 0
    i_seq = uk & (ID_MAX - 1)
    if model.pending or touched:  # held open already, or to be entered by an end of an older op
        for i in np.flatnonzero(ok).tolist():
            key = (sigs.group_names[i_group[i]], int(i_seq[i]))
            if key in model.pending or key in touched:
                ok[i] = False
    # Late members of instances counted while shedding (model/retired.py): they count
    # for their ranks and open nothing; outside a spell they go the per-event way.
    late = np.zeros(ni, bool)
    if model.retired:
        for g in np.unique(i_group[ok]).tolist():
            rt = model.retired.get(sigs.group_names[g])
            if rt is not None:
                sel = np.flatnonzero(ok & (i_group == g))
                late[sel] = rt.mask(i_seq[sel])
        if not model.shed:
            ok &= ~late
            late[:] = False
    return ok & whole & ~late, ok & ~whole & ~late, late


def _build_plan(c: Chunk, x: _Cols, sigs: _Sigs, r: _Ranks, m: _Ends, inst: _Inst, ok: np.ndarray,
                holed: np.ndarray, late: np.ndarray) -> _Plan:
    """The `_Plan` of the fast instances (`ok`): per fast start and its end, in the
    order of the start columns; then per fast instance (`_plan_instances`). Those
    `holed` (a member's start not in the batch: a frame lost, or to come) do all a
    whole one does but complete: they are left open, as the per-event path leaves
    them — or, while shedding, counted at once. Those `late` (members of an instance
    counted while shedding) count for their ranks only."""
    sp, ep, s_t, e_t, s_seq, s_sig = x.sp, x.ep, x.s_t, x.e_t, x.s_seq, x.s_sig
    coll, inv = inst.coll, inst.inv
    offsets = r.offsets
    fs = coll[ok[inv]]  # fast starts (indices into the start columns)
    finv = np.searchsorted(np.flatnonzero(ok), inv[ok[inv]])  # their fast instance, 0..nf-1
    fe = m.match[fs]  # their ends (indices into the end columns)
    p = _Plan()
    p.fast = np.zeros(len(c), bool)
    p.fast[sp[fs]] = True
    p.fast[ep[fe]] = True
    p.ur, p.rank_ok, p.cnt, p.states, p.offsets = r.ur, r.rank_ok, r.cnt, r.states, offsets
    p.ids, p.first = r.ids, r.first
    ri = r.s_ri[fs]
    p.ri = ri
    p.s_pos, p.e_pos = sp[fs], ep[fe]
    p.s_t, p.e_t = s_t[fs], e_t[fe]
    nb = np.where(x.e_bytes[fe] >= 0, x.e_bytes[fe], x.s_bytes[fs])
    p.nbytes = nb
    p.seq = s_seq[fs]
    p.sig = s_sig[fs]
    p.sig_list = sigs.sig_list
    p.members = sigs.members
    p.sig_group = sigs.sig_group
    p.group_names = sigs.group_names
    p.s_wall = s_t[fs] + offsets[ri]
    p.e_wall = e_t[fe] + offsets[ri]
    dur = rank_durations(s_t[fs], e_t[fe], x.e_dev[fe])
    _plan_instances(p, int(ok.sum()), finv, nb, dur, x.s_rank, fs)
    p.chunk, p.sp, p.fs = c, sp, fs
    p.holed = holed[np.flatnonzero(ok)]
    p.late = late[np.flatnonzero(ok)]
    p.dur = dur
    p.first_pos = np.full(p.nf, np.iinfo(np.int64).max)
    np.minimum.at(p.first_pos, finv, p.s_pos)
    return p


def _plan_instances(p: _Plan, nf: int, finv: np.ndarray, nb: np.ndarray, dur: np.ndarray,
                    s_rank: np.ndarray, fs: np.ndarray) -> None:
    """The per-instance fields of `p` (its `nf` fast instances; `finv` each fast
    start's): what its completion adds to the statistics and the straggler test."""
    p.nf = nf
    p.finv = finv
    # Per fast instance: where it completes (its last member leaves), bytes, time.
    p.done_pos = np.full(nf, -1)
    np.maximum.at(p.done_pos, finv, p.e_pos)
    p.i_bytes = np.zeros(nf, np.int64)
    np.maximum.at(p.i_bytes, finv, nb)
    p.i_dur = np.full(nf, np.iinfo(np.int64).max)
    np.minimum.at(p.i_dur, finv, dur)
    p.i_sig = np.zeros(nf, np.int64)
    p.i_sig[finv] = p.sig
    p.i_seq = np.zeros(nf, np.int64)
    p.i_seq[finv] = p.seq
    # The straggler test's arrival: the latest start (ties: the highest rank) and the
    # latest of the others, per instance, by maxima rather than a sort.
    w, rk = p.s_wall, s_rank[fs]
    low = np.iinfo(np.int64).min
    p.t_last = np.full(nf, low)
    np.maximum.at(p.t_last, finv, w)
    top = w == p.t_last[finv]
    p.last_rank = np.full(nf, -1)
    np.maximum.at(p.last_rank, finv[top], rk[top])
    rest = ~(top & (rk == p.last_rank[finv]))  # a member starts an instance once: one is the last
    t_prev = np.full(nf, low)
    np.maximum.at(t_prev, finv[rest], w[rest])
    p.has_prev = np.bincount(finv, minlength=nf) > 1
    p.t_prev = np.where(p.has_prev, t_prev, 0)


def _apply(model: Model, c: Chunk, p: _Plan) -> None:
    shed = model.shed
    stats = model.stats
    from commviz.model.stats import OpStats

    # each whole instance completes where its last member leaves; each holed one
    # opens where its first member enters (while shedding: is counted where its last
    # member present leaves); a late member's instance does neither
    opening = p.holed & ~p.late if not shed else np.zeros(p.nf, bool)
    at = np.where(opening, p.first_pos, p.done_pos)
    act = np.flatnonzero(~p.late)
    order = act[np.argsort(at[act], kind="stable")]
    done = at[order].tolist()
    nf = len(order)
    opens = _Openings(model, c, p) if opening.any() else None
    slow_at = np.flatnonzero(~p.fast)
    slow = slow_at.tolist()
    # `Model.on_op`: each fast op handed on at its end's place among the slow events,
    # as the per-event path would
    ended = _FastEnds(c, p) if model.on_op is not None else None
    on_op, k, ne = model.on_op, 0, len(ended) if ended is not None else 0
    with model.deferral(Deferred()) as d:
        j = 0
        ingest, ranks = model.ingest, c.rank[slow_at].tolist()
        for pos, rank, ev in zip(slow, ranks, c.events(slow_at)):
            while j < nf and done[j] < pos:
                i = int(order[j])
                if opens is not None and opening[i]:
                    opens.open(i)
                else:
                    _fold_fast(model, p, i, stats, shed, OpStats)
                j += 1
            while k < ne and ended.pos[k] < pos:
                on_op(*ended.args(k))
                k += 1
            d.pos = pos
            ingest(rank, ev)
        while j < nf:
            i = int(order[j])
            if opens is not None and opening[i]:
                opens.open(i)
            else:
                _fold_fast(model, p, i, stats, shed, OpStats)
            j += 1
        while k < ne:
            on_op(*ended.args(k))
            k += 1
    _sums(model, p)
    _windows(model, p, d)
    if shed:
        _retire(model, p)
    if model.flows:
        _traffic(model, p, d, flows_mod.SHED_FLOW_SAMPLE if shed else 1)


def _retire(model: Model, p: _Plan) -> None:
    """While shedding: the instances this batch counted, remembered per group so a
    member that comes later opens nothing (model/retired.py)."""
    folded = np.flatnonzero(~p.late)
    if not len(folded):
        return
    g = p.sig_group[p.i_sig[folded]]
    model.retire_many({p.group_names[code]: p.i_seq[folded[g == code]] for code in np.unique(g).tolist()})


class _FastEnds:
    """The fast ops in the order of their ends, and what `Model.on_op` is handed for
    each: (rank, OpStart, start wall ns, OpEnd, end wall ns). Their objects are made
    a block at a time: a chunk's all at once would be most of what a streaming export
    holds."""

    BLOCK = 4096

    def __init__(self, c: Chunk, p: _Plan) -> None:
        self.c, self.p = c, p
        self.o = np.argsort(p.e_pos, kind="stable")
        self.pos = p.e_pos[self.o].tolist()
        self.lo = self.hi = 0
        self.items: list[tuple] = []
        self.whole: dict[int, list] = {}  # frames the last block decoded whole

    def __len__(self) -> int:
        return len(self.pos)

    def args(self, k: int) -> tuple:
        if not self.lo <= k < self.hi:
            self.lo, self.hi = k, min(len(self.pos), k + self.BLOCK)
            o, p, c = self.o[self.lo:self.hi], self.p, self.c
            # a frame's ops may span two blocks: what the last block decoded whole is at hand
            at_hand = dict(self.whole)
            both = c.events(np.concatenate([p.s_pos[o], p.e_pos[o]]), at_hand)  # a frame decoded once
            self.whole = {f: v for f, v in at_hand.items() if f not in self.whole}
            m = len(o)
            self.items = list(zip(p.ur[p.ri[o]].tolist(), both[:m], p.s_wall[o].tolist(), both[m:],
                                  p.e_wall[o].tolist()))
        return self.items[k - self.lo]


class _Openings:
    """The holed instances of a plan, each put into `model.pending` as the per-event
    path leaves it once its members present have entered and left: their starts (the
    OpStarts made in one call), arrival, bytes, durations, who left."""

    def __init__(self, model: Model, c: Chunk, p: _Plan) -> None:
        k = np.flatnonzero(p.holed[p.finv])  # the fast starts of holed instances
        k = k[np.lexsort((p.s_pos[k], p.finv[k]))]  # by instance, members in the order they entered
        self.model, self.p = model, p
        self.starts = c.events(p.s_pos[k])
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


def _fold_fast(model: Model, p: _Plan, i: int, stats: dict, shed: bool, OpStats) -> None:
    """A fast instance's completion, as `Model._fold` makes it: one statistics row,
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


def _sums(model: Model, p: _Plan) -> None:
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
    states = p.states
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
    _seen_ids(p)


def _seen_ids(p: _Plan) -> None:
    """Each rank's SeenIds as adding its batch's ids one by one leaves it (the slow
    path has added some of them already; the result does not depend on the order)."""
    for i in np.flatnonzero(p.rank_ok).tolist():
        p.states[i].seen_ids.add_sorted(p.ids[p.first[i]:p.first[i] + p.cnt[i]])


def _windows(model: Model, p: _Plan, d: Deferred) -> None:
    """Each rank's window of recent ops and its last op, from every end of the batch
    (fast and slow) in position order."""
    slow_by: dict[int, list] = {}
    for e in d.ends:  # (pos, rank, group, start t, end t, op, end wall, OpStart), in order
        slow_by.setdefault(e[1], []).append(e)
    code_of: dict[str, int] = {}  # group -> its code in `names`
    sig_code = np.array([code_of.setdefault(k[1], len(code_of)) for k in p.sig_list], np.int64)
    names = list(code_of)
    fast_last: list[tuple] = []  # (rank state, fast start) whose last op is a fast one
    order = np.lexsort((p.e_pos, p.ri))
    ri_o = p.ri[order]
    bounds = np.flatnonzero(np.r_[True, ri_o[1:] != ri_o[:-1], True]).tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        i = int(ri_o[a])
        r = p.states[i]
        cut = max(a, b - WINDOWS)  # only the newest WINDOWS can stay in the window
        idx = order[cut:b]
        pushed = int(p.s_t[order[a:cut]].max()) if cut > a else None
        k = int(order[b - 1])
        last_pos = int(p.e_pos[k])
        last = None
        extra = slow_by.pop(int(p.ur[i]), None)
        codes, t0s, t1s = sig_code[p.sig[idx]], p.s_t[idx], p.e_t[idx]
        if extra:  # the rank's slow ends go in among its fast ones, by position
            xcodes = [code_of.setdefault(e[2], len(code_of)) for e in extra]
            if len(code_of) > len(names):
                names = list(code_of)
            x_pos = [e[0] for e in extra]
            parts = ((codes, np.array(xcodes, np.int64)), (t0s, np.array([e[3] for e in extra], np.int64)),
                     (t1s, np.array([e[4] for e in extra], np.int64)))
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
            r.last_op, r.last_op_end, r.last_start = last[5], last[6], last[7]
        else:
            r.last_op, r.last_op_end = p.sig_list[p.sig[k]][0], int(p.e_wall[k])
            fast_last.append((r, k))
    if fast_last:  # their OpStarts, made in one go
        ks = np.array([k for _, k in fast_last], np.int64)
        for (r, _), s in zip(fast_last, p.chunk.events(p.sp[p.fs[ks]])):
            r.last_start = s
    for rank, extra in slow_by.items():  # ranks with only slow ends
        r = model.ranks[rank]
        r.windows.extend([e[2] for e in extra], [e[3] for e in extra], [e[4] for e in extra])
        e = extra[-1]
        r.last_op, r.last_op_end, r.last_start = e[5], e[6], e[7]


def _arrivals(p: _Plan) -> np.ndarray:
    """Per fast end: its collective's last member's arrival so far (data moves from
    then), the latest start of its instance before the end in the batch. Live, frames
    come in arrival order and most ends precede some member's start, so this is a
    prefix maximum per instance, taken in one pass: starts sorted by instance and
    position, their times as dense ranks packed under the instance number, so one
    running maximum never crosses from one instance into the next."""
    finv = p.finv.astype(np.int64)
    o = np.lexsort((p.s_pos, finv))
    vals, vr = unique(p.s_wall, inverse=True)
    nv = len(vals)
    run = np.maximum.accumulate(finv[o] * nv + vr.reshape(-1)[o])
    span = int(max(p.s_pos.max(), p.e_pos.max())) + 1
    at = np.searchsorted(finv[o] * span + p.s_pos[o], finv * span + p.e_pos) - 1  # its own start, or later
    return np.maximum(vals[run[at] - finv * nv], 0)  # as `Instance.last_arrival`, which starts at 0


def _ring_next(p: _Plan, sig: np.ndarray, ranks: np.ndarray, nbytes: np.ndarray) -> tuple:
    """Per fast end (its signature code `sig`, rank and bytes): whom a ring collective's rank sends to and how many
    bytes, as `Traffic.op_end` works them out (`flows.RING_2`, `RING_1`: the next
    member in group order, 2(n-1)/n·S or (n-1)/n·S); dst -1 where it is not a ring
    end that moves bytes."""
    dst = np.full(len(sig), -1, np.int64)
    v = np.zeros(len(sig))
    for k, key in enumerate(p.sig_list):
        pat = flows_mod.PATTERNS.get(key[0], flows_mod.NOTHING)
        members = p.members[p.sig_group[k]]
        if pat not in (flows_mod.RING_2, flows_mod.RING_1) or not members or len(members) < 2:
            continue
        sel = np.flatnonzero((sig == k) & (nbytes > 0))
        if not len(sel):
            continue
        n = len(members)
        nxt = {r: members[(i + 1) % n] for i, r in enumerate(members)}  # a rank listed twice: its last place, as op_end
        dst[sel] = np.fromiter(map(nxt.get, ranks[sel].tolist(), repeat(-1)), np.int64, len(sel))
        f = 2.0 * (n - 1) / n if pat == flows_mod.RING_2 else (n - 1) / n
        v[sel] = f * nbytes[sel]
    return dst, v


def _traffic(model: Model, p: _Plan, d: Deferred, every: int = 1) -> None:
    """Flows as `Model._end` feeds them, every end of the batch in position order.

    `every` > 1 (while the model sheds detail): an estimate from about one end in
    `every`, drawn at random and weighing `every` ends each (its bytes and its op);
    ring transfers are credited in bulk where they end (`Traffic.sample`), any other
    end as `op_end` would. With no flows at all while shedding, the flow view, the
    links and the sparklines went dark exactly when the job was busiest."""
    if every > 1:
        _sampled_traffic(model, p, every)
        for _, args, kwargs in d.traffic:  # the batch's slow ends, sampled as `Model._credit` drew them
            model.traffic.op_end(*args, **kwargs)
        return
    model.traffic.flush_sample()  # what a spell of shedding sampled goes in first
    arrived = _arrivals(p)
    order = np.argsort(p.e_pos, kind="stable")
    ranks, nbytes = p.ur[p.ri[order]], p.nbytes[order]
    t0, t1, arr = p.s_wall[order], p.e_wall[order], arrived[order]
    start = np.where((t0 < arr) & (arr < t1), arr, t0)  # a transfer starts at the last arrival
    sig = p.sig[order]
    dst, v = _ring_next(p, sig, ranks, nbytes)
    ends = flows_mod.RingEnds(p.e_pos[order], ranks, nbytes, t0, t1, arr, dst, v, start, sig,
                              [k[0] for k in p.sig_list], [k[4] for k in p.sig_list],
                              [p.members[g] for g in p.sig_group.tolist()])
    model.traffic.ring_ends(ends, d.traffic)


def _sampled_traffic(model: Model, p: _Plan, every: int) -> None:
    """`_traffic`'s estimate: the drawn ends' ring transfers held by `Traffic.sample`
    to be credited in bulk, any other end through `op_end` now."""
    drawn = model.traffic.drawn(len(p.e_pos))
    if not len(drawn):
        return
    order = drawn[np.argsort(p.e_pos[drawn], kind="stable")]
    ranks, nbytes = p.ur[p.ri[order]], p.nbytes[order] * every
    t0, t1, sig = p.s_wall[order], p.e_wall[order], p.sig[order]
    dst, v = _ring_next(p, sig, ranks, nbytes)
    names = [k[0] for k in p.sig_list]
    ring = dst >= 0
    tr = model.traffic
    k = np.flatnonzero(ring)
    tr.sample(ranks[k], dst[k], v[k], t1[k], [names[g] for g in sig[k].tolist()], float(every))
    other = np.flatnonzero(~ring)
    arrived = _arrivals(p)[order[other]] if len(other) else ()
    for i, arr in zip(other.tolist(), arrived.tolist() if len(other) else ()):  # any other pattern
        g = int(sig[i])
        tr.op_end(int(ranks[i]), names[g], int(nbytes[i]), int(t0[i]), int(t1[i]), root=p.sig_list[g][4],
                  members=p.members[p.sig_group[g]], arrived=int(arr), weight=float(every))
