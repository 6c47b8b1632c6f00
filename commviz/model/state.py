"""The model: pure state fed by events and a clock. No I/O, threads, torch or Textual.

Live watching, replay, `summary` and the tests all read the answers from here, so the
dashboard and the JSON never disagree. Times inside are wall-clock nanoseconds: each
rank's monotonic stamps plus the offset its hello announced.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from commviz import ops as opcat
from commviz.events import (
    Batch,
    Counters,
    Event,
    Goodbye,
    GroupDef,
    Hello,
    Mark,
    OpEnd,
    OpStart,
    Sample,
)
from commviz.model.stats import OpStats

# Completed collective instances kept for per-instance views; older ones only live on
# in the aggregated statistics.
RECENT_MARKS = 1000
RECENT_ENDED_IDS = 65536


@dataclass
class InFlight:
    start: OpStart
    t_wall: int


@dataclass
class RankState:
    rank: int
    hello: Hello | None = None
    offset_ns: int = 0
    status: str = "ok"  # ok | waiting | hung | dead | exited
    inflight: dict[int, InFlight] = field(default_factory=dict)
    # Ids of recently ended ops: a start resent after a reconnect (or arriving in
    # the same flush as the resync) is recognised and not counted twice.
    ended_ids: set[int] = field(default_factory=set)
    ended_order: collections.deque = field(default_factory=collections.deque)
    ops_done: int = 0
    bytes_done: int = 0
    per_op: dict[str, list[int]] = field(default_factory=dict)  # op -> [count, bytes]
    last_seen: int = 0  # wall ns of the newest event
    last_op: str = ""
    last_op_end: int = 0
    dropped: int = 0
    internal_errors: int = 0
    trace_errors: int = 0
    gone_reason: str = ""
    sample: dict[str, float] = field(default_factory=dict)


@dataclass
class Instance:
    """One collective instance (group, seq) as the ranks report it."""

    op: str
    group: str
    seq: int
    bytes: int = 0
    durations: dict[int, int] = field(default_factory=dict)  # rank -> ns
    errors: int = 0
    ended: set[int] = field(default_factory=set)


class Model:
    def __init__(self, hang_after_s: float = 10.0) -> None:
        self.hang_after_ns = int(hang_after_s * 1e9)
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
        self.pending: dict[tuple[str, int], Instance] = {}
        self.marks: list[tuple[int, int, str]] = []  # (wall ns, rank, text)
        self.events = 0
        self.orphan_ends = 0
        self.duplicates = 0
        self.last_t = 0

    # ------------------------------------------------------------------ ingest

    def note_decode_error(self, message: str) -> None:
        self.decode_errors += 1
        self.last_decode_error = message

    def ingest_batch(self, batch: Batch) -> None:
        for ev in batch.events:
            self.ingest(batch.rank, ev)

    def ingest(self, rank: int, ev: Event) -> None:
        self.events += 1
        if isinstance(ev, Hello):
            self._hello(rank, ev)
            return
        r = self._rank(rank)
        t = getattr(ev, "t", None)
        if t is not None:
            tw = t + r.offset_ns
            if tw > r.last_seen:
                r.last_seen = tw
            if tw > self.last_t:
                self.last_t = tw
        if isinstance(ev, OpStart):
            self._start(r, ev)
        elif isinstance(ev, OpEnd):
            self._end(r, ev)
        elif isinstance(ev, GroupDef):
            self.groups[ev.group] = ev
        elif isinstance(ev, Counters):
            r.dropped = max(r.dropped, ev.dropped)
            r.internal_errors = max(r.internal_errors, ev.internal_errors)
            r.trace_errors = max(r.trace_errors, ev.trace_errors)
        elif isinstance(ev, Sample):
            r.sample.update(ev.values)
        elif isinstance(ev, Mark):
            self.marks.append((ev.t + r.offset_ns, rank, ev.text))
            del self.marks[:-RECENT_MARKS]
        elif isinstance(ev, Goodbye):
            r.dropped = max(r.dropped, ev.dropped)
            r.status = "exited"
            r.gone_reason = ev.reason

    def _rank(self, rank: int) -> RankState:
        r = self.ranks.get(rank)
        if r is None:
            r = self.ranks[rank] = RankState(rank)
        return r

    def _hello(self, rank: int, h: Hello) -> None:
        if self.job and h.job != self.job and self.ranks and all(
            r.status in ("exited", "dead") for r in self.ranks.values()
        ):
            # The previous job is over and a new one is saying hello: start afresh so
            # a long-running watcher shows one job at a time.
            self.reset()
        r = self._rank(rank)
        if r.hello is not None and r.hello.pid == h.pid:
            self.duplicates += 1  # a reconnecting rank says hello again
        elif r.hello is not None:
            # Same rank number, new process (an elastic restart): fresh counters.
            r = self.ranks[rank] = RankState(rank)
        r.hello = h
        r.offset_ns = h.wall_ns - h.mono_ns
        r.last_seen = max(r.last_seen, h.wall_ns)
        if r.status in ("dead",):
            r.status = "ok"
        self.job = self.job or h.job
        self.world_size = max(self.world_size, h.world_size)
        self.backend = self.backend or h.backend

    def _start(self, r: RankState, s: OpStart) -> None:
        if s.id in r.inflight or s.id in r.ended_ids:
            self.duplicates += 1  # resent after a reconnect
            return
        r.inflight[s.id] = InFlight(s, s.t + r.offset_ns)

    def _end(self, r: RankState, e: OpEnd) -> None:
        fl = r.inflight.pop(e.id, None)
        if fl is None:
            self.orphan_ends += 1  # its start was dropped or predates this watcher
            return
        r.ended_ids.add(e.id)
        r.ended_order.append(e.id)
        if len(r.ended_order) > RECENT_ENDED_IDS:
            r.ended_ids.discard(r.ended_order.popleft())
        s = fl.start
        nbytes = e.bytes if e.bytes >= 0 else s.bytes
        dur = e.t - s.t
        err = bool(e.error)
        r.ops_done += 1
        r.bytes_done += nbytes
        c = r.per_op.setdefault(s.op, [0, 0])
        c[0] += 1
        c[1] += nbytes
        r.last_op = s.op
        r.last_op_end = e.t + r.offset_ns
        if opcat.is_p2p(s.op) or s.seq < 0:
            self._stat(s.op, s.group).add(nbytes, dur, err)
            return
        key = (s.group, s.seq)
        inst = self.pending.get(key)
        if inst is None:
            inst = self.pending[key] = Instance(s.op, s.group, s.seq)
        inst.bytes = max(inst.bytes, nbytes)
        inst.ended.add(r.rank)
        if err:
            inst.errors += 1
        else:
            inst.durations[r.rank] = dur
        members = self.group_size(s.group)
        if members and len(inst.ended) >= members:
            del self.pending[key]
            self._finish(inst)

    def _finish(self, inst: Instance, into: dict | None = None) -> None:
        stats = self.stats if into is None else into
        st = stats.get((inst.op, inst.group))
        if st is None:
            st = stats[(inst.op, inst.group)] = OpStats()
        # The instance's time is the shortest rank-side duration: the last rank to
        # arrive waits for nobody, so its time is the transfer itself.
        dur = min(inst.durations.values()) if inst.durations else None
        st.add(inst.bytes, dur, error=inst.errors > 0 and dur is None)

    def _stat(self, op: str, group: str) -> OpStats:
        st = self.stats.get((op, group))
        if st is None:
            st = self.stats[(op, group)] = OpStats()
        return st

    def mark_gone(self, rank: int, reason: str) -> None:
        """The transport or the file says this rank's process is gone."""
        r = self._rank(rank)
        if r.status != "exited":
            r.status = "dead"
            r.gone_reason = reason

    # ----------------------------------------------------------------- answers

    def group_size(self, group: str) -> int:
        g = self.groups.get(group)
        if g is not None:
            return len(g.ranks)
        return 0

    def rank_status(self, r: RankState, now: int) -> str:
        if r.status in ("exited", "dead"):
            return r.status
        if r.inflight:
            oldest = min(f.t_wall for f in r.inflight.values())
            return "hung" if now - oldest >= self.hang_after_ns else "waiting"
        return "ok"

    def current_op(self, r: RankState) -> InFlight | None:
        if not r.inflight:
            return None
        return min(r.inflight.values(), key=lambda f: f.t_wall)

    def op_rows(self) -> list[dict]:
        """The summary's op table, including instances not every rank has finished
        (a partial trace still reports what it saw)."""
        stats = dict(self.stats)
        if self.pending:
            stats = {k: _copy_stats(v) for k, v in stats.items()}
            for inst in self.pending.values():
                self._finish(inst, into=stats)
        rows = []
        for (op, group), st in sorted(stats.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            n = self.group_size(group) or self.world_size
            algbw = st.algbw_gbps()
            row = {
                "op": op,
                "group": group,
                "count": st.count,
                "bytes": st.bytes,
                "p50_us": round(st.percentile_us(50), 3),
                "p99_us": round(st.percentile_us(99), 3),
                "algbw_gbps": round(algbw, 6),
                "busbw_gbps": round(algbw * opcat.busbw_factor(op, n), 6),
            }
            if st.errors:
                row["errors"] = st.errors
            rows.append(row)
        return rows

    def summary(self, now: int | None = None) -> dict:
        """The `commviz summary --json` document (keys are a contract: DESIGN.md)."""
        now = self.last_t if now is None else now
        ranks = []
        for rank in sorted(self.ranks):
            r = self.ranks[rank]
            h = r.hello
            ranks.append(
                {
                    "rank": rank,
                    "host": h.host if h else "",
                    "pid": h.pid if h else 0,
                    "device": h.device if h else "",
                    "status": self.rank_status(r, now),
                    "dropped": r.dropped,
                }
            )
        per_rank = [
            {
                "rank": rank,
                "ops": {
                    op: {"count": c, "bytes": b}
                    for op, (c, b) in sorted(self.ranks[rank].per_op.items())
                },
            }
            for rank in sorted(self.ranks)
        ]
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "ranks": ranks,
            "ops": self.op_rows(),
            "per_rank": per_rank,
            "diagnoses": [],
            "events": self.events,
            "decode_errors": self.decode_errors,
        }

    def rank_rows(self, now: int) -> list[dict]:
        """One row per rank for live tables."""
        rows = []
        for rank in sorted(self.ranks):
            r = self.ranks[rank]
            h = r.hello
            cur = self.current_op(r)
            rows.append(
                {
                    "rank": rank,
                    "host": h.host if h else "?",
                    "pid": h.pid if h else 0,
                    "device": h.device if h else "?",
                    "status": self.rank_status(r, now),
                    "op": f"{cur.start.op}#{cur.start.seq}" if cur else "",
                    "op_group": cur.start.group if cur else "",
                    "in_op_s": (now - cur.t_wall) / 1e9 if cur else 0.0,
                    "ops_done": r.ops_done,
                    "bytes": r.bytes_done,
                    "last_seen_s": (now - r.last_seen) / 1e9 if r.last_seen else None,
                    "dropped": r.dropped,
                    "last_op": r.last_op,
                }
            )
        return rows


def _copy_stats(st: OpStats) -> OpStats:
    c = OpStats()
    c.count, c.bytes, c.errors = st.count, st.bytes, st.errors
    c.time_ns, c.timed, c.timed_bytes = st.time_ns, st.timed, st.timed_bytes
    c._samples = list(st._samples)
    return c
