"""Time in the model: one clock offset per rank, one order of events.

Each rank stamps events with its monotonic clock; its Hello says what that clock read
(`mono_ns`) at a wall-clock instant (`wall_ns`). Everything the model, replay and the
exporters show is on the wall clock: a rank's stamp plus its offset. A trace is fed
in one order, by that time, whoever reads it (summary, replay, export).
"""

from __future__ import annotations

import bisect
import heapq
from operator import attrgetter
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from commviz.events import Batch, Event, Hello
from commviz.model.store import Chunk
from commviz.model.store import ColFrame, EventStore, Objects


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


# Events a batched merge gathers before it sorts and hands on what is final.
CHUNK = 65536


class Timed(NamedTuple):
    """A decoded frame stamped in bulk: its events and their raw stamps; where it lies
    if it was read from a file (`ColFrame.file`, `ColFrame.at`)."""

    rank: int
    events: list
    ts: list
    file: int = -1
    at: int = -1
    size: int = 0


class _Pending:
    """The frames a batched merge has read and not yet handed on, as columns: the
    frames stamped in bulk (every event timed, no new offset: frames read into
    columns, `store.ColFrame`, or decoded ones, `Timed`), the events of frames stamped
    one by one (`_stamp`), and what an earlier sort kept back (an `EventStore`, or a
    list of events after a resume)."""

    def __init__(self) -> None:
        self.clear()
        self.keep_t = self.keep_i = self.keep_n = self.keep_r = np.zeros(0, np.int64)
        self.keep_ev: EventStore | list = []

    def clear(self) -> None:
        self.n = 0  # events in `parts`
        self.parts: list = []  # ColFrame | Timed, frame after frame
        self.frames: list[tuple[int, int, int, int, int, int | None]] = []  # (rank, input, n0, count, offset, last)
        self.slow: list[tuple] = []  # (time, input, index, rank, event), as `_stamp` makes them

    def __len__(self) -> int:
        return self.n + len(self.slow) + len(self.keep_ev)


def order_stream_chunks(sources: list[StreamSource], first_offset: dict[int, int],
                        chunk: int = CHUNK) -> Iterator[Chunk]:
    """`order_stream`'s order, handed on as `Chunk`s for `Model.ingest`, with
    the per-event work done in numpy: a frame whose every event carries a stamp and
    no new clock offset is stamped as a whole. Each chunk's `times` are its events'
    trace times, in its order."""
    return iter(ChunkMerge(sources, first_offset, chunk))


class ChunkMergeState:
    """Where a `ChunkMerge` stood between two chunks, as plain data (pickled into a
    replay's seek checkpoints): what it had read and not handed on, each input's
    stamping state, and each input's `frames.position` for its caller to reopen it."""

    def __init__(self, m: ChunkMerge) -> None:
        b = m.buf
        self.keep = (b.keep_t, b.keep_i, b.keep_n, b.keep_r, list(b.keep_ev))  # as objects: plain data
        self.offset, self.heads, self.seen, self.chunk = dict(m.offset), list(m.heads), list(m.seen), m.chunk
        self.sources = [_source_state(s.left, s.last, s.waiting, s.untimed, s._front) for s in m.sources]
        self.positions = [getattr(s.frames, "position", None) for s in m.sources]


