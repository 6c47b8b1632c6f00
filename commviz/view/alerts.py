"""The alerts panel's rows: diagnoses first (what the model says is wrong), then the
probe's and the wire's own trouble (collectives the backend ran unseen, dropped
events, undecodable frames), each a line a person can act on.

Words and facts only: how a kind is coloured is the drawing's business
(`tui.alerts.KIND_STYLE`), so a collector builds these rows without rich and a view
in another process gets them as they were made (viewlink.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from commviz.model.diagnosis import Diagnosis
from commviz.model.document import RankRow


@dataclass(frozen=True)
class AlertRow:
    """One row of the alerts panel, and what its detail screen opens on."""

    key: str  # the table's row key: the same trouble keeps its row (and the cursor) from tick to tick
    kind: str  # a diagnosis' kind, or "unseen", "dropped", "decode": what the row is coloured by
    label: str  # the first column's word
    where: str
    message: str
    diagnosis: Diagnosis | None = None  # a diagnosis' detail: who waits for whom, each rank's stack


def alert_rows(diagnoses: list[Diagnosis], ranks: list[RankRow], decode_errors: int,
               last_decode_error: str) -> list[AlertRow]:
    rows: list[AlertRow] = []
    for i, d in enumerate(diagnoses):
        kind = d.kind.value
        where = f"{d.op} #{d.seq} g{d.group}" if d.op else f"group {d.group}"
        rows.append(AlertRow(f"{kind}:{d.group}:{d.seq}:{i}", kind, kind, where, d.message, d))
    for r in ranks:
        if r.unseen:
            ops = ", ".join(f"{n} {op}" for op, n in sorted(r.unseen.items()))
            msg = (f"rank {r.rank}'s backend ran collectives commviz did not see: {ops} (a ProcessGroup "
                   "method called directly, or a C++ extension); counts and diagnoses leave them out")
            rows.append(AlertRow(f"unseen:{r.rank}", "unseen", "unseen", f"rank {r.rank}", msg))
    dropped = [r for r in ranks if r.dropped]
    if dropped:
        total = sum(r.dropped for r in dropped)
        who = ",".join(str(r.rank) for r in dropped)
        msg = f"{total} events never reached this watcher (ranks {who}); set COMMVIZ_TRACE_DIR to keep everything"
        rows.append(AlertRow("dropped", "dropped", "dropped", f"ranks {who}", msg))
    if decode_errors:
        msg = f"{decode_errors} frames could not be decoded; last: {last_decode_error}"
        rows.append(AlertRow("decode", "decode", "bad frames", "wire", msg))
    return rows
