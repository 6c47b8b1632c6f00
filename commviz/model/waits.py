"""Stuck units: what waits on whom right now.

A *stuck unit* is a collective instance some members are inside while others never
came (or died), or a p2p op whose match the peer never posted — once it has waited
longer than the hang threshold, or at once when the rank it waits for is dead. A
rank that is gone is judged by its last sign of life: it waited no longer than it
lived, and it is only blamed as dead when the rest of the job outlived it.
"""

from __future__ import annotations

from dataclasses import dataclass

from commviz import ops as opcat
from commviz.events import OpStart
from commviz.model.diagnosis import RankStatus
from commviz.model.face import ModelFace
from commviz.model.text import coll_label, p2p_label
from commviz.model.thresholds import Thresholds
from commviz.model.track import InFlight, is_interrupt


@dataclass
class Waiter:
    rank: int
    fl: InFlight
    age: int  # ns waited: until now, its last sign of life, or its failure
    error: str = ""  # the op ended with this error while waiting


@dataclass(eq=False)
class Unit:
    """One stuck thing: a collective instance, or one p2p op waiting for its match."""

    p2p: bool
    group: str
    seq: int
    op: str
    members: list[int]  # collective: the group's ranks; p2p: the two ends
    waiters: list[Waiter]
    missing: list[int]  # the ranks it waits for
    dead: list[int]  # those of `missing` that are gone and are the cause
    entered: set[int]  # ranks that entered it
    peer: int = -1  # p2p: the peer's global rank
    sending: bool = False  # p2p: the waiting side sends

    def stuck(self) -> list[Waiter]:
        return [w for w in self.waiters if not w.error]

    def failed(self) -> list[Waiter]:
        return [w for w in self.waiters if w.error]

    def first_t(self) -> int:
        return min(w.fl.t_wall for w in self.waiters)

    def stuck_since(self) -> int:
        """When its last waiter arrived: from then on only the missing ranks count."""
        return max(w.fl.t_wall for w in self.waiters)

    def label(self) -> str:
        if self.p2p:
            return p2p_label(self.op, self.seq, self.peer, self.sending)
        return coll_label(self.op, self.seq, self.group)


def op_label(s: OpStart) -> str:
    """`broadcast #7 on group 0` or `recv←1 #0 on group 0`."""
    spec = opcat.spec(s.op)
    if spec is not None and spec.kind == opcat.P2P:
        return p2p_label(s.op, s.seq, s.peer, spec.direction == "send") + f" on group {s.group}"
    return coll_label(s.op, s.seq, s.group)


