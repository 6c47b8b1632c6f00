"""The audit: what a rank's backend ran (torch's flight recorder) against what
commviz saw. A recorder entry is seen when the rank's latest event on the same group
to start before it had not ended when the entry was created: a wrapped call that
issues several backend ops (object collectives, DDP's bucketed broadcast) covers them
all, while an async op still in flight covers nothing issued after a later event
started. Anything else is a collective the job ran past commviz (a ProcessGroup
method called directly, a C++ extension). Counts per recorder op name:
`seen[k] + unseen.get(k, 0) == backend[k]`.

Clocks: events are on the rank's monotonic clock, the recorder on the wall clock.
The audit carries both read at one moment, the hello another; the offset between
them is interpolated, so clock slewing over a long run does not move entries into
the wrong event."""

from __future__ import annotations

import bisect
import collections
from array import array
from collections.abc import Iterable

import numpy as np

from commviz.events import Audit, Hello

WINDOWS = 8192  # ended events kept per rank for the audit (the recorder keeps ~2000 by default)
# Clock reading jitter allowed at an event's edges: an entry is created after the
# event's start was read (little slack there: a later event must not claim it) and
# before its end was.
START_SLACK_NS = 20_000
END_SLACK_NS = 100_000


class Windows:
    """The recent events of one rank, as (group, start, end) on its monotonic clock.

    Kept as three columns in a ring (two int64 arrays and a group index), not as
    tuples: 20 bytes an op instead of ~130, and at 256 ranks the full windows are 2M
    ops, which a replay's seek checkpoints pickle whole (`trace/seek.py`)."""

    def __init__(self, size: int = WINDOWS) -> None:
        self.maxlen = size
        self._t0, self._t1, self._g = array("q"), array("q"), array("i")
        self._head = 0  # where the oldest is, once full
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self.dropped_before = -1  # start of the newest event pushed out (-1: none yet)

    def __len__(self) -> int:
        return len(self._t0)

    def _ordered(self) -> tuple[array, array, array]:
        """Starts, ends and group indices, oldest first."""
        h = self._head
        return self._t0[h:] + self._t0[:h], self._t1[h:] + self._t1[:h], self._g[h:] + self._g[:h]

    def __getstate__(self) -> dict:
        """Starts as differences and ends as durations, oldest first: small numbers,
        which compress well in a replay's seek checkpoints."""
        t0, t1, g = self._ordered()
        a0 = np.frombuffer(t0, np.int64)
        state = dict(self.__dict__)
        state["_t0"] = np.diff(a0, prepend=0).tobytes()
        state["_t1"] = (np.frombuffer(t1, np.int64) - a0).tobytes()
        state["_g"], state["_head"] = g, 0
        return state

    def __setstate__(self, state: dict) -> None:
        a0 = np.cumsum(np.frombuffer(state["_t0"], np.int64))
        state["_t1"] = array("q", (np.frombuffer(state["_t1"], np.int64) + a0).tobytes())
        state["_t0"] = array("q", a0.tobytes())
        self.__dict__.update(state)

    @property
    def ended(self) -> list[tuple[str, int, int]]:
        """(group, start, end), oldest first."""
        names = self._names
        t0, t1, g = self._ordered()
        return [(names[k], a, b) for k, a, b in zip(g, t0, t1)]

    def add(self, group: str, t0: int, t1: int) -> None:
        gi = self._ids.get(group)
        if gi is None:
            gi = self._ids[group] = len(self._names)
            self._names.append(group)
        if len(self._t0) < self.maxlen:
            self._t0.append(t0)
            self._t1.append(t1)
            self._g.append(gi)
            return
        h = self._head
        if self._t0[h] > self.dropped_before:
            self.dropped_before = self._t0[h]
        self._t0[h], self._t1[h], self._g[h] = t0, t1, gi
        self._head = (h + 1) % self.maxlen

    def extend(self, groups: list[str], t0s: list[int], t1s: list[int], pushed: int | None = None) -> None:
        """`add` for each, in order, at once; `pushed`: the newest start of those left
        out before these (they would have pushed older ones out)."""
        ids = self._named(groups)
        self._append(array("q", t0s), array("q", t1s), array("i", map(ids.__getitem__, groups)), pushed)

    def extend_columns(self, names: list[str], codes: np.ndarray, t0s: np.ndarray, t1s: np.ndarray,
                       pushed: int | None = None) -> None:
        """`extend` from a batch's columns as they are: group `names[codes[i]]`."""
        ids = self._named(names)
        gs = np.array([ids[n] for n in names], np.int32)[codes]
        self._append(array("q", t0s.astype(np.int64).tobytes()), array("q", t1s.astype(np.int64).tobytes()),
                     array("i", gs.tobytes()), pushed)

    def _named(self, groups: list[str]) -> dict[str, int]:
        """Group name -> index, with any of `groups` not seen before added."""
        ids = self._ids
        for name in set(groups).difference(ids):
            ids[name] = len(self._names)
            self._names.append(name)
        return ids

    def _append(self, t0s: array, t1s: array, gs: array, pushed: int | None) -> None:
        """Once the ring is full, the newest overwrite the oldest in place: copying the
        whole window out in order to add a batch's few ops cost ~14 µs a rank a batch
        (a 1,024-rank watcher, after its first 8,192 ops a rank, 14 ms a batch)."""
        if pushed is not None and pushed > self.dropped_before:
            self.dropped_before = pushed
        n = len(t0s)
        if not n:
            return
        room = self.maxlen - len(self._t0)
        if n <= room:  # not full yet: the ring has not turned
            self._t0 += t0s
            self._t1 += t1s
            self._g += gs
            return
        if room > 0:  # fill it, then turn
            self._t0 += t0s[:room]
            self._t1 += t1s[:room]
            self._g += gs[:room]
            t0s, t1s, gs, n = t0s[room:], t1s[room:], gs[room:], n - room
        m = self.maxlen
        if n >= m:  # these alone fill the ring: every older op goes, and the first n - m of these
            lost = max(self._t0)
            if n > m:
                lost = max(lost, max(t0s[:n - m]))
            if lost > self.dropped_before:
                self.dropped_before = lost
            self._t0, self._t1, self._g, self._head = t0s[n - m:], t1s[n - m:], gs[n - m:], 0
            return
        h = self._head  # the oldest n, from the head on, turning at the end
        a = min(n, m - h)
        lost = max(self._t0[h:h + a])
        if a < n:
            lost = max(lost, max(self._t0[:n - a]))
        if lost > self.dropped_before:
            self.dropped_before = lost
        self._t0[h:h + a], self._t1[h:h + a], self._g[h:h + a] = t0s[:a], t1s[:a], gs[:a]
        if a < n:
            self._t0[:n - a], self._t1[:n - a], self._g[:n - a] = t0s[a:], t1s[a:], gs[a:]
        self._head = (h + n) % m


