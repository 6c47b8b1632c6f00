"""What a metrics scrape reads of the model (`Model.metrics_view`): plain values and
fresh containers, copied at once under the feed's lock, so `commviz/metrics.py` reads
them after the lock is let go and never holds, or imports, the model itself."""

from __future__ import annotations

from dataclasses import dataclass

from commviz.model.diagnosis import Kind, RankStatus


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
