"""Desync: ranks that entered the same collective instance (or the two ends of the
same p2p message) with different arguments.

Ranks agree on (group, seq) exactly when they called the same collectives in the same
order, so a different op, byte count, dtype, root or reduce op at the same (group,
seq) is a bug in the program — on gloo it often kills a rank within milliseconds, on
NCCL it may hang or silently compute garbage. The diagnosis says who differs from
whom and how; the value most ranks used is taken as the intended one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from commviz import ops as opcat
from commviz.events import OpStart
from commviz.model.diagnosis import Diagnosis, Kind
from commviz.model.text import ranks_phrase, short_error
from commviz.model.track import Instance, P2PPair

FIELDS = ("op", "bytes", "dtype", "root", "reduce_op")
_FIELD_WORDS = {"op": "the op", "bytes": "size", "dtype": "dtype", "root": "root", "reduce_op": "reduce op"}

# Names torch exposes for the same underlying collective: calling one on a rank and
# another on its peer is not a desync.
_SAME_COLLECTIVE = {
    "all_gather_single": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "ddp_bucket": "all_reduce",
}
# Ops whose per-rank byte counts legitimately differ (uneven splits).
_BYTES_MAY_DIFFER = {"all_to_all", "all_to_all_single"}


def signature(s: OpStart) -> dict[str, object]:
    """The fields of a start that must agree across ranks; a field that cannot be
    compared for this op (no payload, no root, no reduce op) is left out."""
    spec = opcat.spec(s.op)
    sig: dict[str, object] = {"op": _SAME_COLLECTIVE.get(s.op, s.op)}
    if spec is not None and spec.bytes_rule not in (opcat.INNER, opcat.NONE) and s.op not in _BYTES_MAY_DIFFER:
        sig["bytes"] = s.bytes
    if s.dtype:
        sig["dtype"] = s.dtype
    if spec is not None and spec.root_arg and s.root >= 0:
        sig["root"] = s.root
    if s.reduce_op:
        sig["reduce_op"] = s.reduce_op
    return sig


@dataclass
class Mismatch:
    fields: list[str]  # the fields that differ, in FIELDS order
    # field -> [(value, ranks)], the intended (majority) value first
    values: dict[str, list[tuple[object, list[int]]]]
    culprits: list[int]


def compare(sigs: dict[int, dict[str, object]]) -> Mismatch | None:
    """Compare per-rank signatures. If the ops differ, only the op is reported (the
    other fields of different ops are not comparable). The intended value of a field
    is the one most ranks used; on a tie, the one the lowest rank used."""
    if len(sigs) < 2:
        return None
    fields: list[str] = []
    values: dict[str, list[tuple[object, list[int]]]] = {}
    culprits: set[int] = set()
    for f in FIELDS:
        by_value: dict[object, list[int]] = {}
        for rank in sorted(sigs):
            if f in sigs[rank]:
                by_value.setdefault(sigs[rank][f], []).append(rank)
        if len(by_value) < 2:
            continue
        ordered = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
        fields.append(f)
        values[f] = ordered
        for _, ranks in ordered[1:]:
            culprits.update(ranks)
        if f == "op":
            break
    if not fields:
        return None
    return Mismatch(fields, values, sorted(culprits))


def _field_phrase(field: str, value: object, ranks: list[int], shapes: dict[int, list[int]]) -> str:
    who = ranks_phrase(ranks)
    if field == "op":
        return f"{who} called {value}"
    if field == "bytes":
        shape = shapes.get(ranks[0])
        return f"{who} passed {value} B" + (f" (shape {list(shape)})" if shape else "")
    if field == "dtype":
        return f"{who} passed {value}"
    if field == "root":
        return f"{who} used root {value}"
    return f"{who} used reduce op {value}"


def describe(m: Mismatch, shapes: dict[int, list[int]]) -> str:
    """`size — rank 1 passed 8192 B (shape [2048]), ranks 0,2,3 passed 4096 B (shape [1024])`."""
    parts = []
    for f in m.fields:
        vals = m.values[f]
        odd = [_field_phrase(f, v, rs, shapes) for v, rs in vals[1:]]
        parts.append(f"{_FIELD_WORDS[f]}: " + ", ".join(odd + [_field_phrase(f, vals[0][0], vals[0][1], shapes)]))
    return "; ".join(parts)


def _all_alike(inst: Instance) -> bool:
    """Every start has the same fields a signature is made of, so no two signatures differ."""
    first = None
    for fl in inst.starts.values():
        s = fl.start
        key = (s.op, s.bytes, s.dtype, s.root, s.reduce_op)
        if first is None:
            first = key
        elif key != first:
            return False
    return True


def collective_desync(
    inst: Instance,
    members: list[int],
    gone_note: Callable[[int], str | None],
    finished: bool,
) -> Diagnosis | None:
    """The desync diagnosis of one instance, or None when its ranks agree.
    `gone_note(rank)` says how a rank's process ended (None while it runs)."""
    if _all_alike(inst):
        return None  # the common case, checked without building signatures
    sigs = {r: signature(fl.start) for r, fl in inst.starts.items()}
    m = compare(sigs)
    if m is None:
        return None
    ref_canon = m.values["op"][0][0] if "op" in m.fields else sigs[min(sigs)]["op"]
    ref_op = next(fl.start.op for r, fl in sorted(inst.starts.items()) if sigs[r]["op"] == ref_canon)
    shapes = {r: fl.start.shape for r, fl in inst.starts.items()}
    head = f"{ref_op} #{inst.seq} on group {inst.group} ({ranks_phrase(members or sorted(inst.starts))})"
    msg = f"{head}: ranks disagree on " + describe(m, shapes)
    inside = inst.inside()
    died = []
    for r in sorted(inst.starts):
        if r in inst.ended:
            continue
        note = gone_note(r)
        if note is not None:
            died.append(r)
            msg += f"; rank {r} started it and never finished: {note}"
    missing = sorted(set(members) - set(inst.starts))
    if missing:
        msg += f"; {ranks_phrase(missing)} not in it yet"
    if inst.failed:
        fr = sorted(inst.failed)
        msg += f"; it failed on {ranks_phrase(fr)} ({short_error(inst.failed[fr[0]][1])})"
    elif finished:
        msg += "; it completed anyway — its results are likely wrong"
    per_rank = []
    for r in sorted(inst.starts):
        s = inst.starts[r].start
        per_rank.append(
            {"rank": r, "op": s.op, "bytes": s.bytes, "dtype": s.dtype, "shape": list(s.shape), "root": s.root,
             "reduce_op": s.reduce_op, "op_id": s.id}
        )
    return Diagnosis(
        Kind.DESYNC, inst.group, inst.seq, ref_op,
        waiting_ranks=[r for r in inside if r not in died],
        missing_ranks=missing,
        culprit_ranks=m.culprits,
        message=msg,
        details={"differs": m.fields, "per_rank": per_rank, "died": died, "completed": finished},
    )


