"""Time in the model: one clock offset per rank, one order of events.

Each rank stamps events with its monotonic clock; its Hello says what that clock read
(`mono_ns`) at a wall-clock instant (`wall_ns`). Everything the model, replay and the
exporters show is on the wall clock: a rank's stamp plus its offset. A trace is fed
in one order, by that time, whoever reads it (summary, replay, export).
"""

from __future__ import annotations

import bisect
import heapq
from typing import Iterable, Iterator

from commviz.events import Batch, Event, Hello


def offset_ns(hello: Hello) -> int:
    """What to add to this rank's monotonic stamps to get wall-clock ns."""
    return hello.wall_ns - hello.mono_ns


def order_events(batches: Iterable[Batch]) -> list[tuple[int, int, Event]]:
    """All events of all batches as (trace wall ns, rank, event), sorted by time (stable).

    A timed event's trace time is `t` plus its rank's Hello offset (wall_ns - mono_ns);
    a Hello's own time is its wall_ns. Events without `t` (GroupDef) take the time of the
    event before them from the same rank (or the next one, if they come first), so they
    are applied as soon as they are reached. Each rank's times are made non-decreasing,
    so a rank's events are always applied in the order the rank sent them, even if its
    clock offset moved between two hellos.
    """
    batches = list(batches)
    offset: dict[int, int] = {}
    # Events sent before a rank's first Hello (unusual) still use that Hello's offset.
    for b in batches:
        for ev in b.events:
            if isinstance(ev, Hello) and b.rank not in offset:
                offset[b.rank] = offset_ns(ev)
    items: list[list] = []
    last: dict[int, int] = {}
    waiting: dict[int, list[int]] = {}  # rank -> indices of untimed events seeking a time
    for b in batches:
        r = b.rank
        for ev in b.events:
            if isinstance(ev, Hello):
                offset[r] = offset_ns(ev)
                t = ev.wall_ns
            else:
                raw = getattr(ev, "t", None)
                t = None if raw is None else raw + offset.get(r, 0)
            prev = last.get(r)
            if t is None:
                t = prev
            elif prev is not None and t < prev:
                t = prev
            if t is None:
                waiting.setdefault(r, []).append(len(items))
                items.append([None, r, ev])
                continue
            for j in waiting.pop(r, ()):
                items[j][0] = t
            last[r] = t
            items.append([t, r, ev])
    if waiting:
        # Ranks that sent only untimed events: apply them at the very start.
        known = [it[0] for it in items if it[0] is not None]
        t0 = min(known) if known else 0
        for idx in waiting.values():
            for j in idx:
                items[j][0] = t0
    items.sort(key=lambda it: it[0])
    return [(t, r, ev) for t, r, ev in items]


# Events buffered before a stream merge sorts what it has and hands on what is final.
MERGE_CHUNK = 16384


class StreamSource:
    """One ordered input of `order_stream`: an iterator of (rank, batch or None for a
    frame that did not decode) and how many frames each rank has in it (counted on a
    first pass, so the merge knows when a rank can send nothing earlier any more)."""

    def __init__(self, frames: Iterator[tuple[int, Batch | None]], frames_per_rank: dict[int, int]) -> None:
        self.frames = frames
        self.left = dict(frames_per_rank)
        self.last: dict[int, int] = {}  # rank -> its newest (clamped) time
        self.waiting: dict[int, list[tuple[int, Event]]] = {}  # untimed events seeking a time
        self.untimed = {r for r, n in self.left.items() if n > 0}  # active ranks with no time yet
        self._front: list[tuple[int, int]] = []  # (time, rank), stale entries skipped

    def frontier(self) -> float:
        """No event of this source still to come is earlier than this."""
        if self.untimed:
            return float("-inf")
        front = self._front
        while front:
            t, r = front[0]
            if self.left.get(r, 0) > 0 and self.last.get(r) == t:
                return t
            heapq.heappop(front)
        return float("inf")

    def advance(self, r: int, t: int) -> None:
        self.last[r] = t
        self.untimed.discard(r)
        heapq.heappush(self._front, (t, r))


def order_stream(sources: list[StreamSource], first_offset: dict[int, int]) -> Iterator[tuple[int, int, Event]]:
    """`order_events` over inputs read once and never held whole: the same
    (time, rank, event) order (by time, ties in input order, each rank's times made
    non-decreasing) in memory bounded by how far the inputs run out of step.

    `first_offset` is each rank's first Hello offset (from the first pass). Each input
    is read a frame at a time, always the one that is furthest behind; an event is
    handed on once no input can still produce an earlier one. Where a rank's events
    are spread over several inputs (a crash ring beside its file), each input keeps
    that rank's order on its own."""
    offset = dict(first_offset)
    buf: list[tuple] = []
    heads = [(s.frontier(), i) for i, s in enumerate(sources)]
    heapq.heapify(heads)
    seen = [0] * len(sources)
    flush_at = MERGE_CHUNK
    while heads:
        _, i = heapq.heappop(heads)
        src = sources[i]
        got = next(src.frames, None)
        if got is None:
            _flush_untimed(src, i, buf)
            src.left.clear()
        else:
            rank, batch = got
            if batch is not None:
                seen[i] = _stamp(src, i, seen[i], rank, batch, offset, buf)
            n = src.left.get(rank, 0) - 1
            src.left[rank] = n
            if n <= 0:
                src.untimed.discard(rank)
                _flush_untimed(src, i, buf, rank)
            heapq.heappush(heads, (src.frontier(), i))
        if len(buf) >= flush_at or not heads:
            limit = heads[0][0] if heads else float("inf")
            buf.sort()  # (time, input, index) are unique: the events are never compared
            cut = bisect.bisect_left(buf, limit, key=_time)
            for t, _, _, r, ev in buf[:cut]:
                yield t, r, ev
            del buf[:cut]
            # Inputs far out of step leave much behind: sort again once it doubled.
            flush_at = max(MERGE_CHUNK, 2 * len(buf))


def _time(item: tuple) -> int:
    return item[0]


def _stamp(src: StreamSource, i: int, n: int, r: int, batch: Batch, offset: dict[int, int], buf: list) -> int:
    """Give each event of one frame its trace time (as `order_events` does) into `buf`."""
    last = src.last.get(r)
    off = offset.get(r, 0)
    waiting = src.waiting
    for ev in batch.events:
        n += 1
        if type(ev) is Hello:
            off = offset[r] = offset_ns(ev)
            t = ev.wall_ns
        else:
            raw = getattr(ev, "t", None)
            if raw is None:
                if last is None:
                    waiting.setdefault(r, []).append((n, ev))
                    continue
                buf.append((last, i, n, r, ev))
                continue
            t = raw + off
        if last is not None and t < last:
            t = last
        if r in waiting:
            buf.extend((t, i, j, r, w) for j, w in waiting.pop(r))
        last = t
        buf.append((t, i, n, r, ev))
    if last is not None and last != src.last.get(r):
        src.advance(r, last)
    return n


def _flush_untimed(src: StreamSource, i: int, buf: list, rank: int | None = None) -> None:
    """A rank that ends with only untimed events: apply them at the earliest time known."""
    ranks = [rank] if rank is not None else list(src.waiting)
    for r in ranks:
        items = src.waiting.pop(r, None)
        if items:
            t0 = min((it[0] for it in buf), default=0)
            buf.extend((t0, i, j, r, ev) for j, ev in items)
