"""The model: pure state fed by events and a clock. No I/O, threads, torch or Textual.

Live watching, replay, `summary` and the tests all read the answers from here, so the
dashboard and the JSON never disagree. Times inside are wall-clock nanoseconds: each
rank's monotonic stamps plus the offset its hello announced.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import gc
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from commviz import ops as opcat
from commviz.events import (
    Audit,
    Batch,
    Counters,
    Event,
    Goodbye,
    GroupDef,
    Hello,
    HostTopology,
    Mark,
    OpEnd,
    OpStart,
    NcclComm,
    NcclOp,
    Sample,
    Stack,
    Stopped,
)
from commviz.model import audit as audit_mod
from commviz.model import columns, document
from commviz.model import desync as desync_mod
from commviz.model.merge import offset_ns, order_events
from commviz.model.nccl import NcclTally
from commviz.model.retired import Retired
from commviz.model.findings import Findings, diagnose
from commviz.model.diagnosis import Diagnosis, Kind, RankStatus
from commviz.model.flows import SHED_FLOW_SAMPLE, Traffic
from commviz.model.stacks import StackStore
from commviz.model.stats import OpStats
from commviz.model.seen import SeenIds
from commviz.model.store import Chunk, EventStore
from commviz.model.straggler import StragglerWatch
from commviz.model.thresholds import Thresholds
from commviz.model.track import MAX_PENDING, InFlight, Instance, P2PPair, Tracker

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
# so the batch path (model/columns.py) can stop there and sweep exactly as one event
# at a time would, instead of going one at a time until the sweep has run.
SWEEP_FIRST = 1024
SWEEP_EVERY = 4096

# The diagnoses whose ranks wait for something that will not come (`OpenHang`).
STUCK_KINDS = frozenset({Kind.HANG, Kind.P2P_DEADLOCK, Kind.DEAD_RANK})

__all__ = ["InFlight", "Instance", "MetricsView", "Model", "OpTotals", "OpenHang", "RankCounts", "RankState", "RankStatus"]


@dataclass(frozen=True)
class PairedOp:
    """One op of one rank, start and end paired (end None: it never ended), on the
    wall clock. Kept only by a model made with `keep_ops=True` (the in-memory export);
    a streaming exporter takes the same fields from `Model(on_op=...)` instead."""

    rank: int
    start: OpStart
    t0: int
    end: OpEnd | None = None
    t1: int = 0


@dataclass(frozen=True)
class RankCounts:
    """One rank as `Model.metrics_view` reads it: its dashboard status (the summary's
    five and `missing`), the ops it ended per (op, group) as (count, bytes), exact,
    and the events its probe dropped."""

    rank: int
    status: RankStatus
    calls: dict[tuple[str, str], tuple[int, int]]
    dropped: int


@dataclass(frozen=True)
class OpTotals:
    """One (op, group) row of the statistics: instances folded in (a collective
    counts once, a point-to-point op once per end), their bytes and errors, and the
    timed ones' count, summed time (ns) and count per latency bucket (`stats.BUCKETS_NS`,
    then one past them). Only instances every member has left: these only grow, so
    they can be read as counters."""

    op: str
    group: str
    count: int
    bytes: int
    errors: int
    timed: int
    time_ns: int
    hist: tuple[int, ...] = ()


@dataclass(frozen=True)
class OpenHang:
    """A diagnosis of ranks stuck waiting (hang, p2p deadlock, dead rank) and how long
    they have waited (ns): the longest wait its message gives."""

    kind: Kind
    group: str
    op: str
    seq: int
    age_ns: int
    waiting: int
    missing: int


@dataclass(frozen=True)
class MetricsView:
    """What a metrics scrape reads of the model, copied at once (`Model.metrics_view`):
    plain values and fresh containers, nothing that the model changes afterwards."""

    now: int
    job: str
    backend: str
    world_size: int
    events: int
    decode_errors: int
    shed: bool
    shed_ops: int
    ranks: tuple[RankCounts, ...]
    ops: tuple[OpTotals, ...]
    hangs: tuple[OpenHang, ...]
    diagnoses: dict[str, int]  # kind -> how many now (stragglers included)
    groups: dict[str, tuple[str, int]]  # group -> (its name, its size) as announced


@dataclass
class RankState:
    rank: int
    hello: Hello | None = None
    offset_ns: int = 0
    status: RankStatus = RankStatus.OK  # what its events say: ok, or gone (dead | exited)
    inflight: dict[int, InFlight] = field(default_factory=dict)
    # Ids of the ops it started: a start resent after a reconnect (or arriving in
    # the same flush as the resync) is recognised and not counted twice.
    seen_ids: SeenIds = field(default_factory=SeenIds)
    ops_done: int = 0
    bytes_done: int = 0
    per_op: dict[str, list[int]] = field(default_factory=dict)  # op -> [count, bytes]
    per_group: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (op, group) -> [count, bytes]
    last_seen: int = 0  # wall ns of the newest event
    last_op: str = ""
    last_op_end: int = 0
    dropped: int = 0
    behind: int = -1  # its probe's Counters.behind as last told (-1: not yet)
    internal_errors: int = 0
    trace_errors: int = 0
    gone_reason: str = ""
    gone_t: int = 0  # wall ns of its last sign of life once gone (goodbye, last event)
    sample: dict[str, float] = field(default_factory=dict)
    last_start: OpStart | None = None  # the start of the op that ended last
    seqs: dict[str, int] = field(default_factory=dict)  # group -> highest collective seq started
    stacks: StackStore = field(default_factory=StackStore)
    stopped: Stopped | None = None  # the watcher stopped the job while this rank ran
    windows: audit_mod.Windows = field(default_factory=audit_mod.Windows)  # recent events, for the audit
    audit: dict | None = None  # against torch's flight recorder (model/audit.py)
    nccl: NcclTally | None = None  # what NCCL itself says it ran (model/nccl.py), once it says anything

    @property
    def gone(self) -> bool:
        return self.status.gone


class Model:
    """Fed events (`ingest`) and asked questions (`summary`, `diagnoses`, `rank_rows`).

    `hang_after_s` is the hang threshold; `thresholds`, when given, sets every knob of
    the diagnoses (its `hang_after_s` wins over the argument). `keep_ops` keeps every
    paired op and every mark (`paired_ops`, `marks`) for an exporter; live watching
    leaves it off so memory stays bounded. `flows=False` skips the per-edge traffic
    (`traffic` stays empty) for readers that never show it (`summary`, exports).

    `on_op(rank, start, t0, end, t1)` is called as each op ends (where `keep_ops`
    would keep it: t0, t1 on the wall clock), and `on_mark(t, rank, text)` for each
    mark, in the order of the events, on the per-event and the batch path alike: a
    streaming exporter writes them out and the model keeps nothing more than without
    them. Ops still in flight at the end are the caller's to read (`ranks[r].inflight`)."""

    def __init__(self, hang_after_s: float = 10.0, thresholds: Thresholds | None = None,
                 keep_ops: bool = False, flows: bool = True,
                 on_op: Callable[[int, OpStart, int, OpEnd, int], None] | None = None,
                 on_mark: Callable[[int, int, str], None] | None = None) -> None:
        self.thresholds = thresholds if thresholds is not None else Thresholds(hang_after_s=hang_after_s)
        self.keep_ops = keep_ops
        self.on_op = on_op
        self.on_mark = on_mark
        self.flows = flows
        # Set by a watcher that has fallen behind (model/overload.py) through `shed`:
        # per-event detail is shed, counts and bytes stay exact.
        self._shed = False
        self.shed_ops = 0
        # Events the probes left out because this watcher was not taking them
        # (Counters.behind), summed over ranks; never reset, so it only ever rises.
        self.behind_events = 0
        # While `columns.ingest_events` runs a batch: where the order-dependent effects
        # of its per-event ends go (applied after the batch, in order).
        self._deferred = None
        self.reset()
        self.decode_errors = 0
        self.last_decode_error = ""

    def reset(self) -> None:
        self.job = ""
        self.world_size = 0
        self.backend = ""
        self.ranks: dict[int, RankState] = {}
        self.groups: dict[str, GroupDef] = {}
        self.stats: dict[tuple[str, str], OpStats] = {}
        self.tracker = Tracker()
        self.traffic = Traffic()  # bytes per edge and throughput over time (model/flows.py)
        self.pending: dict[tuple[str, int], Instance] = self.tracker.pending
        self.stragglers = StragglerWatch(self.thresholds.straggler_window)
        self.desync_history: collections.OrderedDict[tuple, Diagnosis] = collections.OrderedDict()
        self._sweep_at = SWEEP_FIRST
        self.sweeps = 0  # sweeps of stale instances run so far
        # group -> the collective instances counted while shedding (model/retired.py):
        # empty until the first spell, consulted from then on
        self.retired: dict[str, Retired] = {}
        self.marks: list[tuple[int, int, str]] = []  # (wall ns, rank, text)
        # host -> its GPU topology document as its local rank 0 sent it (plain data,
        # `commviz topo --json`'s shape); the dashboard reads it (`topo.hosts`), and
        # `topology_version` says when one changed
        self.host_topologies: dict[str, dict] = {}
        self.topology_version = 0
        self.done_ops: list[PairedOp] = []  # with keep_ops
        self.events = 0
        self.orphan_ends = 0
        self.duplicates = 0
        self.last_t = 0

    @property
    def hang_after_ns(self) -> int:
        return self.thresholds.hang_after_ns

    @property
    def shed(self) -> bool:
        """Whether per-event detail is being shed (model/overload.py): instances are
        counted once their members present have left (model/retired.py), untimed, with
        flows estimated from a sample (`flows.SHED_FLOW_SAMPLE`) and no straggler or
        desync checks; ranks' counts and bytes stay exact."""
        return self._shed

    @shed.setter
    def shed(self, on: bool) -> None:
        if on and not self._shed:
            self._raise_floors(self.groups)
        if self._shed and not on:
            self.traffic.flush_sample()  # the spell's estimate goes in before exact flows resume
        self._shed = bool(on)

    def _retired_of(self, group: str) -> Retired:
        rt = self.retired.get(group)
        if rt is None:
            rt = self.retired[group] = Retired()
        return rt

    def _raise_floors(self, groups) -> None:
        """Each group's instances at or below the lowest one still open and the lowest
        seq every member has reached are folded already (or every member's frame of
        them was lost): the counted keys go on from above them. Asked when a spell
        begins, after each batch and each sweep during it, so a key whose every frame
        was lost does not hold the floor back."""
        low: dict[str, int] = {}
        for g, seq in self.pending:
            if seq <= low.get(g, seq):
                low[g] = seq
        for gid in groups:
            g = self.groups.get(gid)
            if g is None:
                continue
            reached = min((self.ranks[m].seqs.get(gid, -1) if m in self.ranks else -1 for m in g.ranks), default=-1)
            self._retired_of(gid).raise_floor(min(reached, low[gid] - 1) if gid in low else reached)

    def count_idle_pending(self) -> int:
        """While shedding: count every open instance nobody is inside (each member
        present has left), as a batch counts a holed one where its last member present
        leaves. Left open, the per-event path holds one until every member has come,
        and a batch whose instances are held open cannot go in bulk: behind producers
        that lose most of their frames, every later batch then went one event at a
        time, each leaving more open (bench/ingest.py flat out: ~85k events/s)."""
        idle = [inst for inst in self.pending.values() if inst.starts.keys() <= inst.ended]
        for inst in idle:
            self._fold(inst, completed=False)
        if idle:
            self._raise_floors({inst.group for inst in idle})
        return len(idle)

    def counted(self, group: str, seq: int) -> bool:
        """A collective instance counted while shedding and no longer open: a member
        that comes to it now counts for its own rank only."""
        rt = self.retired.get(group)
        return rt is not None and seq in rt and (group, seq) not in self.pending

    def retire_many(self, seqs_by_group: dict) -> None:
        """The batch path folded these instances (group -> their seqs) while shedding."""
        for group, seqs in seqs_by_group.items():
            self._retired_of(group).add_many(seqs)
        self._raise_floors(seqs_by_group)

    # ------------------------------------------------------------------ ingest

    def note_decode_error(self, message: str) -> None:
        self.decode_errors += 1
        self.last_decode_error = message

    def ingest_batch(self, batch: Batch) -> None:
        for ev in batch.events:
            self.ingest(batch.rank, ev)

    # The batch path's interface (model/columns.py): what it may ask and set of the
    # per-event path's state, and nothing else.

    @property
    def deferring(self) -> bool:
        """A batch is replaying its slow events: their order-dependent effects are
        being collected (`deferral`), not applied."""
        return self._deferred is not None

    @contextlib.contextmanager
    def deferral(self, d):
        """While open, ends and traffic go to `d` (a columns.Deferred), to be applied
        after the batch in event order."""
        self._deferred = d
        try:
            yield d
        finally:
            self._deferred = None

    def sweep_room(self) -> int:
        """Instances that may still open before the model sweeps the stale ones."""
        return self._sweep_at - len(self.pending)

    def sweep_checks(self, n: int) -> range:
        """The positions among the next `n` events after which the model checks
        whether to sweep its stale instances (`sweep_if_due`)."""
        return range(SWEEP_EVERY - self.events % SWEEP_EVERY - 1, n, SWEEP_EVERY)

    def sweep_if_due(self) -> None:
        """The check one event at a time makes after every SWEEP_EVERY-th event; the
        batch path calls it where it stops at one. Twice at one place is once: a
        sweep leaves fewer instances pending than its new mark."""
        if not self.events % SWEEP_EVERY and len(self.pending) > self._sweep_at:
            self._sweep()

    def ingest_many(self, ranks: Sequence[int], events: Sequence[Event], settle: bool = False) -> int:
        """`ingest(ranks[i], events[i])` for each i in order, a batch at a time
        (`model/columns.py`): the same state, far less time per event (while shedding,
        the same counts: see `columns`). `settle`: see `columns.ingest_events`; returns
        how many were ingested."""
        return columns.ingest_events(self, ranks, events, settle)

    def ingest(self, rank: int, ev: Event) -> None:
        tp = type(ev)
        if tp is OpEnd or tp is OpStart:  # nearly every event: the short way
            self.events += 1
            r = self.ranks.get(rank)
            if r is None:
                r = self._rank(rank)
            tw = ev.t + r.offset_ns
            if tw > r.last_seen:
                r.last_seen = tw
            if tw > self.last_t:
                self.last_t = tw
            if tp is OpEnd:
                self._end(r, ev)
            else:
                self._start(r, ev)
        else:
            self._ingest_other(rank, ev)
        if not self.events % SWEEP_EVERY and self._deferred is None and len(self.pending) > self._sweep_at:
            self._sweep()

    def _ingest_other(self, rank: int, ev: Event) -> None:
        self.events += 1
        if isinstance(ev, Hello):
            self._hello(rank, ev)
            return
        r = self._rank(rank)
        t = getattr(ev, "t", None)
        if t is not None:
            tw = t + r.offset_ns
            if tw > r.last_seen and type(ev) is not Stopped:  # (the watcher's time, not a sign of the rank's life)
                r.last_seen = tw
            if tw > self.last_t:
                self.last_t = tw
        if isinstance(ev, OpStart):
            self._start(r, ev)
        elif isinstance(ev, OpEnd):
            self._end(r, ev)
        elif isinstance(ev, GroupDef):
            self._group(ev)
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
                self.behind_events += ev.behind - r.behind
                r.behind = ev.behind
        elif isinstance(ev, Sample):
            r.sample.update(ev.values)
        elif isinstance(ev, Mark):
            self.marks.append((ev.t + r.offset_ns, rank, ev.text))
            if self.on_mark is not None:
                self.on_mark(ev.t + r.offset_ns, rank, ev.text)
            if not self.keep_ops:
                del self.marks[:-RECENT_MARKS]
        elif isinstance(ev, Stopped):
            if not r.gone:
                r.stopped = ev
        elif isinstance(ev, Audit):
            inflight = [(f.start.group, f.start.t) for f in r.inflight.values()]
            r.audit = audit_mod.compare(r.windows, inflight, r.hello, ev)
        elif isinstance(ev, HostTopology):
            self._host_topology(ev)
        elif isinstance(ev, (NcclOp, NcclComm)):
            if r.nccl is None:
                r.nccl = NcclTally()
            r.nccl.add(ev)
        elif isinstance(ev, Goodbye):
            r.dropped = max(r.dropped, ev.dropped)
            r.status = RankStatus.EXITED
            r.gone_reason = ev.reason
            r.gone_t = ev.t + r.offset_ns

    def ingest_trace(self, batches: list[Batch], cut_off: bool = False, snapshot: bool = False) -> None:
        """A whole trace, in the one order every reader uses (`clock.order_events`),
        then `end_of_trace`."""
        self.ingest_ordered(order_events(batches), cut_off, snapshot)

    def ingest_ordered(self, events: Iterable[tuple[int, int, Event]], cut_off: bool = False,
                       snapshot: bool = False) -> None:
        """A whole trace already in the one order (`clock.order_events`, or
        `clock.order_stream` for a trace read in bounded memory), then `end_of_trace`."""
        for _, rank, ev in events:
            self.ingest(rank, ev)
        self.end_of_trace(cut_off, snapshot)

    def ingest_chunk(self, chunk: Chunk) -> None:
        """Every event of a `Chunk`, in its order, a batch at a time."""
        columns.ingest_chunk(self, chunk)

    def ingest_chunks(self, chunks: Iterable[Chunk], cut_off: bool = False,
                      snapshot: bool = False, after_chunk: Callable[[], None] | None = None) -> None:
        """`ingest_ordered` for a trace handed on as `Chunk`s in the one order
        (`clock.order_stream_chunks`), then `end_of_trace`. `after_chunk` is called
        after each chunk (a streaming exporter writes out what it was handed)."""
        # Decoding and merging allocate millions of short-lived, acyclic objects: the
        # cyclic collector would walk everything alive again and again for nothing.
        was = gc.isenabled()
        gc.disable()
        try:
            for chunk in self._tails_carried(chunks):
                columns.ingest_chunk(self, chunk)
                if after_chunk is not None:
                    after_chunk()
        finally:
            if was:
                gc.enable()
        self.end_of_trace(cut_off, snapshot)

    def _tails_carried(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        """`chunks`, each cut where the fewest collectives are half-way among its last
        events (`columns.tail_cut`, with the groups the chunks before it made known):
        the rest goes in with the next chunk, the last rest at the end."""
        carry = None
        for chunk in chunks:
            if carry is not None:
                chunk, carry = Chunk.joined(carry, chunk), None
            cut = columns.tail_cut(chunk, self.groups) if type(chunk.store) is EventStore else len(chunk)
            if cut < len(chunk):
                chunk, carry = chunk.part(0, cut), chunk.part(cut, len(chunk))
            yield chunk
        if carry is not None:
            yield carry

    def end_of_trace(self, cut_off: bool = False, snapshot: bool = False) -> None:
        """The trace is over: a rank that did not say goodbye did not exit cleanly
        (killed, crashed, or the file was `cut_off` before its goodbye) — unless the
        trace is a `snapshot` of ranks still running (torch's flight-recorder dumps)."""
        if snapshot:
            return
        why = "trace cut off" if cut_off else "no goodbye in the trace (killed?)"
        for rank, r in self.ranks.items():
            if not r.gone:
                self.mark_gone(rank, why)

    def _rank(self, rank: int) -> RankState:
        r = self.ranks.get(rank)
        if r is None:
            r = self.ranks[rank] = RankState(rank)
        return r

    def _hello(self, rank: int, h: Hello) -> None:
        if self.job and h.job != self.job and self.ranks and all(r.gone for r in self.ranks.values()):
            # The previous job is over and a new one is saying hello: start afresh so
            # a long-running watcher shows one job at a time.
            self.reset()
        r = self._rank(rank)
        if r.hello is not None and r.hello.pid == h.pid:
            self.duplicates += 1  # a reconnecting rank says hello again
        elif r.hello is not None:
            # Same rank number, new process (an elastic restart): fresh counters, and
            # its old process's ops no longer take part in any instance or pair.
            r = self.ranks[rank] = RankState(rank)
            self.tracker.forget_rank(rank)
            # its sequence numbers start again at 0, below what a spell of shedding
            # counted: its groups' keys must open instances again
            for gid, g in self.groups.items():
                if rank in g.ranks:
                    self.retired.pop(gid, None)
        r.hello = h
        r.offset_ns = offset_ns(h)
        r.last_seen = max(r.last_seen, h.wall_ns)
        if r.status is RankStatus.DEAD:
            r.status = RankStatus.OK
            r.gone_t = 0
        self.job = self.job or h.job
        self.world_size = max(self.world_size, h.world_size)
        self.backend = self.backend or h.backend

    def _group(self, g: GroupDef) -> None:
        known = self.groups.get(g.group)
        self.groups[g.group] = g
        if known is not None and known.ranks == g.ranks:
            return  # every member announces it, and again after each reconnect
        # Instances every member has already left, seen before their group was
        # known, are complete now.
        members = len(g.ranks)
        for key, inst in list(self.pending.items()):
            if key[0] == g.group and members and len(inst.ended) >= members:
                self._fold(inst)

    def _host_topology(self, ev: HostTopology) -> None:
        """Kept as sent: a resync sends the same document again, and a host past the
        cap, or a document that is not a host's, is shown as one that sent nothing."""
        docs = self.host_topologies
        gpus = ev.document.get("gpus")
        if not isinstance(gpus, list) or len(gpus) > MAX_HOST_GPUS or docs.get(ev.host) == ev.document:
            return
        if ev.host in docs or len(docs) < MAX_HOST_TOPOLOGIES:
            docs[ev.host] = ev.document
            self.topology_version += 1

    def _start(self, r: RankState, s: OpStart) -> None:
        if s.id in r.seen_ids:
            self.duplicates += 1  # resent after a reconnect
            return
        r.seen_ids.add(s.id)
        fl = r.inflight[s.id] = InFlight(s, s.t + r.offset_ns)
        if _is_p2p(s.op):
            self.tracker.post(r.rank, fl)
        elif s.seq >= 0:
            if not (self.retired and self.counted(s.group, s.seq)):
                self.tracker.enter(r.rank, fl)
            if s.seq > r.seqs.get(s.group, -1):
                r.seqs[s.group] = s.seq

    def _end(self, r: RankState, e: OpEnd) -> None:
        fl = r.inflight.pop(e.id, None)
        if fl is None:
            self.orphan_ends += 1  # its start was dropped or predates this watcher
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
        deferred = self._deferred
        if deferred is None:
            r.windows.add(s.group, s.t, e.t)
            r.last_op = s.op
            r.last_op_end = end_wall
            r.last_start = s
        else:
            deferred.end(r.rank, s, e.t, end_wall)
        if self.keep_ops:
            self.done_ops.append(PairedOp(r.rank, s, fl.t_wall, e, end_wall))
        if self.on_op is not None:
            self.on_op(r.rank, s, fl.t_wall, e, end_wall)
        g = self.groups.get(s.group)
        members = g.ranks if g is not None else None
        p2p = _is_p2p(s.op)
        if p2p or s.seq < 0:
            peer = e.peer if e.peer >= 0 else s.peer
            if self.flows:
                self._credit((r.rank, s.op, nbytes, fl.t_wall, end_wall),
                             dict(failed=bool(e.error), peer=peer, root=s.root, members=members))
            self._stat(s.op, s.group).add(nbytes, None if self._shed else op_time_ns(e, s), bool(e.error))
            pair = self.tracker.finish(r.rank, fl, end_wall, e.error) if p2p else None
            if pair is not None and not self._shed:
                self._note_p2p_desync(pair)
            return
        if self.retired and self.counted(s.group, s.seq):  # a late member of an instance counted while shedding
            if self.flows:
                self._credit((r.rank, s.op, nbytes, fl.t_wall, end_wall),
                             dict(failed=bool(e.error), root=s.root, members=members, arrived=fl.t_wall))
            return
        inst = self.tracker.leave(r.rank, fl, end_wall, nbytes, e.error, device_time_ns(e))
        if self.flows:
            self._credit((r.rank, s.op, nbytes, fl.t_wall, end_wall),
                         dict(failed=bool(e.error), root=s.root, members=members, arrived=inst.last_arrival))
        if members and len(inst.ended) >= len(members):
            self._fold(inst)

    def _credit(self, args: tuple, kwargs: dict) -> None:
        if self._shed:  # an estimate, as the batch path makes it: one end in k, weighing k
            k = SHED_FLOW_SAMPLE
            if not self.traffic.drawn_one():
                return
            rank, op, nbytes, t0, t1 = args
            args, kwargs = (rank, op, nbytes * k, t0, t1), {**kwargs, "weight": float(k)}
        if self._deferred is None:
            self.traffic.op_end(*args, **kwargs)
        else:
            self._deferred.credit(args, kwargs)

    def _fold(self, inst: Instance, completed: bool = True) -> None:
        """Fold an instance every member has left (or one that can no longer complete)
        into the statistics; keep what the diagnoses need from it."""
        self.pending.pop((inst.group, inst.seq), None)
        if inst.ended:
            self._finish(inst)
        if self._shed:
            self.shed_ops += 1
            self._retired_of(inst.group).add(inst.seq)
            return
        g = self.groups.get(inst.group)
        members = list(g.ranks) if g is not None else sorted(inst.starts)
        if completed:
            self.stragglers.add(inst, members)
        d = desync_mod.collective_desync(inst, members, self.gone_note, finished=True)
        if d is not None:
            self._remember_desync(("c", inst.group, inst.seq), d)

    def _note_p2p_desync(self, pair: P2PPair) -> None:
        d = desync_mod.p2p_desync(pair)
        if d is not None:
            self._remember_desync(("p", pair.group, pair.src, pair.dst, pair.seq), d)

    def _remember_desync(self, key: tuple, d: Diagnosis) -> None:
        self.desync_history[key] = d
        while len(self.desync_history) > DESYNC_HISTORY:
            self.desync_history.popitem(last=False)

    def _sweep(self) -> None:
        """Retire instances that can never complete because a member's start was lost
        (dropped events, a watcher that came late): nobody is inside them and every
        member that did not leave them has since started a later op in the group.

        Behind a flood most instances are stale, so each is not asked of every member
        (at 1,024 ranks that, for every pending instance, cost more than the ingest):
        only the members not yet past its seq, found by bisection, must have left it."""
        ranks = self.ranks
        # group -> its members by the latest seq each has started (-1: none, or not a
        # rank yet): those at or below an instance's seq must all have left it
        behind: dict[str, tuple[list[int], list[int]]] = {}
        for inst in list(self.pending.values()):
            ended = inst.ended
            if not inst.starts.keys() <= ended:
                continue  # a rank is inside
            b = behind.get(inst.group)
            if b is None:
                g = self.groups.get(inst.group)
                if g is None:
                    continue
                by = sorted((ranks[m].seqs.get(inst.group, -1) if m in ranks else -1, m)
                            for m in dict.fromkeys(g.ranks))  # a member named twice is one member
                b = behind[inst.group] = ([q for q, _ in by], [m for _, m in by])
            n = bisect.bisect_right(b[0], inst.seq)
            if n <= len(ended) and all(m in ended for m in itertools.islice(b[1], n)):
                self._fold(inst, completed=False)
        while len(self.pending) > MAX_PENDING:
            self.tracker.evicted_instances += 1
            self._fold(next(iter(self.pending.values())), completed=False)
        self._sweep_at = max(SWEEP_FIRST, 2 * len(self.pending))
        self.sweeps += 1
        if self._shed:
            self._raise_floors(list(self.retired))

    def gone_note(self, rank: int) -> str | None:
        """How a rank's process ended, in words for messages; None while it runs."""
        r = self.ranks.get(rank)
        if r is None or not r.gone:
            return None
        if r.status is RankStatus.EXITED:
            after = f" once {r.stopped.text()}" if r.stopped is not None else ""
            return f"it exited ({r.gone_reason or 'goodbye'}){after}"
        if r.stopped is not None:
            return f"it was {r.stopped.text()}"
        why = r.gone_reason or "without a goodbye"
        if why.startswith("process "):  # "process ended without a goodbye"
            return f"its {why}"
        return f"its process ended ({why})"

    def _finish(self, inst: Instance, into: dict | None = None) -> None:
        stats = self.stats if into is None else into
        st = stats.get((inst.op, inst.group))
        if st is None:
            st = stats[(inst.op, inst.group)] = OpStats()
        # The instance's time is the shortest rank-side duration (device time where
        # measured, `device_time_ns`): the last rank to arrive waits for nobody, so its
        # time is the transfer itself.
        dur = min(inst.durations.values()) if inst.durations else None
        # Shedding detail (model/overload.py): counted and sized, not timed.
        st.add(inst.bytes, None if self._shed else dur, error=inst.errors > 0 and dur is None)

    def _stat(self, op: str, group: str) -> OpStats:
        st = self.stats.get((op, group))
        if st is None:
            st = self.stats[(op, group)] = OpStats()
        return st

    def mark_gone(self, rank: int, reason: str, t_ns: int | None = None) -> None:
        """The transport or the file says this rank's process is gone. `t_ns` (wall
        clock) is when it was last known alive; by default its newest event, which the
        probe's 1 s heartbeat keeps recent."""
        r = self._rank(rank)
        if r.status is not RankStatus.EXITED:
            r.status = RankStatus.DEAD
            r.gone_reason = r.stopped.text() if r.stopped is not None else reason
            r.gone_t = r.last_seen if t_ns is None else t_ns

    # ----------------------------------------------------------------- answers

    def group_size(self, group: str) -> int:
        g = self.groups.get(group)
        if g is not None:
            return len(g.ranks)
        return 0

    def rank_status(self, r: RankState, now: int, hung: set[int] | frozenset[int] = frozenset()) -> RankStatus:
        """ok | waiting | hung | dead | exited (the summary's five). `hung` names ranks
        whose in-flight op is part of a diagnosis (see `findings`); an op older than
        the threshold is hung on its own."""
        if r.gone:
            return r.status
        if r.inflight:
            if r.rank in hung:
                return RankStatus.HUNG
            oldest = min(f.t_wall for f in r.inflight.values())
            return RankStatus.HUNG if now - oldest >= self.hang_after_ns else RankStatus.WAITING
        return RankStatus.OK

    def view_status(self, r: RankState, now: int, found: Findings) -> RankStatus:
        """`rank_status`, and `missing` for a live rank the others wait for in one of
        the findings (the dashboard's word for the rank to look at)."""
        st = self.rank_status(r, now, found.hung)
        return RankStatus.MISSING if r.rank in found.missing and not st.gone else st

    def paired_ops(self) -> list[PairedOp]:
        """Every op kept (`keep_ops`), finished or not, by rank then start time; an
        unfinished one has no end and runs to the newest time in the model."""
        out = list(self.done_ops)
        for r in self.ranks.values():
            out += [PairedOp(r.rank, f.start, f.t_wall, None, self.last_t) for f in r.inflight.values()]
        out.sort(key=lambda p: (p.rank, p.t0))
        return out

    def current_op(self, r: RankState) -> InFlight | None:
        if not r.inflight:
            return None
        return min(r.inflight.values(), key=lambda f: f.t_wall)

    def stats_now(self) -> dict:
        """The op statistics by (op, group), with the instances some rank has finished
        but not all folded in too (a copy then: a partial trace still reports what it
        saw, and the model's own statistics are left as they are)."""
        stats = dict(self.stats)
        if any(inst.ended for inst in self.pending.values()):
            stats = {k: v.copy() for k, v in stats.items()}
            for inst in self.pending.values():
                if inst.ended:  # an op counts once some rank has finished it
                    self._finish(inst, into=stats)
        return stats

    def op_rows(self) -> list[dict]:
        """The summary's op table (model/document.py)."""
        return document.op_rows(self)

    def findings(self, now: int | None = None) -> Findings:
        """The diagnoses at `now` (wall ns; default: the newest event's time) and the
        ranks whose in-flight op is part of one."""
        return diagnose(self, self.last_t if now is None else now)

    def diagnoses(self, now: int | None = None) -> list[dict]:
        """The `diagnoses` entries of the summary (JSON), computed at `now`."""
        return self.findings(now).to_json()

    def summary(self, now: int | None = None) -> dict:
        """The `commviz summary --json` document (model/document.py)."""
        return document.summary(self, now)

    def metrics_view(self, now: int | None = None, found: Findings | None = None) -> MetricsView:
        """One copy of the counts, statuses and open hangs at `now` (wall ns; default:
        the newest event's time), for a Prometheus scrape (`commviz/metrics.py`). Call
        it under the feed's lock: it copies counters (a few per rank and op), runs
        `findings` once (as a dashboard snapshot does) and sorts nothing."""
        now = self.last_t if now is None else now
        found = self.findings(now) if found is None else found
        ranks = tuple(
            RankCounts(rank, self.view_status(r, now, found),
                       {k: (c[0], c[1]) for k, c in r.per_group.items()}, r.dropped)
            for rank, r in sorted(self.ranks.items())
        )
        ops = tuple(
            OpTotals(op, group, st.count, st.bytes, st.errors, st.timed, st.time_ns, tuple(st.hist))
            for (op, group), st in sorted(self.stats.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        )
        kinds: dict[str, int] = {}
        hangs = []
        for d in found.diagnoses:
            kinds[d.kind.value] = kinds.get(d.kind.value, 0) + 1
            if d.kind in STUCK_KINDS:
                hangs.append(OpenHang(d.kind, d.group, d.op, d.seq, self._waited_ns(d, now),
                                      len(d.waiting_ranks), len(d.missing_ranks)))
        return MetricsView(
            now=now, job=self.job, backend=self.backend, world_size=self.world_size, events=self.events,
            decode_errors=self.decode_errors, shed=self.shed, shed_ops=self.shed_ops, ranks=ranks, ops=ops,
            hangs=tuple(hangs), diagnoses=kinds,
            groups={gid: (g.name, len(g.ranks)) for gid, g in self.groups.items()},
        )

    def _waited_ns(self, d: Diagnosis, now: int) -> int:
        """How long a diagnosis's ranks have waited: the longest wait its details list
        (the figure its message gives), else the oldest in-flight op of a waiting rank."""
        waits = [w.get("waited_s", 0.0) for w in d.details.get("waits", ()) if isinstance(w, dict)]
        if waits:
            return int(max(waits) * 1e9)
        ages = [now - f.t_wall for rk in d.waiting_ranks if rk in self.ranks for f in self.ranks[rk].inflight.values()]
        return max(0, max(ages)) if ages else 0

    def op_percentiles_ns(self, keys: Iterable[tuple[str, str]], qs: Sequence[float] = (50, 99)
                          ) -> dict[tuple[str, str], tuple[int, ...]]:
        """Nearest-rank latency percentiles (ns) of the (op, group) rows asked for, as
        the summary's p50/p99 (one sort of each row's bounded sample); rows the model
        does not have are left out. A caller under the feed's lock asks only for the
        rows it shows."""
        out = {}
        for key in keys:
            st = self.stats.get(key)
            if st is not None:
                out[key] = st.percentiles_ns(qs)
        return out

    def rank_rows(self, now: int, found: Findings | None = None) -> list[document.RankRow]:
        """One row per rank for live tables (model/document.py)."""
        return document.rank_rows(self, now, found)


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


def _is_p2p(op: str) -> bool:
    got = _P2P.get(op)
    if got is None:
        got = opcat.is_p2p(op)
        if len(_P2P) < 4096:
            _P2P[op] = got
    return got


