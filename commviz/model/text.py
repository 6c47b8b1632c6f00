"""Wording shared by the diagnoses: rank lists, durations, op labels.

Messages are read by a person in the middle of a hang, so they use the words of the
user's program (the op they called, its sequence number, the group) and compact rank
lists that stay one line long even with hundreds of ranks.
"""

from __future__ import annotations

from collections.abc import Iterable


def rank_list(ranks: Iterable[int]) -> str:
    """`0,1,3` or `0-7,9` (runs of three or more collapse to a range)."""
    rs = sorted(set(ranks))
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{rs[i]}-{rs[j]}")
        else:
            out.extend(str(r) for r in rs[i : j + 1])
        i = j + 1
    return ",".join(out)


def ranks_phrase(ranks: Iterable[int]) -> str:
    """`rank 2` or `ranks 0,1,3`."""
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rank_list(rs)}"


def secs(ns: int | float) -> str:
    """A duration for people: `12.3 s`, `45.0 ms`, `120 µs`."""
    s = max(0.0, ns / 1e9)
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.1f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def coll_label(op: str, seq: int, group: str) -> str:
    """`all_reduce #7 on group 1`."""
    return f"{op} #{seq} on group {group}"


def p2p_label(op: str, seq: int, peer: int, sending: bool) -> str:
    """`recv←1 #0` / `isend→2 #3`: the op, the direction and the peer's global rank."""
    return f"{op}{'→' if sending else '←'}{peer} #{seq}"


def short_error(err: str, limit: int = 100) -> str:
    err = " ".join(err.split())
    return err if len(err) <= limit else err[: limit - 1] + "…"
