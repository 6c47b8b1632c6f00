"""Roll-call: the ranks of a diagnosis grouped by where they are.

At 1,024 ranks nobody reads a stack per rank. What a person needs is that 1,020 ranks
are in the all_reduce at train.py:88, 3 are in `load_shard` at data.py:41 and rank 17
is in `save` at ckpt.py:12: the odd groups, smallest first, each with its ranks and
one stack to open. A rank's place is its state (in which op, or in none) and the
user frame of its latest stack: the one for the op it is in, else the one its probe
took when it started no op for a while (newer than its last op).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from commviz.model.face import ModelFace
from commviz.model.stacks import StackInfo
from commviz.model.text import rank_list

MAX_GROUPS_JSON = 32  # groups listed in a diagnosis' details; the rest are counted
MAX_GROUPS_TEXT = 4  # groups named in its message
MAX_RANKS_TEXT = 60  # characters of a group's rank list in the message


@dataclass(frozen=True)
class Place:
    """Where one rank is: `op` the op it is in ("" for none), and its stack's user frame."""

    rank: int
    op: str
    stack: StackInfo | None

    @property
    def key(self) -> tuple[str, str, str]:
        uf = self.stack.user_frame if self.stack is not None else None
        return (self.op, self.stack.where() if self.stack is not None else "", uf.function if uf is not None else "")


@dataclass
class Group:
    op: str  # "" when these ranks are in no op
    where: str  # "train.py:88", "" when no stack is known
    function: str
    ranks: list[int] = field(default_factory=list)
    stack: StackInfo | None = None  # the lowest rank's, to show for the group
    stack_rank: int = -1

    def phrase(self) -> str:
        """`3 ranks (5,9,17) in no op, in load_shard at data.py:41`."""
        n = len(self.ranks)
        rl = rank_list(self.ranks)
        if len(rl) > MAX_RANKS_TEXT:
            rl = rl[:MAX_RANKS_TEXT].rsplit(",", 1)[0] + ",…"
        who = f"rank {self.ranks[0]}" if n == 1 else f"{n} ranks ({rl})"
        state = f"in {self.op}" if self.op else "in no op"
        if not self.where:
            return f"{who} {state}, no stack yet"
        fn = f"in {self.function} " if self.function else ""
        return f"{who} {state}, {fn}at {self.where}"

    def to_json(self) -> dict:
        return {"op": self.op, "where": self.where, "function": self.function, "count": len(self.ranks),
                "ranks": rank_list(self.ranks), "stack_rank": self.stack_rank}


def roll_call(places: Iterable[Place]) -> list[Group]:
    """Groups of ranks in the same place, the smallest (the odd ones) first."""
    by: dict[tuple, Group] = {}
    for p in sorted(places, key=lambda p: p.rank):
        k = p.key
        g = by.get(k)
        if g is None:
            g = by[k] = Group(*k)
        g.ranks.append(p.rank)
        if g.stack is None and p.stack is not None:
            g.stack, g.stack_rank = p.stack, p.rank
    return sorted(by.values(), key=lambda g: (len(g.ranks), g.ranks[0]))


def summary_line(groups: list[Group]) -> str:
    """`roll-call: rank 2 in no op, in slow_step at pipe.py:30 · 3 ranks (0,1,3) in recv …`."""
    shown = groups[:MAX_GROUPS_TEXT]
    more = len(groups) - len(shown)
    return "roll-call: " + " · ".join(g.phrase() for g in shown) + (
        f" · {more} more group{'s' if more > 1 else ''} (see details)" if more > 0 else "")


def groups_json(groups: list[Group]) -> dict:
    shown = groups[:MAX_GROUPS_JSON]
    return {"groups": [g.to_json() for g in shown], "more_groups": len(groups) - len(shown)}


def place(model: ModelFace, rank: int, op_id: int | None = None) -> Place:
    """Where `rank` is in `model`: the op `op_id` (the one a diagnosis names for it)
    if it is still in it, else the op it is in, else none; with the stack that says
    where in its code (the op's own, else a quiet capture taken since it began)."""
    r = model.ranks.get(rank)
    if r is None:
        return Place(rank, "(no events)", None)
    fl = r.inflight.get(op_id) if op_id is not None else None
    if fl is None:
        fl = model.current_op(r)
    if fl is not None:
        return Place(rank, fl.start.op, r.stacks.for_op(fl.start.id) or r.stacks.culprit(fl.t_wall))
    if op_id is not None:  # the op the diagnosis names has ended for it (failed there)
        ls = r.last_start
        return Place(rank, ls.op if ls is not None and ls.id == op_id else "", r.stacks.for_op(op_id))
    return Place(rank, "", r.stacks.culprit(r.last_op_end))
