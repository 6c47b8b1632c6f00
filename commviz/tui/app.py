"""The live screen: a status line, a table of ranks and a table of ops.

The app only reads: on every tick it calls `feed.advance()`, copies a snapshot of the
model under `feed.lock`, releases the lock, then updates the tables in place (by row
key, so the cursor stays where the user put it).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Header, Static

from commviz.tui.alerts import ALERT_COLUMNS, DiagnosisScreen, alert_rows
from commviz.tui.feed import Feed, ReplayFeed
from commviz.tui.fmt import format_bytes, format_count, format_gbps, format_seconds, format_us

LIVE_HINT = (
    "Waiting for ranks…\n\n"
    "Run a job that calls commviz.instrument(), e.g.\n"
    "  torchrun --nproc-per-node 4 scenarios/allreduce.py\n"
    "or let commviz launch it:\n"
    "  commviz watch -- torchrun --nproc-per-node 4 scenarios/allreduce.py"
)
REPLAY_HINT = (
    "No rank has said hello yet at this point of the trace.\n\n"
    "Press space to play, n to step, ] to seek forward."
)

STATUS_STYLE = {
    "ok": "green",
    "waiting": "yellow",
    "hung": "bold red",
    "dead": "bold red",
    "exited": "dim",
}

# (key, label, right-aligned). Most telling columns first so an 80-column terminal
# shows them; host and device are last (scroll right for them when narrow).
RANK_COLUMNS = [
    ("rank", "rank", True),
    ("status", "status", False),
    ("op", "current op", False),
    ("in_op", "in op", True),
    ("ops_done", "ops", True),
    ("bytes", "bytes", True),
    ("seen", "seen", True),
    ("dropped", "drop", True),
    ("device", "device", False),
    ("host", "host", False),
]
OP_COLUMNS = [
    ("op", "op", False),
    ("group", "group", False),
    ("count", "count", True),
    ("bytes", "bytes", True),
    ("p50", "p50 µs", True),
    ("p99", "p99 µs", True),
    ("algbw", "algbw", True),
    ("busbw", "busbw", True),
]


def _r(s: str, style: str = "") -> Text:
    return Text(s, style=style, justify="right")


def rank_cells(row: dict) -> tuple:
    """One rank-table row from a `Model.rank_rows()` dict."""
    status = row["status"]
    in_op = ""
    if row["op"]:
        style = "red" if status == "hung" else ("yellow" if row["in_op_s"] >= 1 else "")
        in_op = _r(format_seconds(row["in_op_s"]), style)
    seen_s = row["last_seen_s"]
    seen_style = "dim" if seen_s is not None and seen_s < 2 else ("yellow" if status != "exited" else "dim")
    dropped = row["dropped"]
    return (
        _r(str(row["rank"]), "bold"),
        Text(status, style=STATUS_STYLE.get(status, "")),
        # Idle ranks show their last op, dimmed, so a glance still says what they did.
        Text(row["op"], style="bold" if status == "hung" else "")
        if row["op"]
        else Text(row["last_op"], style="dim"),
        in_op or _r(""),
        _r(format_count(row["ops_done"])),
        _r(format_bytes(row["bytes"])),
        _r(format_seconds(seen_s), seen_style),
        _r(str(dropped), "bold red" if dropped else "dim"),
        Text(row["device"]),
        Text(row["host"]),
    )


def op_cells(row: dict) -> tuple:
    """One op-table row from a summary `ops` entry."""
    errors = row.get("errors", 0)
    count = format_count(row["count"]) + (f" ({errors} err)" if errors else "")
    return (
        row["op"],
        row["group"],
        _r(count, "red" if errors else ""),
        _r(format_bytes(row["bytes"])),
        _r(format_us(row["p50_us"])),
        _r(format_us(row["p99_us"])),
        _r(format_gbps(row["algbw_gbps"])),
        _r(format_gbps(row["busbw_gbps"]), "bold"),
    )


def sync_table(table: DataTable, columns: list, rows: list[tuple[str, tuple]], sort) -> None:
    """Make `table` show `rows` (key, cells) in place: update changed cells, add new
    rows, drop vanished ones; re-sort only when rows were added."""
    want = {key for key, _ in rows}
    for key in [k for k in table.rows if k.value not in want]:
        table.remove_row(key)
    col_keys = [c[0] for c in columns]
    added = False
    for key, cells in rows:
        if key in table.rows:
            old = table.get_row(key)
            for ck, new, cur in zip(col_keys, cells, old):
                if new != cur:
                    table.update_cell(key, ck, new, update_width=True)
        else:
            table.add_row(*cells, key=key)
            added = True
    if added and table.row_count > 1:
        sort(table)


def _sort_ranks(table: DataTable) -> None:
    table.sort("rank", key=lambda cell: int(cell.plain))


def _sort_ops(table: DataTable) -> None:
    table.sort("group", "op")


class WatchApp(App):
    """Dashboard on a `Feed` (live or replay)."""

    CSS_PATH = "commviz.tcss"
    TITLE = "commviz"

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "freeze", "Freeze"),
        Binding("space", "play_pause", "Play/pause"),
        Binding("n", "step", "Step"),
        Binding("minus", "slower", "Slower", key_display="-"),
        Binding("plus,equals_sign", "faster", "Faster", key_display="+"),
        Binding("left_square_bracket", "seek(-0.1)", "Back 10%", key_display="["),
        Binding("right_square_bracket", "seek(0.1)", "Fwd 10%", key_display="]"),
    ]

    REPLAY_ACTIONS = {"play_pause", "step", "slower", "faster", "seek"}

    def __init__(self, feed: Feed, title: str = "commviz", refresh_hz: float = 4) -> None:
        super().__init__()
        self.feed = feed
        self.title = title
        self.refresh_hz = refresh_hz
        self.frozen = False
        self.ticks = 0

    @property
    def replay(self) -> ReplayFeed | None:
        return self.feed if isinstance(self.feed, ReplayFeed) else None

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="status")
        with Vertical(id="body"):
            yield Static(REPLAY_HINT if self.replay else LIVE_HINT, id="empty")
            ranks = DataTable(id="ranks", cursor_type="row", zebra_stripes=True, fixed_columns=1)
            ranks.border_title = "Ranks"
            yield ranks
            alerts = DataTable(id="alerts", cursor_type="row")
            alerts.border_title = "Alerts"
            alerts.border_subtitle = "enter: details"
            yield alerts
            ops = DataTable(id="ops", cursor_type="row", zebra_stripes=True)
            ops.border_title = "Ops"
            ops.border_subtitle = "bandwidth in GB/s"
            yield ops
        # The command palette stays on ctrl+p; the footer's room goes to our keys.
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        # Keep references: the refresh timer can fire once more while the app shuts
        # down, after the widgets left the DOM (a query would raise NoMatches then).
        self._status = self.query_one("#status", Static)
        self._empty = self.query_one("#empty", Static)
        self._ranks = ranks = self.query_one("#ranks", DataTable)
        self._ops = ops = self.query_one("#ops", DataTable)
        for key, label, right in RANK_COLUMNS:
            ranks.add_column(_r(label) if right else label, key=key)
        for key, label, right in OP_COLUMNS:
            ops.add_column(_r(label) if right else label, key=key)
        self._alerts = alerts = self.query_one("#alerts", DataTable)
        for key, label in ALERT_COLUMNS:
            alerts.add_column(label, key=key)
        alerts.display = False
        self._alert_payload: dict[str, dict] = {}
        self.refresh_view()
        self.set_interval(1.0 / self.refresh_hz, self.refresh_view, name="refresh")

    # ----------------------------------------------------------------- refresh

    def refresh_view(self) -> None:
        """One tick: advance the feed, snapshot the model, update the widgets."""
        self.ticks += 1
        feed = self.feed
        feed.advance()
        now = feed.now_ns()
        with feed.lock:
            m = feed.model
            info = {
                "world_size": m.world_size,
                "backend": m.backend,
                "job": m.job,
                "events": m.events,
                "nranks": len(m.ranks),
                "start": min((r.hello.wall_ns for r in m.ranks.values() if r.hello), default=None),
            }
            if not self.frozen:
                rank_rows = m.rank_rows(now)
                op_rows = m.op_rows()  # == summary(now)["ops"], without per-rank work
                alerts = alert_rows(m.diagnoses(now), rank_rows, m.decode_errors, m.last_decode_error)
        self._update_status(feed.status(), info, now)
        if self.frozen:
            return
        empty = info["nranks"] == 0
        self._empty.display = empty
        ranks, ops = self._ranks, self._ops
        ranks.display = ops.display = not empty
        sync_table(ranks, RANK_COLUMNS, [(str(r["rank"]), rank_cells(r)) for r in rank_rows], _sort_ranks)
        sync_table(
            ops, OP_COLUMNS, [(f"{r['op']}@{r['group']}", op_cells(r)) for r in op_rows], _sort_ops
        )
        self._alert_payload = {key: payload for key, _, payload in alerts}
        self._alerts.display = bool(alerts) and not empty
        if alerts:
            sync_table(self._alerts, ALERT_COLUMNS, [(key, cells) for key, cells, _ in alerts], lambda t: None)
            self._alerts.border_title = f"Alerts ({len(alerts)})"
        ws = info["world_size"]
        ranks.border_title = f"Ranks {info['nranks']}/{ws}" if ws else "Ranks"
        ops.border_title = f"Ops ({len(op_rows)})" if op_rows else "Ops (none finished yet)"

    def _update_status(self, feed_status: str, info: dict, now: int) -> None:
        t = Text(feed_status, style="bold")
        t.append("\n")
        if info["world_size"]:
            t.append(f"world {info['world_size']}", style="bold")
            t.append(f" · {info['backend'] or '?'}")
            if info["job"]:
                t.append(f" · job {short_job(info['job'])}")
        else:
            t.append("no job yet", style="dim")
        t.append(f" · {format_count(info['events'])} events")
        if info["start"] is not None:
            t.append(f" · elapsed {format_seconds(max(0, now - info['start']) / 1e9)}")
        self._status.update(t)

    # ----------------------------------------------------------------- actions

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "alerts":
            return
        payload = self._alert_payload.get(event.row_key.value)
        if payload is not None:
            self.push_screen(DiagnosisScreen(payload))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.REPLAY_ACTIONS:
            return self.replay is not None
        return True

    def action_freeze(self) -> None:
        self.frozen = not self.frozen
        self.sub_title = "❄ view frozen: p to resume" if self.frozen else ""
        self.refresh_view()

    def _replay_then_refresh(self, fn) -> None:
        rp = self.replay
        if rp is None:
            return
        fn(rp)
        self.refresh_view()

    def action_play_pause(self) -> None:
        self._replay_then_refresh(lambda rp: rp.toggle_pause())

    def action_step(self) -> None:
        self._replay_then_refresh(lambda rp: rp.step())

    def action_slower(self) -> None:
        self._replay_then_refresh(lambda rp: rp.slower())

    def action_faster(self) -> None:
        self._replay_then_refresh(lambda rp: rp.faster())

    def action_seek(self, delta: float) -> None:
        self._replay_then_refresh(lambda rp: rp.seek_by(delta))


def short_job(job: str) -> str:
    """The job id is 'run_id:master_addr:master_port'; a uuid run id alone is enough
    to tell jobs apart and fits the status line."""
    run_id, _, where = job.partition(":")
    if run_id and run_id != "none":
        return run_id[:8]
    return where.strip(":") or job