class ChunkMerge:
    """`order_stream_chunks` as an object: iterating it hands on the chunks, and
    between two of them `state()` says where it stands, for `resume` (a replay's seek
    checkpoints, `trace/seek.py`)."""

    def __init__(self, sources: list[StreamSource], first_offset: dict[int, int], chunk: int = CHUNK) -> None:
        self.sources = sources
        self.offset = dict(first_offset)
        self.buf = _Pending()
        self.heads = [(s.frontier(), i) for i, s in enumerate(sources)]
        heapq.heapify(self.heads)
        self.seen = [0] * len(sources)
        self.chunk = chunk

    @classmethod
    def resume(cls, state: ChunkMergeState, frames: list[Iterator]) -> ChunkMerge:
        m = cls.__new__(cls)  # on copies: the same state can be resumed again
        m.sources = _reopened(frames, [_source_state(*st) for st in state.sources])
        m.offset, m.heads, m.seen, m.chunk = dict(state.offset), list(state.heads), list(state.seen), state.chunk
        m.buf = _Pending()
        b = m.buf
        kt, ki, kn, kr, kev = state.keep
        b.keep_t, b.keep_i, b.keep_n, b.keep_r, b.keep_ev = kt, ki, kn, kr, list(kev)
        return m

    def state(self) -> ChunkMergeState:
        return ChunkMergeState(self)

    def __iter__(self) -> Iterator[Chunk]:
        offset, buf, heads, sources, seen = self.offset, self.buf, self.heads, self.sources, self.seen
        get_t = attrgetter("t")
        # One input (a trace in one file): no order among inputs to keep, so its
        # frontier is wanted only where the pending events are sorted.
        one = len(sources) == 1
        while heads:
            i = heads[0][1] if one else heapq.heappop(heads)[1]
            src = sources[i]
            got = next(src.frames, None)
            if got is None:
                _flush_untimed(src, i, buf.slow)
                src.left.clear()
                if one:
                    heads.clear()
            else:
                rank, batch = got
                if batch is not None:
                    ts = None
                    if type(batch) is ColFrame and batch.objs is None and batch.count:  # starts and ends: all timed
                        if rank not in src.waiting:
                            ts, n, tmax = batch, batch.count, batch.tmax
                    else:
                        evs = batch.events
                        if rank not in src.waiting and evs:
                            try:
                                ts = (Timed(rank, evs, list(map(get_t, evs))) if type(batch) is not ColFrame
                                      else Timed(rank, evs, list(map(get_t, evs)), batch.file, batch.at,
                                                  len(batch.payload)))
                                n, tmax = len(evs), max(ts.ts)
                            except AttributeError:  # a hello or a group definition: one by one
                                ts = None
                    if ts is None:
                        seen[i] = _stamp(src, i, seen[i], rank, batch, offset, buf.slow)
                    else:
                        off = offset.get(rank, 0)
                        last = src.last.get(rank)
                        buf.frames.append((rank, i, seen[i], n, off, last))
                        buf.parts.append(ts)
                        buf.n += n
                        seen[i] += n
                        newest = tmax + off
                        if last is not None and last > newest:
                            newest = last
                        if newest != last:
                            src.advance(rank, newest)
                n = src.left.get(rank, 0) - 1
                src.left[rank] = n
                if n <= 0:
                    src.untimed.discard(rank)
                    _flush_untimed(src, i, buf.slow, rank)
                if not one:
                    heapq.heappush(heads, (src.frontier(), i))
            if len(buf) >= self.chunk or not heads:
                if one and heads:
                    heads[0] = (src.frontier(), i)
                limit = heads[0][0] if heads else float("inf")
                out = _flush(buf, limit)
                # inputs far out of step: sort again once it doubled
                self.chunk = max(self.chunk, 2 * len(buf))
                if out is not None:
                    yield out


def _source_state(left: dict, last: dict, waiting: dict, untimed: set, front: list) -> tuple:
    """A copy of one input's stamping state (what a merge changes as it runs)."""
    return dict(left), dict(last), {r: list(w) for r, w in waiting.items()}, set(untimed), list(front)


def _reopened(frames: list[Iterator], states: list[tuple]) -> list[StreamSource]:
    sources = []
    for f, (left, last, waiting, untimed, front) in zip(frames, states):
        s = StreamSource(f, {})
        s.left, s.last, s.waiting, s.untimed, s._front = left, last, waiting, untimed, front
        sources.append(s)
    return sources