def p2p_desync(pair: P2PPair) -> Diagnosis | None:
    """The two ends of one p2p message disagree on its size or dtype."""
    if pair.send is None or pair.recv is None:
        return None
    s, r = pair.send.fl.start, pair.recv.fl.start
    ss, rs = opcat.spec(s.op), opcat.spec(r.op)
    differs = []
    if ss is not None and rs is not None and ss.bytes_rule == rs.bytes_rule == opcat.TENSOR and s.bytes != r.bytes:
        differs.append("bytes")
    if s.dtype and r.dtype and s.dtype != r.dtype:
        differs.append("dtype")
    if not differs:
        return None
    src, dst = pair.src, pair.dst
    msg = (
        f"{s.op}→{dst} #{pair.seq} on rank {src} and {r.op}←{src} #{pair.seq} on rank {dst} (group {pair.group}) "
        f"disagree on {' and '.join(_FIELD_WORDS[f] for f in differs)}: rank {src} sends {s.bytes} B "
        f"{s.dtype or '?'} (shape {list(s.shape)}), rank {dst} receives into {r.bytes} B {r.dtype or '?'} "
        f"(shape {list(r.shape)})"
    )
    waiting = sorted(side.rank for side in (pair.send, pair.recv) if not side.ended)
    return Diagnosis(
        Kind.DESYNC, pair.group, pair.seq, s.op,
        waiting_ranks=waiting,
        missing_ranks=[],
        culprit_ranks=sorted({src, dst}),
        message=msg,
        details={
            "differs": differs,
            "per_rank": [
                {"rank": src, "op": s.op, "bytes": s.bytes, "dtype": s.dtype, "shape": list(s.shape), "peer": dst, "op_id": s.id},
                {"rank": dst, "op": r.op, "bytes": r.bytes, "dtype": r.dtype, "shape": list(r.shape), "peer": src, "op_id": r.id},
            ],
            "died": [],
            "completed": pair.send.ended and pair.recv.ended,
        },
    )
