"""The documents and rows the views read, built from a `Model`: the `commviz summary
--json` document (its keys are a contract: docs/ARCHITECTURE.md), its op table, and
the rank rows of the live tables. Kept apart from the model so the model holds
state and answers questions, and what a view shows of it is built here, through the
model's public interface only (`face.ModelFace`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from commviz import ops as opcat
from commviz.model.diagnosis import RankStatus
from commviz.model.face import ModelFace

if TYPE_CHECKING:
    from commviz.model.findings import Findings


def _sig(x: float, digits: int = 6) -> float:
    """Significant digits, not decimals: CPU jobs move MB/s, GPUs hundreds of GB/s."""
    return float(f"{x:.{digits}g}")


def op_rows(model: ModelFace) -> list[dict]:
    """The summary's op table, including instances not every rank has finished."""
    rows = []
    for (op, group), st in sorted(model.stats_now().items(), key=lambda kv: (kv[0][1], kv[0][0])):
        n = model.group_size(group) or model.world_size
        algbw = st.algbw_gbps()
        row = {
            "op": op,
            "group": group,
            "count": st.count,
            "bytes": st.bytes,
            "p50_us": round(st.percentile_us(50), 3),
            "p99_us": round(st.percentile_us(99), 3),
            "algbw_gbps": _sig(algbw),
            "busbw_gbps": _sig(algbw * opcat.busbw_factor(op, n)),
        }
        if st.errors:
            row["errors"] = st.errors
        rows.append(row)
    return rows


def summary(model: ModelFace, now: int | None = None) -> dict:
    """The `commviz summary --json` document at `now` (wall ns; default: the newest
    event's time)."""
    now = model.last_t if now is None else now
    found = model.findings(now)
    ranks = []
    for rank in sorted(model.ranks):
        r = model.ranks[rank]
        h = r.hello
        ranks.append(
            {
                "rank": rank,
                "host": h.host if h else "",
                "pid": h.pid if h else 0,
                "device": h.device if h else "",
                "status": model.rank_status(r, now, found.hung).value,
                "dropped": r.dropped,
            }
        )
    per_rank = []
    for rank in sorted(model.ranks):
        r = model.ranks[rank]
        row = {"rank": rank, "ops": {op: {"count": c, "bytes": b} for op, (c, b) in sorted(r.per_op.items())}}
        if r.audit is not None:
            row["audit"] = r.audit
        if r.nccl is not None:
            row["nccl"] = r.nccl.document()
        per_rank.append(row)
    return {
        "world_size": model.world_size,
        "backend": model.backend,
        "ranks": ranks,
        "ops": op_rows(model),
        "per_rank": per_rank,
        "diagnoses": found.to_json(),
        "events": model.events,
        "decode_errors": model.decode_errors,
    }


@dataclass(frozen=True)
class RankRow:
    """One rank as the live tables, the alerts and the flow view read it: what a
    typo in a string key used to turn into a KeyError at draw time."""

    rank: int
    host: str = "?"
    pid: int = 0
    device: str = "?"
    status: RankStatus = RankStatus.OK  # the dashboard's word: `missing` too
    op: str = ""  # the op it is inside, as "all_reduce#7" (its seq); "" when none
    op_group: str = ""
    in_op_s: float = 0.0
    ops_done: int = 0
    bytes: int = 0
    last_seen_s: float | None = None  # None: nothing seen from it yet
    dropped: int = 0
    last_op: str = ""
    where: str = ""  # the user's line it called its current op from, when a stack came
    unseen: dict[str, int] = field(default_factory=dict)  # backend ops commviz did not see (the audit)


def rank_rows(model: ModelFace, now: int, found: Findings | None = None) -> list[RankRow]:
    """One row per rank for live tables (`found`: the findings at `now`, if the caller
    has them already)."""
    found = model.findings(now) if found is None else found
    rows = []
    for rank in sorted(model.ranks):
        r = model.ranks[rank]
        h = r.hello
        cur = model.current_op(r)
        st = r.stacks.for_op(cur.start.id) if cur else None
        rows.append(RankRow(
            rank=rank,
            host=h.host if h else "?",
            pid=h.pid if h else 0,
            device=h.device if h else "?",
            status=model.view_status(r, now, found),
            op=f"{cur.start.op}#{cur.start.seq}" if cur else "",
            op_group=cur.start.group if cur else "",
            in_op_s=(now - cur.t_wall) / 1e9 if cur else 0.0,
            ops_done=r.ops_done,
            bytes=r.bytes_done,
            last_seen_s=(now - r.last_seen) / 1e9 if r.last_seen else None,
            dropped=r.dropped,
            last_op=r.last_op,
            where=st.where() if st is not None else "",
            unseen=dict(r.audit.get("unseen", {})) if r.audit else {},
        ))
    return rows
