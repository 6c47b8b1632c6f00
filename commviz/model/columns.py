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
the batch's edges, ranks whose op ids have gaps — goes one event at a time in its
place in the order. This module drives a batch: `model/plan.py` finds what may go in
bulk (and where a batch must stop), `model/ledger.py` applies it, with the slow
events in their places, writing exactly what the per-event path writes.

A model with an `on_op` hook (the streaming Perfetto export) is handed each fast op
at its end's place among the slow events, so the hook sees every op once, in the
order the per-event path would hand them on (a `keep_ops` model goes one event at a
time).

A batch where nothing can go in bulk (`plan.Slow`: no collective whose whole life
lies in it, or a rank or id that does not fit the packed keys) is ingested one
event at a time, and one that reaches a check of the stale-instance sweep with
too many instances open stops there, lets the model check (`ledger.sweep_if_due`),
and goes on in bulk.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Sequence

import numpy as np

from commviz.model import ledger
from commviz.model import plan as plan_mod
from commviz.model.keys import unique
from commviz.model.plan import ID_BITS, ID_MAX, Slow, Take
from commviz.model.store import END, OTHER, START, Chunk

if TYPE_CHECKING:
    from commviz.model.state import Model

MIN_BATCH = 256  # below this the per-event path is as quick
TAIL = 8192  # events at a trace chunk's end where `tail_cut` looks for a cut
SETTLE_MIN = 32768  # a smaller live batch is ingested whole: carrying its tail costs more than it saves
# Cuts for ranks whose ids span too far (`plan._span_cut`) per batch: behind a flood a
# few; one per start only from a rank far from itself every time, which planning the
# rest again after each would make quadratic.
MAX_SPAN_CUTS = 16
MAX_BATCH = 262144  # a collective of 1,024 ranks whose frames carry 64 steps spans 131,072 events


def ingest_events(model: Model, ranks: Sequence[int], events: Sequence, settle: bool = False) -> int:
    """`model.ingest(ranks[i], events[i])` for every i, in order — in batches (`Model.ingest`).

    `settle`: a live source that will hand on more — ingest only up to a point in the
    second half where the fewest collectives are half-way (begun before it, ended
    after it); returns how many were ingested, the caller keeps the rest and hands
    them on first next time. Without it (or if there is no better point), all."""
    if model.shed and model.pending:
        ledger.count_idle_pending(model)
    if len(events) < MIN_BATCH or model.keep_ops:
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
    if model.keep_ops:
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
            ledger.ingest_one(model, int(chunk.rank[i]), chunk.event(i))
        lo = i + 1


def _one_by_one(model: Model, ranks: Sequence[int], events: Sequence) -> None:
    one = ledger.ingest_one
    for r, ev in zip(ranks, events):
        one(model, r, ev)


def _chunk_one_by_one(model: Model, c: Chunk) -> None:
    _one_by_one(model, c.rank.tolist(), c.events(np.arange(len(c))))


def _batch(model: Model, c: Chunk, span_cuts: int = MAX_SPAN_CUTS) -> int:
    """`c` in bulk where its plan says so; returns how many span cuts are left to the
    rest of the batch (its parts included, the rest is planned again after each: at
    most MAX_SPAN_CUTS)."""
    while len(c):
        if len(c) < MIN_BATCH:
            _chunk_one_by_one(model, c)
            return span_cuts
        planned = plan_mod.plan(model, c, span_cuts > 0)
        if isinstance(planned, Take):
            ledger.apply_plan(model, planned.plan)
            ledger.sweep_if_due(model)  # where the batch ends on a check, as the per-event path would
            return span_cuts
        if isinstance(planned, Slow) or not 0 < planned.at < len(c):  # (a cut must shorten the batch)
            _chunk_one_by_one(model, c)
            return span_cuts
        if planned.span:
            span_cuts -= 1
        # The per-event path may sweep just before event `at`: the events before it
        # go in bulk, the model checks, and the rest follow.
        span_cuts = _batch(model, c.part(0, planned.at), span_cuts)
        c = c.part(planned.at, len(c))
    return span_cuts