def _flush(buf: _Pending, limit: float) -> Chunk | None:
    """Sort what is pending by (time, input, index) and hand on the events earlier
    than `limit`; keep the rest."""
    t_parts, i_parts, n_parts, r_parts = [buf.keep_t], [buf.keep_i], [buf.keep_n], [buf.keep_r]
    kept = buf.keep_ev
    stored = [kept if type(kept) is EventStore else Objects(kept, buf.keep_r.tolist())] if len(kept) else []
    if buf.frames:
        ranks, inputs, n0, counts, offs, lasts = (np.array(c, np.int64) if k < 5 else c
                                                  for k, c in enumerate(zip(*buf.frames)))
        stored += buf.parts
    if buf.slow:
        st, si, sn, sr, sev = zip(*buf.slow)
        stored.append(Objects(list(sev), list(sr)))
    evs = EventStore.join(stored)
    if buf.frames:
        k0 = len(kept)
        t = evs.t[k0:k0 + buf.n].copy()
        at = k0
        for p in buf.parts:  # a decoded frame's stamps: its Counters and Samples have one too
            if type(p) is Timed:
                t[at - k0:at - k0 + len(p.ts)] = p.ts
                at += len(p.ts)
            else:
                at += p.count
        t += np.repeat(offs, counts)
        starts = np.cumsum(counts) - counts
        within = np.arange(len(t)) - np.repeat(starts, counts)
        # Each rank's times never go back: where a frame does, or starts before the
        # rank's previous time, clamp it as `_stamp` would (rare).
        back = np.flatnonzero(np.diff(t) < 0) + 1
        in_frame = np.searchsorted(starts, back, "right") - 1
        bad = set(in_frame[back != starts[in_frame]].tolist())
        for f, last in enumerate(lasts):
            if last is not None and t[starts[f]] < last:
                bad.add(f)
        for f in bad:
            a, b = starts[f], starts[f] + counts[f]
            seg = t[a:b]
            if lasts[f] is not None:
                np.maximum(seg, lasts[f], out=seg)
            np.maximum.accumulate(seg, out=seg)
        t_parts.append(t)
        i_parts.append(np.repeat(inputs, counts))
        n_parts.append(np.repeat(n0, counts) + within + 1)
        r_parts.append(np.repeat(ranks, counts))
    if buf.slow:
        t_parts.append(np.array(st, np.int64))
        i_parts.append(np.array(si, np.int64))
        n_parts.append(np.array(sn, np.int64))
        r_parts.append(np.array(sr, np.int64))
    buf.clear()
    t, i, n, r = (np.concatenate(p) for p in (t_parts, i_parts, n_parts, r_parts))
    order = _merged_order(t, i, n)
    cut = len(t) if limit == float("inf") else int(np.searchsorted(t[order], limit, "left"))
    # Which go (in store order, as they were read and lie in memory: the chunk reads
    # them so) and which stay, by marks rather than sorts: both are index sets.
    emitted = np.zeros(len(t), bool)
    emitted[order[:cut]] = True
    keep = np.flatnonzero(~emitted)
    buf.keep_t, buf.keep_i, buf.keep_n, buf.keep_r = t[keep], i[keep], n[keep], r[keep]
    buf.keep_ev = evs.take(keep)
    if not cut:
        return None
    emit = order[:cut]
    sel = np.flatnonzero(emitted)
    out = Chunk(evs.take(sel), r[sel], (np.cumsum(emitted) - 1)[emit])
    out.times = t[emit]
    return out


def _merged_order(t: np.ndarray, i: np.ndarray, n: np.ndarray) -> np.ndarray:
    """`np.lexsort((n, i, t))`, the (time, input, index) order. Each input's events
    nearly always lie in index order already (kept ones first, then frames as read):
    then two stable sorts, by input (a radix sort of 16-bit keys) and by time, give
    the same order at half the cost; checked, not assumed."""
    if len(t) > 1 and i.min() == i.max() and (n[1:] > n[:-1]).all():  # one input, in its order: by time
        return np.argsort(t, kind="stable")
    if len(t) > 1 and 0 <= i.min() and i.max() < 1 << 15:
        by_input = np.argsort(i.astype(np.int16), kind="stable")
        ib, nb = i[by_input], n[by_input]
        if ((ib[1:] != ib[:-1]) | (nb[1:] > nb[:-1])).all():
            return by_input[np.argsort(t[by_input], kind="stable")]
    return np.lexsort((n, i, t))