def _offset_at(hello: Hello | None, a: Audit):
    """wall - mono as a function of the monotonic time, interpolated between the
    hello and the audit (constant when only one is known)."""
    off_a = a.wall_ns - a.t
    if hello is None or hello.mono_ns >= a.t:
        return lambda m: off_a
    off_h, span = hello.wall_ns - hello.mono_ns, a.t - hello.mono_ns
    return lambda m: off_h + (off_a - off_h) * (m - hello.mono_ns) / span


def compare(w: Windows, inflight: Iterable[tuple[str, int]], hello: Hello | None, a: Audit) -> dict:
    """The per-rank `audit` of the summary (docs/ARCHITECTURE.md): backend/seen/unseen counts, or
    {"state": why} when the recorder cannot be compared."""
    if a.state:
        return {"state": a.state}
    if not a.ops:
        return {"state": "empty: the flight recorder holds no entries"}
    offset = _offset_at(hello, a)

    def to_mono(t_wall: int) -> int:  # one refinement step suffices: the offset changes slowly
        return t_wall - int(offset(t_wall - (a.wall_ns - a.t)))

    by_group: dict[str, tuple[list[int], list[int]]] = {}
    # For entries the recorder names no group: every event, each start with the latest
    # end of the events started by then, so the one running is found whichever started last.
    every: tuple[list[int], list[int]] = ([], [])
    spans = sorted([(t0, t1, g) for g, t0, t1 in w.ended] + [(t0, 1 << 62, g) for g, t0 in inflight])
    for t0, t1, g in spans:
        starts, ends = by_group.setdefault(g, ([], []))
        starts.append(t0)
        ends.append(t1)
        every[0].append(t0)
        every[1].append(max(t1, every[1][-1]) if every[1] else t1)
    if w.dropped_before >= 0 and to_mono(min(op.t_wall for op in a.ops)) <= w.dropped_before:
        return {"state": f"partial: commviz keeps the last {w.maxlen} ops per rank and the flight "
                         "recorder reaches further back"}
    backend: collections.Counter = collections.Counter()
    seen: collections.Counter = collections.Counter()
    for op in a.ops:
        backend[op.op] += 1
        # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps each group in a ProcessGroupWrapper, whose
        # entries name no group: any event of the rank's running then covers them
        if _inside(by_group.get(op.group) if op.group else every, to_mono(op.t_wall)):
            seen[op.op] += 1
    return {
        "backend": dict(sorted(backend.items())),
        "seen": {k: seen.get(k, 0) for k in sorted(backend)},
        "unseen": {k: n - seen.get(k, 0) for k, n in sorted(backend.items()) if n > seen.get(k, 0)},
    }


def _inside(spans: tuple[list[int], list[int]] | None, m: int) -> bool:
    """Whether the latest event of the group started before `m` was still on at `m`."""
    if spans is None:
        return False
    starts, ends = spans
    i = bisect.bisect_right(starts, m + START_SLACK_NS) - 1
    return i >= 0 and ends[i] >= m - END_SLACK_NS