class RankView:
    """Per-rank facts every diagnosis needs: gone or not, since when, and how long
    the rest of the job was still heard from afterwards."""

    def __init__(self, model: ModelFace, now: int, th: Thresholds) -> None:
        self.model = model
        self.now = now
        self.th = th
        # Latest sign of life per rank: `now` while it runs, its last event once gone.
        alive = sorted(((self._alive_until(k), k) for k in model.ranks), reverse=True)
        self._top = alive[:2]

    def _alive_until(self, rank: int) -> int:
        r = self.model.ranks[rank]
        return max(r.last_seen, r.gone_t) if r.gone else self.now

    def gone(self, rank: int) -> bool:
        r = self.model.ranks.get(rank)
        return r is not None and r.gone

    def death_t(self, rank: int) -> int:
        r = self.model.ranks[rank]
        return r.gone_t or r.last_seen

    def eff_now(self, rank: int) -> int:
        """The end of a rank's current wait as far as we know: now, or when it was last
        heard from if it is gone (it waited no longer than it lived)."""
        r = self.model.ranks.get(rank)
        return self._alive_until(rank) if r is not None else self.now

    def others_alive_until(self, rank: int) -> int | None:
        for t, k in self._top:
            if k != rank:
                return t
        return None

    def died_early(self, rank: int) -> bool:
        """Gone before the rest of the job: it exited normally, or the others were heard
        from for `dead_grace_s` after it (so it died while they ran, not with them when
        the run was killed)."""
        if not self.gone(rank):
            return False
        r = self.model.ranks[rank]
        if self.stopped_with_run(rank):
            return False
        if r.status is RankStatus.EXITED and r.gone_reason == "exit":
            # It said goodbye on a normal interpreter exit: it will not come back to a
            # collective it has not entered, whenever the others notice.
            return True
        other = self.others_alive_until(rank)
        return other is not None and other - self.death_t(rank) >= self.th.dead_grace_ns

    def stopped_with_run(self, rank: int) -> bool:
        """Stopped by commviz with the run (record's hang timeout, a quit watch) while
        it was alive: heard from within the grace before the stop. It died with the
        others, however far apart their ends reached us (on a loaded box, more than
        the grace apart, the others' ops then failing for it: it was blamed as a dead
        rank, in place of the hang it was stopped for). A rank silent longer than that
        before the stop died on its own (on another host, commviz learns of no death
        but by its silence), and is judged as any gone rank."""
        r = self.model.ranks[rank]
        st = r.stopped
        return st is not None and st.t + r.offset_ns - r.last_seen < self.th.dead_grace_ns

    def dead_cause(self, rank: int, evidence: bool) -> bool:
        """Gone and to blame: it died early, or a waiter's op failed while it was gone;
        never a rank commviz stopped with the run (the waiters' ops then fail because
        of that stop, not of it)."""
        if not self.gone(rank) or self.stopped_with_run(rank):
            return False
        return evidence or self.died_early(rank)

    def gone_note(self, rank: int) -> str | None:
        return self.model.gone_note(rank)


def collective_units(model: ModelFace, view: RankView, skip: set[tuple[str, int]]) -> list[Unit]:
    th = view.th
    out = []
    for key, inst in model.pending.items():
        if key in skip:
            continue
        g = model.groups.get(inst.group)
        if g is None:
            continue  # members unknown: nobody can be named missing
        waiters: list[Waiter] = []
        dead_inside: list[int] = []
        for r, fl in inst.starts.items():
            if r in inst.ended:
                f = inst.failed.get(r)
                if f is not None and not is_interrupt(f[1]):
                    waiters.append(Waiter(r, fl, f[0] - fl.t_wall, f[1]))
                continue
            if view.died_early(r):
                dead_inside.append(r)
            else:
                waiters.append(Waiter(r, fl, view.eff_now(r) - fl.t_wall))
        if not waiters:
            continue
        missing = sorted({m for m in g.ranks if m not in inst.starts} | set(dead_inside))
        if not missing:
            continue
        evidence = any(w.error for w in waiters)
        dead = [m for m in missing if view.dead_cause(m, evidence)]
        if not dead and max(w.age for w in waiters) < th.hang_after_ns:
            continue
        waiters.sort(key=lambda w: w.rank)
        out.append(Unit(False, inst.group, inst.seq, inst.op, list(g.ranks), waiters, missing, dead, set(inst.starts)))
    return out


def p2p_units(model: ModelFace, view: RankView) -> list[Unit]:
    th = view.th
    out = []
    for pair in model.tracker.pairs.values():
        if (pair.send is None) == (pair.recv is None):
            continue  # both ends posted (matched), or neither
        side = pair.send if pair.send is not None else pair.recv
        sending = pair.send is not None
        peer = pair.dst if sending else pair.src
        if side.ended:
            if not side.error or is_interrupt(side.error):
                continue  # it finished without a match (a buffered isend): nobody waits
            w = Waiter(side.rank, side.fl, side.end_wall - side.fl.t_wall, side.error)
        else:
            if view.died_early(side.rank):
                continue
            w = Waiter(side.rank, side.fl, view.eff_now(side.rank) - side.fl.t_wall)
        dead = [peer] if view.dead_cause(peer, bool(w.error)) else []
        if not dead and w.age < th.hang_after_ns:
            continue
        out.append(
            Unit(True, pair.group, pair.seq, side.fl.start.op, sorted({side.rank, peer}), [w], [peer], dead,
                 {side.rank}, peer=peer, sending=sending)
        )
    return out
