"""Planning a batch: which collective instances of a run of events can go in bulk,
and what they do, in columns. Pure: it reads the model (what its ranks have started,
the instances it holds open, when it sweeps) and changes nothing; `model/ledger.py`
applies a plan, and `model/columns.py` drives a batch from one plan to the next.

The invariants that make bulk exact are checked here, not assumed: a batch that breaks
one is `Slow`; one that must stop where the per-event path may sweep, or where a
rank's ids span too far, is `Cut` there (see `plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, Union

import numpy as np

from commviz import ops as opcat
from commviz.model import flows as flows_mod
from commviz.model.keys import unique, unique_sorted
from commviz.model.seen import SeenIds
from commviz.model.store import END, START, Chunk

if TYPE_CHECKING:
    from commviz.model.state import Model

ID_BITS = 40  # (rank, op id) and (group, seq) packed into one int64 key
ID_MAX = 1 << ID_BITS


@dataclass(frozen=True, eq=False)
class Plan:
    """What the fast instances of a batch do, in columns: per fast start and its end
    (in the order of the start columns), then per fast instance (`nf` of them).

    Those `holed` (a member's start not in the batch: a frame lost, or to come) do all
    a whole one does but complete: they are left open, as the per-event path leaves
    them — or, while shedding, counted at once. Those `late` (members of an instance
    counted while shedding) count for their ranks only."""

    chunk: Chunk
    fast: np.ndarray  # per event of the batch: part of a fast instance
    # per rank of the batch's starts (`ur`, sorted)
    ur: np.ndarray
    rank_ok: np.ndarray  # its starts' ids are new and distinct (they go into SeenIds in bulk)
    cnt: np.ndarray  # its start count; its ids, sorted, are ids[first:first + cnt]
    first: np.ndarray
    ids: np.ndarray
    # per fast start and its end
    ri: np.ndarray  # its rank, an index into `ur`
    s_pos: np.ndarray  # positions in the batch
    e_pos: np.ndarray
    s_t: np.ndarray  # on the rank's clock
    e_t: np.ndarray
    s_wall: np.ndarray  # on the wall clock
    e_wall: np.ndarray
    nbytes: np.ndarray
    seq: np.ndarray
    sig: np.ndarray  # its signature, an index into `sig_list`
    dur: np.ndarray  # its rank's time in it (`rank_durations`)
    finv: np.ndarray  # its instance, 0..nf-1
    # per signature (op, group, bytes, dtype, root) and group code
    sig_list: list
    sig_group: np.ndarray
    group_names: list
    members: list
    # per fast instance
    nf: int
    holed: np.ndarray
    late: np.ndarray
    first_pos: np.ndarray  # where its first member enters
    done_pos: np.ndarray  # where its last member leaves
    i_bytes: np.ndarray
    i_dur: np.ndarray  # the shortest rank time: the last to arrive waits for nobody
    i_sig: np.ndarray
    i_seq: np.ndarray
    # the straggler test's arrival: the latest start (ties: the highest rank), the latest of the others
    t_last: np.ndarray
    last_rank: np.ndarray
    t_prev: np.ndarray  # 0 where the instance has one member
    has_prev: np.ndarray


@dataclass(frozen=True)
class Take:
    """Apply `plan`: its fast instances in bulk, every other event one at a time in its place."""

    plan: Plan


@dataclass(frozen=True)
class Cut:
    """Stop before position `at`: the events before it go in bulk, then the model
    checks whether to sweep (`span`: False), or the rest is planned again because a
    rank's ids span too far (`span`: True)."""

    at: int
    span: bool = False


@dataclass(frozen=True)
class Slow:
    """Nothing to gain: every event one at a time."""


Planned = Union[Take, Cut, Slow]
SLOW = Slow()


def plan(model: Model, c: Chunk, span_cuts: bool = True) -> Planned:
    """The fast instances of `c` and what they do (`Take`); `Slow` where the batch is
    better taken one event at a time; a `Cut` where the batch must stop for a sweep
    the per-event path may run just before it (`_sweep_point`), or where a rank's ids
    would span too far to go fast (`_span_cut`, if `span_cuts`)."""
    x = _columns(c)
    if x is None:
        return SLOW
    sigs = _signatures(model, c.sigs)
    r = _rank_floors(model, x)
    cut = _span_cut(x, r) if span_cuts else None
    if cut is not None:
        return Cut(cut, span=True)
    m = _match_ends(x, sigs, r)
    inst = _instances(x, sigs)
    if inst is None:
        return SLOW
    reopen, touched = _reopening(model, x, m)
    ok, holed, late = _fast_mask(model, x, sigs, inst, m.start_ok, touched)
    take = ok | holed | late
    if not take.any():  # nothing to gain: no halves either
        return SLOW
    # while shedding a holed instance is counted where its last member present leaves
    closes = ok | holed if model.shed else ok
    cut = _sweep_point(model, c, x, sigs, m, inst, closes, late, reopen)
    if cut < len(c):
        return Cut(cut)
    return Take(_build_plan(c, x, sigs, r, m, inst, take, holed, late))


def rank_durations(start_t: np.ndarray, end_t: np.ndarray, device_ns: np.ndarray) -> np.ndarray:
    """Each rank's time in an op, as `Tracker.leave` takes it (`ledger.device_time_ns`):
    its device time where the probe measured one, else end minus start on the rank's
    clock. (Captured ops, untimed, never reach the batch path.)"""
    return np.where(device_ns >= 0, device_ns, end_t - start_t)


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
    """Per rank of the batch's starts (`ur`, sorted): its start count, clock
    offset and whether its starts can go fast; `skey` each start's (rank, id), `s_ri`
    each start's index into `ur`; `ids`, from `first`, each rank's ids in order;
    `order` sorts `skey` into `sk`; `distinct` whether no two starts share a (rank, id);
    `falls` per rank whether its ids go down somewhere in the batch's order."""
    skey: np.ndarray
    ur: np.ndarray
    cnt: np.ndarray
    offsets: np.ndarray
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
    whatever the order they are added in (`ledger._seen_ids_many`). A gap among them (a frame
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
    floors, offsets = _floors(model, ur)
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
    return _Ranks(skey, ur, cnt, offsets, rank_ok, s_ri, ids_sorted, first, order, sk, distinct_ok,
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
    started: then none is a duplicate, `SeenIds.add_sorted`) and its clock offset."""
    floors = np.full(len(ur), -2, np.int64)  # -2: the rank cannot take the fast path
    offsets = np.zeros(len(ur), np.int64)
    for i, r in enumerate(ur.tolist()):
        st = model.ranks.get(r)
        if st is None:
            continue
        seen = st.seen_ids
        offsets[i] = st.offset_ns
        floors[i] = seen.top
    return floors, offsets


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
                holed: np.ndarray, late: np.ndarray) -> Plan:
    """The `Plan` of the fast instances (`ok`; of them `holed` and `late`)."""
    sp, ep, s_t, e_t = x.sp, x.ep, x.s_t, x.e_t
    coll, inv = inst.coll, inst.inv
    fs = coll[ok[inv]]  # fast starts (indices into the start columns)
    finv = np.searchsorted(np.flatnonzero(ok), inv[ok[inv]])  # their fast instance, 0..nf-1
    fe = m.match[fs]  # their ends (indices into the end columns)
    nf = int(ok.sum())
    fast = np.zeros(len(c), bool)
    fast[sp[fs]] = True
    fast[ep[fe]] = True
    ri = r.s_ri[fs]
    s_pos, e_pos = sp[fs], ep[fe]
    nb = np.where(x.e_bytes[fe] >= 0, x.e_bytes[fe], x.s_bytes[fs])
    seq, sig = x.s_seq[fs], x.s_sig[fs]
    s_wall = s_t[fs] + r.offsets[ri]
    dur = rank_durations(s_t[fs], e_t[fe], x.e_dev[fe])
    first_pos = np.full(nf, np.iinfo(np.int64).max)
    np.minimum.at(first_pos, finv, s_pos)
    # Per fast instance: where it completes (its last member leaves), bytes, time.
    done_pos = np.full(nf, -1)
    np.maximum.at(done_pos, finv, e_pos)
    i_bytes = np.zeros(nf, np.int64)
    np.maximum.at(i_bytes, finv, nb)
    i_dur = np.full(nf, np.iinfo(np.int64).max)
    np.minimum.at(i_dur, finv, dur)
    i_sig = np.zeros(nf, np.int64)
    i_sig[finv] = sig
    i_seq = np.zeros(nf, np.int64)
    i_seq[finv] = seq
    # The straggler test's arrival: the latest start (ties: the highest rank) and the
    # latest of the others, per instance, by maxima rather than a sort.
    rk = x.s_rank[fs]
    low = np.iinfo(np.int64).min
    t_last = np.full(nf, low)
    np.maximum.at(t_last, finv, s_wall)
    top = s_wall == t_last[finv]
    last_rank = np.full(nf, -1)
    np.maximum.at(last_rank, finv[top], rk[top])
    rest = ~(top & (rk == last_rank[finv]))  # a member starts an instance once: one is the last
    t_prev = np.full(nf, low)
    np.maximum.at(t_prev, finv[rest], s_wall[rest])
    has_prev = np.bincount(finv, minlength=nf) > 1
    at_ok = np.flatnonzero(ok)
    return Plan(
        chunk=c, fast=fast, ur=r.ur, rank_ok=r.rank_ok, cnt=r.cnt, first=r.first, ids=r.ids,
        ri=ri, s_pos=s_pos, e_pos=e_pos, s_t=s_t[fs], e_t=e_t[fe], s_wall=s_wall, e_wall=e_t[fe] + r.offsets[ri],
        nbytes=nb, seq=seq, sig=sig, dur=dur, finv=finv,
        sig_list=sigs.sig_list, sig_group=sigs.sig_group, group_names=sigs.group_names, members=sigs.members,
        nf=nf, holed=holed[at_ok], late=late[at_ok], first_pos=first_pos, done_pos=done_pos, i_bytes=i_bytes,
        i_dur=i_dur, i_sig=i_sig, i_seq=i_seq, t_last=t_last, last_rank=last_rank,
        t_prev=np.where(has_prev, t_prev, 0), has_prev=has_prev,
    )


class FastEnds:
    """The fast ops in the order of their ends, and what `Model.on_op` is handed for
    each: (rank, OpStart, start wall ns, OpEnd, end wall ns). Their objects are made
    a block at a time: a chunk's all at once would be most of what a streaming export
    holds."""

    BLOCK = 4096

    def __init__(self, c: Chunk, p: Plan) -> None:
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


def arrivals(p: Plan) -> np.ndarray:
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


def ring_next(p: Plan, sig: np.ndarray, ranks: np.ndarray, nbytes: np.ndarray) -> tuple:
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
