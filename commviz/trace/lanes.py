"""Lanes for overlapping intervals: Perfetto and chrome://tracing require the complete
("X") slices of one track to nest, so ops of one rank and group that overlap (isend
beside irecv, async collectives in flight together) each go on a lane of their own."""

from __future__ import annotations


def assign_lanes(spans: list[tuple[int, int]]) -> list[int]:
    """A lane per span (start, end), in the input's order: lane 0 unless it overlaps
    an earlier span there. Spans in one lane are disjoint (touching is fine), and
    the number of lanes is the most spans ever open at once, so a run without
    overlap stays on one track."""
    lanes: list[int] = [0] * len(spans)
    free_at: list[int] = []  # per lane: when its last span ends
    for i in sorted(range(len(spans)), key=lambda k: spans[k]):
        lanes[i] = take_lane(free_at, *spans[i])
    return lanes


def take_lane(free_at: list[int], start: int, end: int) -> int:
    """The first lane free by `start` (a new one if none is), now taken until `end`;
    `free_at` holds when each lane's last span ends. Spans must come in start order:
    the streaming exporter carries `free_at` per track from one flush to the next."""
    for lane, t in enumerate(free_at):
        if t <= start:
            break
    else:
        lane = len(free_at)
        free_at.append(0)
    free_at[lane] = max(start, end)
    return lane
