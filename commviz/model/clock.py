"""Time in the model: one clock offset per rank, one order of events.

Each rank stamps events with its monotonic clock; its Hello says what that clock read
(`mono_ns`) at a wall-clock instant (`wall_ns`). Everything the model, replay and the
exporters show is on the wall clock: a rank's stamp plus its offset. A trace is fed
in one order, by that time, whoever reads it (summary, replay, export).
"""

from __future__ import annotations

from typing import Iterable

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
