"""Straggler: one rank that arrives last at most collectives of a group, late enough
to cost the others real time.

Every collective ends when its last rank arrives, so a rank that is consistently late
(slower data loading, extra work on one rank, a throttled GPU) makes every other rank
wait. Ordinary jitter moves the last place around the ranks and stays small; the
test is consistency (the same rank last most of the time) and size (its median
lateness against an absolute floor, the op's own time and the time between
collectives). Arrival times are start times on the wall clock (each host's offset
from its hello), measured after the next-latest rank.
"""

from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass

from commviz.model.diagnosis import Diagnosis, Kind
from commviz.model.text import ranks_phrase, secs
from commviz.model.thresholds import Thresholds
from commviz.model.track import Instance


@dataclass(frozen=True)
class Arrival:
    """One completed instance, reduced to what the straggler test needs."""

    seq: int
    op: str
    last: int  # the rank that arrived last; -1 on a tie
    lateness_ns: int  # its start after the next-latest rank's
    t_last: int  # wall ns of the last arrival
    op_ns: int  # the instance's time (shortest rank-side duration); -1 if untimed


class StragglerWatch:
    """A sliding window of arrivals per group, fed by completed instances."""

    def __init__(self, window: int) -> None:
        self.window = max(2, window)
        self.groups: dict[str, collections.deque[Arrival]] = {}

    def add(self, inst: Instance, members: list[int]) -> None:
        if len(members) < 2 or any(m not in inst.starts for m in members):
            return
        arr = sorted((inst.starts[m].t_wall, m) for m in members)
        (t_prev, _), (t_last, last) = arr[-2], arr[-1]
        op_ns = min(inst.durations.values()) if inst.durations else -1
        self.append(inst.group, Arrival(inst.seq, inst.op, last if t_last > t_prev else -1, t_last - t_prev,
                                        t_last, op_ns))

    def append(self, group: str, arrival: Arrival) -> None:
        """One completed instance, already reduced (the batch path computes arrivals in columns)."""
        dq = self.groups.get(group)
        if dq is None:
            dq = self.groups[group] = collections.deque(maxlen=self.window)
        dq.append(arrival)

    def find(self, th: Thresholds, members_of: dict[str, list[int]]) -> list[Diagnosis]:
        out = []
        for group, dq in self.groups.items():
            d = _judge(group, list(dq), th, members_of.get(group, []))
            if d is not None:
                out.append(d)
        return out


def chance_of_at_least(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p): how likely one given rank is last k times
    out of n by chance."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _median(xs: list[int]) -> int:
    return int(statistics.median(xs)) if xs else 0


def _judge(group: str, arrivals: list[Arrival], th: Thresholds, members: list[int]) -> Diagnosis | None:
    n = len(arrivals)
    if n < th.straggler_min_instances:
        return None
    counts = collections.Counter(a.last for a in arrivals if a.last >= 0)
    if not counts:
        return None
    rank, c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if c < th.straggler_last_share * n or len(members) < 2:
        return None
    if chance_of_at_least(c, n, 1.0 / len(members)) > th.straggler_chance:
        return None  # ordinary luck at this window size
    mine = [a for a in arrivals if a.last == rank]
    late = _median([a.lateness_ns for a in mine])
    op_ns = _median([a.op_ns for a in arrivals if a.op_ns >= 0])
    interval = _median([b.t_last - a.t_last for a, b in zip(arrivals, arrivals[1:]) if b.t_last > a.t_last])
    need = max(th.straggler_min_s * 1e9, th.straggler_rel_op * op_ns, th.straggler_rel_interval * interval)
    if late < need:
        return None
    op = collections.Counter(a.op for a in mine).most_common(1)[0][0]
    others = [m for m in members if m != rank]
    msg = (
        f"rank {rank} arrives last at {c} of the last {n} collectives on group {group} "
        f"({ranks_phrase(members)}), a median {secs(late)} after the next-latest rank "
        f"(the op itself takes {secs(op_ns)}): {ranks_phrase(others)} wait{'s' if len(others) == 1 else ''} "
        f"for it each time — "
        f"look at what rank {rank} does before {op}"
    )
    return Diagnosis(
        Kind.STRAGGLER, group, mine[-1].seq, op,
        waiting_ranks=others,
        missing_ranks=[],
        culprit_ranks=[rank],
        message=msg,
        details={
            "last_count": c,
            "instances": n,
            "median_lateness_s": round(late / 1e9, 6),
            "median_op_s": round(op_ns / 1e9, 6),
            "median_interval_s": round(interval / 1e9, 6),
        },
    )
