"""The words of the hang, dead_rank and p2p_deadlock diagnoses.

A message has to be acted on by a person in the middle of an incident: it names the
op as the user called it, the waiting and missing ranks, what each missing rank does
instead (and on which line of their code), and for cycles the whole cycle.
"""

from __future__ import annotations

from commviz.model import rollcall
from commviz.model.diagnosis import Diagnosis, Kind
from commviz.model.face import ModelFace
from commviz.model.text import ranks_phrase, secs, short_error
from commviz.model.track import InFlight
from commviz.model.waits import RankView, Unit, Waiter, op_label

MAX_ALSO_IN_MESSAGE = 4  # units stuck behind a root cause, named in its message
MAX_MISSING_IN_MESSAGE = 4  # missing ranks described one by one; the rest are listed
MAX_STACKS = 8  # ranks named up to which each one's stack is attached
MAX_DETAIL_RANKS = 32  # per-rank entries kept in a diagnosis' details lists


class Writer:
    """Builds the `Diagnosis` of each root cause; remembers which op of each rank it talked about,
    so the right stack goes with it."""

    def __init__(self, model: ModelFace, view: RankView, units: list[Unit]) -> None:
        self.model = model
        self.view = view
        self.stuck_of: dict[int, list[Unit]] = {}
        for u in units:
            for w in u.stuck():
                self.stuck_of.setdefault(w.rank, []).append(u)

    def where(self, rank: int, op_id: int) -> str:
        r = self.model.ranks.get(rank)
        st = r.stacks.for_op(op_id) if r is not None else None
        return st.where() if st is not None else ""

    def _current(self, rank: int) -> InFlight | None:
        """The op a rank is stuck in (the oldest one), else its oldest in-flight op."""
        mine = [w.fl for u in self.stuck_of.get(rank, []) for w in u.stuck() if w.rank == rank]
        if mine:
            return min(mine, key=lambda f: f.t_wall)
        return self.model.current_op(self.model.ranks[rank])

    def doing(self, rank: int, dead: bool = False) -> tuple[str, dict, int | None]:
        """What a rank is doing instead (or, `dead`, was doing when it died):
        (text, details, the op id it is in)."""
        m, view = self.model, self.view
        r = m.ranks.get(rank)
        if r is None:
            return "no events from it at all (never connected to the watcher?)", {"rank": rank, "state": "unknown"}, None
        info: dict = {"rank": rank}
        fl = self._current(rank)
        op_id = None
        if fl is not None:
            s = fl.start
            op_id = s.id
            age = view.eff_now(rank) - fl.t_wall
            where = self.where(rank, s.id)
            if dead:
                text = f"it was in {op_label(s)}" + (f" ({where})" if where else "")
            else:
                text = f"it is in {op_label(s)} for {secs(age)}" + (f" ({where})" if where else "")
            more = len(r.inflight) - 1
            if more > 0:
                text += f" (+{more} more op{'s' if more > 1 else ''} in flight)"
            info.update(state="in_op", op=s.op, group=s.group, seq=s.seq, peer=s.peer, op_id=s.id,
                        for_s=round(age / 1e9, 3), where=where)
        else:
            ls = r.last_start
            if ls is not None:
                ago = view.now - r.last_op_end
                if dead:
                    text = f"its last op was {op_label(ls)}, ended {secs(ago)} ago"
                else:
                    text = f"no op in flight — last op {op_label(ls)} ended {secs(ago)} ago"
                info.update(state="idle", last_op=ls.op, last_group=ls.group, last_seq=ls.seq,
                            last_op_ended_s_ago=round(ago / 1e9, 3))
            else:
                text = "it had not called any op yet" if dead else "no op in flight, and no op yet"
                info.update(state="idle")
            st = r.stacks.culprit(r.last_op_end)
            uf = st.user_frame if st is not None else None
            if uf is not None:
                where = st.where()
                text += f"; {'it was' if dead else 'now'} in {uf.function} ({where})"
                info.update(where=where, function=uf.function)
        note = view.gone_note(rank)
        if note is not None:
            info["gone"] = note
            if not dead:
                text += f"; {note}"
        elif r.last_seen and view.now - r.last_seen >= view.th.silent_after_ns:
            silent = view.now - r.last_seen
            info["silent_s"] = round(silent / 1e9, 3)
            text += f"; no events from it for {secs(silent)} (frozen, or its connection is cut?)"
        if r.dropped:
            info["dropped"] = r.dropped
            text += f" (it dropped {r.dropped} events: some of its ops may be missing here)"
        return text, info, op_id

    def waiting_clause(self, u: Unit) -> str:
        parts = []
        stuck = u.stuck()
        if stuck:
            wheres = {self.where(w.rank, w.fl.start.id) for w in stuck} - {""}
            at = f" at {wheres.pop()}" if len(wheres) == 1 else ""
            parts.append(f"{ranks_phrase(w.rank for w in stuck)} waiting {secs(max(w.age for w in stuck))}{at}")
        failed = u.failed()
        if failed:
            parts.append(
                f"{ranks_phrase(w.rank for w in failed)} failed after {secs(max(w.age for w in failed))} "
                f"({short_error(failed[0].error)})"
            )
        return "; ".join(parts)

    def head(self, u: Unit) -> str:
        if u.p2p:
            src, dst = (u.waiters[0].rank, u.peer) if u.sending else (u.peer, u.waiters[0].rank)
            return f"{u.op} #{u.seq} on group {u.group} (rank {src} → rank {dst})"
        return f"{u.op} #{u.seq} on group {u.group} ({ranks_phrase(u.members)})"

    def missing_clause(self, u: Unit, rank: int) -> tuple[str, dict, int | None]:
        verb = f"posted the matching {'recv' if u.sending else 'send'}" if u.p2p else "entered it"
        if rank in u.dead:
            note = self.view.gone_note(rank) or "it is gone"
            text, info, op_id = self.doing(rank, dead=True)
            if rank in u.entered:
                return f"rank {rank} died inside it — {note}", info, op_id
            return f"rank {rank} is dead and never {verb} — {note}; {text}", info, op_id
        text, info, op_id = self.doing(rank)
        r = self.model.ranks.get(rank)
        if not u.p2p and r is not None and r.seqs.get(u.group, -1) > u.seq:
            # It counted this collective, so its start (or end) was lost on the way.
            text += f" (it already started #{r.seqs[u.group]} on group {u.group}: its record of #{u.seq} was lost)"
        return f"rank {rank} never {verb} — {text}", info, op_id

    def unit_diagnosis(self, u: Unit) -> tuple[Diagnosis, dict[int, int]]:
        """A hang or dead_rank diagnosis for one unit; also the op id per rank it names."""
        ops: dict[int, int] = {w.rank: w.fl.start.id for w in u.waiters}
        alive = [m for m in u.missing if m not in u.dead]
        shown = set(u.dead) | set(alive[:MAX_MISSING_IN_MESSAGE])
        rest = alive[MAX_MISSING_IN_MESSAGE:]
        clauses, infos = [], []
        for m in u.missing:
            text, info, op_id = self.missing_clause(u, m)
            if m in shown:
                clauses.append(text)
            infos.append(info)
            if op_id is not None:
                ops.setdefault(m, op_id)
        if rest:
            clauses.append(f"{ranks_phrase(rest)} {'is' if len(rest) == 1 else 'are'} missing too (see details)")
        msg = f"{self.head(u)}: {self.waiting_clause(u)}; " + "; ".join(clauses)
        d = Diagnosis(
            Kind.DEAD_RANK if u.dead else Kind.HANG, u.group, u.seq, u.op,
            waiting_ranks=sorted(w.rank for w in u.waiters),
            missing_ranks=list(u.missing),
            culprit_ranks=list(u.dead) if u.dead else list(u.missing),
            message=msg,
            details={
                "members": list(u.members),
                "waits": [self._wait_info(w) for w in u.waiters],
                "missing": infos,
            },
        )
        return d, ops

    def _wait_info(self, w: Waiter) -> dict:
        d = {"rank": w.rank, "op_id": w.fl.start.id, "waited_s": round(w.age / 1e9, 3)}
        where = self.where(w.rank, w.fl.start.id)
        if where:
            d["where"] = where
        if w.error:
            d["error"] = w.error
        return d

    def cross_hang(self, comp: list[Unit]) -> tuple[Diagnosis, dict[int, int]]:
        """Collectives only, waiting on each other across groups: the ranks call them
        in a different order. Each unit's waiters vote for "this op comes first", so
        the unit with the fewest missing ranks is the majority's order and its missing
        ranks are the odd ones out. On a tie, the unit that got stuck first (its
        waiters all arrived first) is reported, and the message says it is a tie."""
        key = lambda u: (len(u.missing), u.stuck_since(), -len(u.waiters), u.group, u.seq)  # noqa: E731
        primary = min(comp, key=key)
        tie = sum(1 for u in comp if len(u.missing) == len(primary.missing)) > 1
        d, ops = self.unit_diagnosis(primary)
        others = [u for u in comp if u is not primary]
        for o in sorted(others, key=lambda u: (u.group, u.seq)):
            d.message += (
                f"; {ranks_phrase(o.missing)} in turn never entered {o.label()}, "
                f"where {ranks_phrase(w.rank for w in o.stuck())} wait{'s' if len(o.stuck()) == 1 else ''}"
            )
            for w in o.waiters:
                ops.setdefault(w.rank, w.fl.start.id)
        d.message += " — the ranks call these collectives in a different order"
        if tie:
            d.message += " (as many ranks on each side: either side may be the one out of order)"
        d.details["cycle"] = [self._unit_info(u) for u in [primary, *others]]
        return d, ops

    def _unit_info(self, u: Unit) -> dict:
        return {
            "op": u.op,
            "group": u.group,
            "seq": u.seq,
            "peer": u.peer if u.p2p else None,
            "waiting_ranks": sorted(w.rank for w in u.waiters),
            "missing_ranks": list(u.missing),
        }

    def deadlock(self, comp: list[Unit]) -> tuple[Diagnosis, dict[int, int]]:
        """A cycle of waits through at least one p2p op."""
        in_comp = {w.rank for u in comp for w in u.stuck()}
        step: dict[int, list[tuple[int, Unit]]] = {}
        for u in comp:
            for w in u.stuck():
                for m in u.missing:
                    if m in in_comp and m not in u.dead:
                        step.setdefault(w.rank, []).append((m, u))
        for r in step:
            step[r].sort(key=lambda mu: (mu[0], mu[1].first_t()))
        r0 = min(step)
        path: list[int] = [r0]
        via: list[Unit] = []
        cur = r0
        while True:
            m, u = step[cur][0]
            via.append(u)
            if m in path:
                i = path.index(m)
                cycle, cyc_units = path[i:], via[i:]
                break
            path.append(m)
            cur = m
        ops: dict[int, int] = {}
        bits = []
        for k, (rank, u) in enumerate(zip(cycle, cyc_units)):
            nxt = cycle[(k + 1) % len(cycle)]
            w = next(w for w in u.stuck() if w.rank == rank)
            ops[rank] = w.fl.start.id
            where = self.where(rank, w.fl.start.id)
            at = f" ({where})" if where else ""
            if k == 0:
                bits.append(f"rank {rank} in {u.label()}{at} waits for rank {nxt}")
            else:
                bits.append(f"which is in {u.label()}{at} waiting for rank {nxt}")
        primary = next((u for u in cyc_units if u.p2p), cyc_units[0])
        age = max(w.age for u in cyc_units for w in u.stuck())
        msg = (
            f"p2p deadlock on group {primary.group}: " + ", ".join(bits)
            + f" — a cycle, stuck for {secs(age)}: none of them can post the op the next one waits for"
        )
        for u in comp:
            for w in u.waiters:
                ops.setdefault(w.rank, w.fl.start.id)
        d = Diagnosis(
            Kind.P2P_DEADLOCK, primary.group, primary.seq, primary.op,
            waiting_ranks=sorted({w.rank for u in comp for w in u.stuck()}),
            missing_ranks=sorted({m for u in comp for m in u.missing}),
            culprit_ranks=sorted(cycle),
            message=msg,
            details={
                "cycle": [
                    dict(self._unit_info(u), rank=rank, waits_for=cycle[(k + 1) % len(cycle)])
                    for k, (rank, u) in enumerate(zip(cycle, cyc_units))
                ],
                "waits": [self._wait_info(w) for u in comp for w in u.waiters],
            },
        )
        return d, ops

    def add_upstream(self, d: Diagnosis, ops: dict[int, int], behind: list[Unit]) -> None:
        """Units stuck only because of this root cause: listed, not reported again."""
        if not behind:
            return
        items, words = [], []
        for u in sorted(behind, key=lambda u: (u.first_t(), u.group, u.seq)):
            for w in u.stuck():
                ops.setdefault(w.rank, w.fl.start.id)
            items.append(dict(self._unit_info(u), waited_s=round(max(w.age for w in u.waiters) / 1e9, 3)))
            words.append(f"{ranks_phrase(w.rank for w in u.waiters)} in {u.label()}")
        d.details["also_blocked"] = items
        shown = words[:MAX_ALSO_IN_MESSAGE]
        more = len(words) - len(shown)
        d.message += "; also stuck behind it: " + ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def attach_stacks(self, d: Diagnosis, ops: dict[int, int]) -> None:
        """The stacks of the ranks the diagnosis names, for the op it names (or, for a
        rank in no op, its latest quiet stack), and the roll-call of its ranks. Past
        MAX_STACKS ranks, one stack per roll-call group and the culprits' own: the
        diagnosis stays small at any number of ranks."""
        if not ops and not d.missing_ranks:
            return
        ranks = set(ops) | set(d.missing_ranks) | set(d.details.get("members", ()))
        places = [self.place(rank, ops.get(rank)) for rank in ranks]
        groups = rollcall.roll_call(places)
        if len(ranks) <= MAX_STACKS:
            picked = {p.rank: p.stack for p in places if p.stack is not None}
        else:
            picked = {g.stack_rank: g.stack for g in groups[:MAX_STACKS] if g.stack is not None}
            for p in places:
                if p.rank in d.culprit_ranks and p.stack is not None and len(picked) < 2 * MAX_STACKS:
                    picked[p.rank] = p.stack
        d.stacks = [picked[rank].to_json(rank, self.view.now) for rank in sorted(picked)]
        if len(groups) > 1 or len(ranks) > MAX_STACKS:
            d.details["roll_call"] = rollcall.groups_json(groups)
            if any(g.where for g in groups):  # without stacks it would only repeat the message
                d.message += "; " + rollcall.summary_line(groups)
        for key in ("waits", "missing"):  # one entry per rank: bounded too
            items = d.details.get(key)
            if isinstance(items, list) and len(items) > MAX_DETAIL_RANKS:
                d.details[key] = items[:MAX_DETAIL_RANKS]
                d.details[key + "_more"] = len(items) - MAX_DETAIL_RANKS

    def place(self, rank: int, op_id: int | None) -> rollcall.Place:
        return rollcall.place(self.model, rank, op_id)
