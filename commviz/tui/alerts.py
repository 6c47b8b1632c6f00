"""The alerts panel's rows and the screen that opens one: diagnoses first (what
the model says is wrong), then the probe's and the wire's own trouble (dropped
events, undecodable frames), each a line a person can act on."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from commviz.model.diagnosis import Diagnosis
from commviz.model.document import RankRow
from commviz.report import render_diagnosis

KIND_STYLE = {
    "hang": "bold red",
    "p2p_deadlock": "bold red",
    "desync": "bold red",
    "dead_rank": "bold red",
    "straggler": "bold yellow",
    "dropped": "yellow",
    "unseen": "yellow",
    "decode": "yellow",
}

ALERT_COLUMNS = [("kind", "alert"), ("where", "where"), ("message", "what to look at")]


def alert_rows(diagnoses: list[Diagnosis], ranks: list[RankRow], decode_errors: int,
               last_decode_error: str) -> list[tuple[str, tuple, Diagnosis | dict]]:
    """(row key, cells, payload for the detail screen)."""
    rows: list[tuple[str, tuple, Diagnosis | dict]] = []
    for i, d in enumerate(diagnoses):
        where = f"{d.op} #{d.seq} g{d.group}" if d.op else f"group {d.group}"
        key = f"{d.kind}:{d.group}:{d.seq}:{i}"
        rows.append((key, (Text(d.kind, style=KIND_STYLE.get(d.kind, "")), where, d.message), d))
    for r in ranks:
        if r.unseen:
            ops = ", ".join(f"{n} {op}" for op, n in sorted(r.unseen.items()))
            msg = (f"rank {r.rank}'s backend ran collectives commviz did not see: {ops} (a ProcessGroup "
                   "method called directly, or a C++ extension); counts and diagnoses leave them out")
            rows.append((f"unseen:{r.rank}", (Text("unseen", style=KIND_STYLE["unseen"]), f"rank {r.rank}", msg),
                         {"kind": "unseen", "message": msg}))
    dropped = [r for r in ranks if r.dropped]
    if dropped:
        total = sum(r.dropped for r in dropped)
        who = ",".join(str(r.rank) for r in dropped)
        msg = f"{total} events never reached this watcher (ranks {who}); set COMMVIZ_TRACE_DIR to keep everything"
        rows.append(("dropped", (Text("dropped", style=KIND_STYLE["dropped"]), f"ranks {who}", msg),
                     {"kind": "dropped", "message": msg}))
    if decode_errors:
        msg = f"{decode_errors} frames could not be decoded; last: {last_decode_error}"
        rows.append(("decode", (Text("bad frames", style=KIND_STYLE["decode"]), "wire", msg),
                     {"kind": "decode", "message": msg}))
    return rows


class DiagnosisScreen(ModalScreen[None]):
    """One alert in full: the message, who waits for whom, and each rank's stack."""

    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close")]

    def __init__(self, diagnosis: Diagnosis | dict) -> None:
        super().__init__()
        # A diagnosis, or the probe's / the wire's own trouble ({"kind", "message"}).
        self.diagnosis = diagnosis.to_json() if isinstance(diagnosis, Diagnosis) else diagnosis

    def compose(self) -> ComposeResult:
        d = self.diagnosis
        lines = render_diagnosis(d, max_frames=8) if "waiting_ranks" in d or "stacks" in d else [d["message"]]
        body = Text()
        head, *rest = lines
        body.append(head + "\n", style=KIND_STYLE.get(d.get("kind", ""), "bold"))
        body.append("\n".join(rest))
        with VerticalScroll(id="diagnosis"):
            yield Static(body)
            yield Static(Text("esc to close", style="dim"))
