"""What a replay's timeline shows: the trace's span, the marks the job set
(`commviz.mark`) and where each of the trace's diagnoses began, so that a person can
see where the trouble is and seek straight to it.

The diagnoses are the ones `commviz summary` prints for the whole trace (a scratch
model is fed every event, then told the trace is over); each is placed at the first
start of the op it is about, a dead rank at its last sign of life.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from commviz.events import Event, Mark
from commviz.model.store import QUIET, START
from commviz.model.diagnosis import Diagnosis, Kind
from commviz.model.state import Model


@dataclass(frozen=True)
class Tick:
    """One thing on the timeline: a mark (`kind` None) or where a diagnosis began."""

    t: int  # trace wall ns
    text: str
    kind: Kind | None = None


@dataclass
class Timeline:
    start: int
    end: int
    ticks: list[Tick] = field(default_factory=list)  # by time

    def add(self, ticks: list[Tick]) -> None:
        """More ticks (a new list, swapped in whole: readers on other threads see the
        old one or the new one)."""
        self.ticks = sorted([*self.ticks, *ticks], key=lambda k: (k.t, k.kind is not None))

    def fraction(self, t: int) -> float:
        span = self.end - self.start
        return 0.0 if span <= 0 else min(1.0, max(0.0, (t - self.start) / span))

    def at(self, fraction: float) -> int:
        return self.start + round(min(1.0, max(0.0, fraction)) * (self.end - self.start))

    def next_tick(self, t: int) -> Tick | None:
        """The first tick after `t`."""
        i = bisect.bisect_right([k.t for k in self.ticks], t)
        return self.ticks[i] if i < len(self.ticks) else None

    def previous_tick(self, t: int) -> Tick | None:
        """The last tick before `t`."""
        i = bisect.bisect_left([k.t for k in self.ticks], t)
        return self.ticks[i - 1] if i > 0 else None

    def last_passed(self, t: int) -> Tick | None:
        """The newest tick at or before `t` (what the playhead last went over)."""
        i = bisect.bisect_right([k.t for k in self.ticks], t)
        return self.ticks[i - 1] if i > 0 else None


def mark_timeline(events: list[tuple[int, int, Event]]) -> Timeline:
    """The span and the marks: one quick pass."""
    if not events:
        return Timeline(0, 0)
    marks = [Tick(t, ev.text) for t, _, ev in events if isinstance(ev, Mark)]
    return Timeline(events[0][0], events[-1][0], marks)


class DiagnosisTicks:
    """Where each of the trace's diagnoses (as `commviz summary` finds them) began, for
    a pass that feeds `model` the whole trace a chunk at a time (a replay's seek index,
    `trace/seek.py`): `saw_chunk` each chunk in order, then `ticks` once it is over.
    It keeps the marks it passes too."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.first_start: dict[tuple[str, int, str], int] = {}
        self.marks: list[Tick] = []

    def saw_chunk(self, chunk) -> None:
        """Each start's (group, seq, op) first seen, and the marks, of a `Chunk`
        (its `times` from the merge)."""
        kind, times = chunk.kind, chunk.times
        fs = self.first_start
        sp = np.flatnonzero(kind == START)
        if len(sp):  # from the columns: (group, op) by signature, the first start of each instance
            names: dict[tuple[str, str], int] = {}
            code = np.array([names.setdefault((k[1], k[0]), len(names)) for k in chunk.sigs], np.int64)
            keys = [(g, op) for g, op in names]
            c, seq = code[chunk.sig[sp]], chunk.seq[sp]
            _, first = np.unique(np.stack([c, seq]), axis=1, return_index=True)
            first.sort()
            for k in first.tolist():
                group, op = keys[c[k]]
                key = (group, int(seq[k]), op)
                if key not in fs:
                    fs[key] = int(times[sp[k]])
        quiet = np.flatnonzero(kind == QUIET)
        for k, ev in zip(quiet.tolist(), chunk.events(quiet)):
            if type(ev) is Mark:
                self.marks.append(Tick(int(times[k]), ev.text))

    def ticks(self, cut_off: bool, end: int) -> list[Tick]:
        self.model.end_of_trace(cut_off)
        return [Tick(_when(d, self.first_start, self.model, end), f"{d.kind.upper()}: {d.message}", d.kind)
                for d in self.model.findings(end).diagnoses]


def _when(d: Diagnosis, first_start: dict[tuple[str, int, str], int], m: Model, end: int) -> int:
    t = first_start.get((d.group, d.seq, d.op))
    if t is not None and d.kind is not Kind.STRAGGLER:
        return t
    if d.kind is Kind.DEAD_RANK:
        gone = [m.ranks[r].gone_t for r in d.culprit_ranks if r in m.ranks and m.ranks[r].gone_t]
        if gone:
            return min(gone)
    return end
