"""The model: pure state fed by events and a clock. No I/O, threads, torch or Textual.

Live watching, replay, `summary` and the tests all read the answers from here, so the
dashboard and the JSON never disagree. Times inside are wall-clock nanoseconds: each
rank's monotonic stamps plus the offset its hello announced.
"""

from __future__ import annotations

import collections
import operator
from typing import Callable, Iterable, Sequence, get_args, overload

import numpy as np
from msgspec import Struct

from commviz.events import Event, GroupDef, OpEnd, OpStart
from commviz.model import columns, document, ledger
from commviz.model.retired import Retired
from commviz.model.findings import Findings, diagnose
from commviz.model.diagnosis import Diagnosis, Kind, RankStatus
from commviz.model.scrape import MetricsView, OpenHang, OpTotals, RankCounts
from commviz.model.flows import Traffic
from commviz.model.rank import PairedOp, RankState
from commviz.model.stats import OpStats
from commviz.model.seen import SeenIds
from commviz.model.store import Chunk, EventStore
from commviz.model.straggler import StragglerWatch
from commviz.model.thresholds import Thresholds
from commviz.model.track import InFlight, Instance, Tracker

# (kept importable from here, where they were)
# Every kind of event (`Model.ingest` asks; a set: one hash, not a walk of the kinds).
EVENT_KINDS = frozenset(get_args(Event))

device_time_ns = ledger.device_time_ns
op_time_ns = ledger.op_time_ns

# The diagnoses whose ranks wait for something that will not come (`OpenHang`).
STUCK_KINDS = frozenset({Kind.HANG, Kind.P2P_DEADLOCK, Kind.DEAD_RANK})

__all__ = ["InFlight", "Instance", "MetricsView", "Model", "OpTotals", "OpenHang", "PairedOp", "RankCounts", "RankState",
           "RankStatus", "SeenIds"]


class Model:
    """Fed events (`ingest`) and asked questions (`summary`, `diagnoses`, `rank_rows`).

    It holds the state; what an event changes in it is written in one place,
    `model/ledger.py`, for one event and for a batch alike.

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
        self.shedding = False
        self.shed_ops = 0
        # Events the probes left out because this watcher was not taking them
        # (Counters.behind), summed over ranks; never reset, so it only ever rises.
        self.behind_events = 0
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
        self.sweep_at = ledger.SWEEP_FIRST  # open instances at which the next check sweeps
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
        return self.shedding

    @shed.setter
    def shed(self, on: bool) -> None:
        ledger.set_shed(self, on)

    def counted(self, group: str, seq: int) -> bool:
        """A collective instance counted while shedding and no longer open: a member
        that comes to it now counts for its own rank only."""
        rt = self.retired.get(group)
        return rt is not None and seq in rt and (group, seq) not in self.pending

    def sweep_room(self) -> int:
        """Instances that may still open before the model sweeps the stale ones."""
        return self.sweep_at - len(self.pending)

    def sweep_checks(self, n: int) -> range:
        """The positions among the next `n` events after which the model checks
        whether to sweep its stale instances (`ledger.sweep_if_due`)."""
        return range(ledger.SWEEP_EVERY - self.events % ledger.SWEEP_EVERY - 1, n, ledger.SWEEP_EVERY)

    # ------------------------------------------------------------------ ingest

    def note_decode_error(self, message: str) -> None:
        """A frame or record that could not be read (`message` says which and why)."""
        ledger.note_decode_error(self, message)

    def note_decode_errors(self, at_least: int) -> None:
        """The wire's own count of frames it could not read: the model's count is at least that."""
        ledger.note_decode_errors(self, at_least)

    @overload
    def ingest(self, ranks: int, events: Event) -> int: ...

    @overload
    def ingest(self, ranks: Sequence[int] | np.ndarray, events: Sequence[Event] | EventStore,
               settle: bool = False) -> int: ...

    @overload
    def ingest(self, ranks: Chunk) -> int: ...

    def ingest(self, ranks, events=None, settle=False):
        """The one way events go in, three shapes of one thing; returns how many went in.

        - `ingest(rank, event)`: one event;
        - `ingest(ranks, events)`: `events[i]` from `ranks[i]`, in order, a batch at a
          time (`model/columns.py`: the same state, far less time per event; while
          shedding, the same counts). `settle`: a live source that will hand on more,
          see `columns.ingest_events`;
        - `ingest(chunk)`: a `store.Chunk`'s events, in its order, a batch at a time.

        What each event changes is `model/ledger.py`'s; `end_of_trace` ends a trace.
        Anything else (a `Batch`, a frame, a list without its ranks) is a TypeError
        here, not a phantom event further in."""
        if type(events) in EVENT_KINDS:
            ledger.ingest_one(self, ranks if type(ranks) is int else operator.index(ranks), events)
            return 1
        if events is None:
            if not isinstance(ranks, Chunk):
                raise TypeError(f"Model.ingest({type(ranks).__name__}): one argument is a store.Chunk")
            columns.ingest_chunk(self, ranks)
            return len(ranks)
        if isinstance(events, Struct):
            raise TypeError(f"Model.ingest(rank, {type(events).__name__}): not an event (a Batch goes in "
                            "as ingest([b.rank] * len(b.events), b.events))")
        return columns.ingest_events(self, ranks, events, settle)

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

    def mark_gone(self, rank: int, reason: str, t_ns: int | None = None) -> None:
        """The transport or the file says this rank's process is gone. `t_ns` (wall
        clock) is when it was last known alive; by default its newest event, which the
        probe's 1 s heartbeat keeps recent."""
        ledger.mark_gone(self, rank, reason, t_ns)

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
                    ledger.finish(self, inst, into=stats)
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


