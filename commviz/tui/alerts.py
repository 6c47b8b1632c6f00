"""The alerts panel drawn: each kind's colour, the columns, and the screen that opens
one alert in full. The rows themselves are built with the snapshot
(`view.alerts.alert_rows`), where the model is."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from commviz.report import render_diagnosis
from commviz.view.alerts import AlertRow

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


def alert_cells(row: AlertRow) -> tuple:
    """One row of the alerts table, its kind in its colour."""
    return Text(row.label, style=KIND_STYLE.get(row.kind, "")), row.where, row.message


class DiagnosisScreen(ModalScreen[None]):
    """One alert in full: the message, who waits for whom, and each rank's stack."""

    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close")]

    def __init__(self, alert: AlertRow) -> None:
        super().__init__()
        # A diagnosis in full, or the probe's / the wire's own trouble in its words.
        self.diagnosis = (alert.diagnosis.to_json() if alert.diagnosis is not None
                          else {"kind": alert.kind, "message": alert.message})

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
