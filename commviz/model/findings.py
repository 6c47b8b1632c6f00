"""Turning what the ranks are inside of into diagnoses a person can act on.

The model knows, for every collective instance (group, seq) and every p2p message,
who entered and who left. A *stuck unit* is one that has waited too long (or whose
peer is dead): a collective some members are inside while others never came, or a p2p
op whose match was never posted. Units wait on ranks, ranks are stuck in units, so
they form a wait-for graph. Its strongly connected components that nothing else
explains (the sinks) are the root causes, one diagnosis each:

- one unit whose missing rank is dead                 → dead_rank
- one unit whose missing rank is alive                → hang (say what that rank does)
- a cycle through a p2p op                            → p2p_deadlock (show the cycle)
- a cycle of collectives only (order differs by group) → hang on the unit with the
  fewest missing ranks (the odd ones out are the culprits; on a tie, the unit whose
  waiters were all there first)

Units that wait behind a root cause are listed with it rather than reported again.
Desyncs (same instance, different arguments) and stragglers come from their own
modules. Everything is a pure function of the model and `now`.
"""

from __future__ import annotations

from dataclasses import dataclass

from commviz.model import desync as desync_mod
from commviz.model.diagnosis import Diagnosis
from commviz.model.explain import Writer
from commviz.model.face import ModelFace
from commviz.model.waitgraph import build_graph
from commviz.model.waits import RankView, collective_units, p2p_units


@dataclass
class Findings:
    diagnoses: list[Diagnosis]
    hung: frozenset[int]  # ranks whose in-flight op is part of a diagnosis
    missing: frozenset[int]  # ranks others wait for (see `Kind.names_missing`)

    def to_json(self) -> list[dict]:
        return [d.to_json() for d in self.diagnoses]


def diagnose(model: ModelFace, now: int) -> Findings:
    """Every diagnosis at `now`, most fundamental first: desync, dead_rank,
    p2p_deadlock, hang, straggler."""
    th = model.thresholds
    view = RankView(model, now, th)
    diags: list[tuple[Diagnosis, dict[int, int]]] = []

    # Desyncs in flight (and the instances they explain are not also called hangs).
    live_desync: set[tuple[str, int]] = set()
    for key, inst in model.pending.items():
        if len(inst.starts) < 2:
            continue
        g = model.groups.get(inst.group)
        members = list(g.ranks) if g is not None else sorted(inst.starts)
        d = desync_mod.collective_desync(inst, members, view.gone_note, finished=False)
        if d is not None:
            live_desync.add(key)
            diags.append((d, {r: fl.start.id for r, fl in inst.starts.items()}))
    for pair in model.tracker.pairs.values():
        d = desync_mod.p2p_desync(pair)
        if d is not None:
            diags.append((d, {side.rank: side.fl.start.id for side in (pair.send, pair.recv)}))
    for d in model.desync_history.values():
        diags.append((d.copy(), {}))

    units = collective_units(model, view, live_desync) + p2p_units(model, view)
    writer = Writer(model, view, units)
    if units:
        g = build_graph(units)
        for c in g.sinks:
            comp = [units[i] for i in g.members[c]]
            if len(comp) == 1:
                d, ops = writer.unit_diagnosis(comp[0])
            elif any(u.p2p for u in comp):
                d, ops = writer.deadlock(comp)
            else:
                d, ops = writer.cross_hang(comp)
            writer.add_upstream(d, ops, [units[i] for i in g.upstream.get(c, [])])
            diags.append((d, ops))

    for d in model.stragglers.find(th, {gid: list(gd.ranks) for gid, gd in model.groups.items()}):
        diags.append((d, {}))

    for d, ops in diags:
        writer.attach_stacks(d, ops)
    out = sorted((d for d, _ in diags), key=lambda d: d.sort_key)
    hung = frozenset(w.rank for u in units for w in u.stuck())
    missing = frozenset(m for d in out if d.kind.names_missing for m in d.missing_ranks)
    return Findings(out, hung, missing)
