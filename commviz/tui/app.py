"""The dashboard: status line, alerts, the flow view in the centre with throughput
sparklines under it and the links panel beside it, ranks and ops tables below.

The app only reads, on two clocks. The data clock (`refresh_hz`, 4/s) calls
`feed.advance()`, takes a `Snapshot` of the model under `feed.lock` (plain reads and
small copies), releases the lock, then updates the widgets (tables in place, by row
key, so the cursor stays where the user put it). The animation clock (`anim_hz`) only
moves the flow view's packets: no lock, no model. Ingest therefore never waits for
drawing, and drawing never waits for ingest beyond one snapshot copy.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, Static

from commviz.model.diagnosis import RankStatus
from commviz.tui.alerts import ALERT_COLUMNS, DiagnosisScreen
from commviz.tui.feed import Feed, ReplayFeed
from commviz.tui.fmt import format_bytes, format_count, format_gbps, format_seconds, format_us
from commviz.tui.snapshot import Snapshot, model_info, take_snapshot
from commviz.tui.widgets.flow import FlowView
from commviz.tui.widgets.links import LINK_COLUMNS, link_rows
from commviz.tui.widgets.throughput import ThroughputPanel

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
    "missing": "bold reverse red",
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
    ("cpu", "cpu%", True),
    ("rss", "rss", True),
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
        # the rank process itself, when it runs on the watcher's host (psutil)
        _r(f"{row['cpu']:.0f}" if row.get("cpu") is not None else "", "dim"),
        _r(format_bytes(row["rss"]) if row.get("rss") is not None else "", "dim"),
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


def _cell_width(value) -> int:
    return value.cell_len if isinstance(value, Text) else len(str(value))


def sync_table(table: DataTable, columns: list, rows: list[tuple[str, tuple]], sort) -> None:
    """Make `table` show `rows` (key, cells) in place: update changed cells, add new
    rows, drop vanished ones; re-sort only when rows were added. Columns grow to fit
    and never shrink (shrinking makes DataTable measure the whole column again)."""
    want = {key for key, _ in rows}
    for key in [k for k in table.rows if k.value not in want]:
        table.remove_row(key)
    col_keys = [c[0] for c in columns]
    cols = [table.columns.get(k) for k in table.columns]
    added = False
    for key, cells in rows:
        if key in table.rows:
            old = table.get_row(key)
            for ck, col, new, cur in zip(col_keys, cols, cells, old):
                if new != cur:
                    grow = col is not None and _cell_width(new) > col.content_width
                    table.update_cell(key, ck, new, update_width=grow)
        else:
            table.add_row(*cells, key=key)
            added = True
    if added and table.row_count > 1:
        sort(table)


MAX_RANK_ROWS = 128  # beyond this the table shows the ranks worth a look (the flow view shows all)


def pick_rank_rows(rows: list[dict], focus: int | None, limit: int = MAX_RANK_ROWS) -> list[dict]:
    """At most `limit` rows: the focused rank, then trouble (dead, missing, hung,
    waiting), then the lowest ranks; in rank order."""
    if len(rows) <= limit:
        return rows
    ranked = sorted(rows, key=lambda r: (r["rank"] != focus, RankStatus(r["status"]).severity, r["rank"]))
    return sorted(ranked[:limit], key=lambda r: r["rank"])


def _sort_ranks(table: DataTable) -> None:
    table.sort("rank", key=lambda cell: int(cell.plain))


def _sort_ops(table: DataTable) -> None:
    table.sort("group", "op")


class WatchApp(App):
    """Dashboard on a `Feed` (live or replay).

    `topology`: a `commviz.topo.Topology` (from `--topology` or NVML) to lay GPUs out
    by and to know link capacities; None draws what the hellos say. `clock`: monotonic
    seconds for the animation (tests pass a fake one); `animate=False` starts with the
    animation clock stopped at `t_anim` (snapshot tests)."""

    CSS_PATH = str(Path(__file__).with_name("commviz.tcss"))  # absolute: subclasses elsewhere find it
    TITLE = "commviz"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "freeze", "Pause view"),
        Binding("f", "focus_rank", "Focus rank"),
        Binding("escape", "unfocus", "All ranks", show=False),
        Binding("l", "toggle_links", "Links"),
        Binding("space", "play_pause", "Play/pause"),
        Binding("n", "step", "Step"),
        Binding("minus", "slower", "Slower", key_display="-"),
        Binding("plus,equals_sign", "faster", "Faster", key_display="+"),
        Binding("left_square_bracket", "seek(-0.1)", "Back 10%", key_display="["),
        Binding("right_square_bracket", "seek(0.1)", "Fwd 10%", key_display="]"),
    ]

    REPLAY_ACTIONS = {"play_pause", "step", "slower", "faster", "seek"}

    def __init__(self, feed: Feed, title: str = "commviz", refresh_hz: float = 4, anim_hz: float = 20,
                 topology=None, clock=None, animate: bool = True, t_anim: float = 0.0,
                 table_every: int = 2) -> None:
        super().__init__()
        import time

        self.feed = feed
        self.title = title
        self.refresh_hz = refresh_hz
        self.anim_hz = anim_hz
        self.topology = topology
        self._clock = clock or time.monotonic
        self._animate = animate
        self._t_anim0 = t_anim
        self.frozen = False
        self._force_tables = False
        self.focus_rank: int | None = None
        self.ticks = 0
        self.table_every = max(1, table_every)  # tables repaint on every n-th data tick (DataTable repaints whole)
        self.snapshot: Snapshot | None = None
        self.lock_wait_s = 0.0  # time spent waiting for / holding the feed's lock, last tick
        self.lock_hold_s = 0.0
        self._ev_hist: list[tuple[float, int]] = []

    @property
    def replay(self) -> ReplayFeed | None:
        return self.feed if isinstance(self.feed, ReplayFeed) else None

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="status")
        alerts = DataTable(id="alerts", cursor_type="row")
        alerts.border_title = "Alerts"
        alerts.border_subtitle = "enter: details"
        yield alerts
        yield Static(REPLAY_HINT if self.replay else LIVE_HINT, id="empty")
        with Vertical(id="body"):
            with Horizontal(id="top"):
                with Vertical(id="centre"):
                    flow = FlowView(id="flow")
                    flow.border_title = "Flow"
                    yield flow
                    tp = ThroughputPanel(id="throughput")
                    tp.border_title = "Throughput"
                    yield tp
                links = DataTable(id="links", cursor_type="row")
                links.border_title = "Links"
                links.border_subtitle = "last second"
                yield links
            with Horizontal(id="tables"):
                ranks = DataTable(id="ranks", cursor_type="row", zebra_stripes=True, fixed_columns=1)
                ranks.border_title = "Ranks"
                ranks.border_subtitle = "enter: focus"
                yield ranks
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
        self._body = self.query_one("#body", Vertical)
        self._flow = self.query_one("#flow", FlowView)
        self._tp = self.query_one("#throughput", ThroughputPanel)
        self._links = links = self.query_one("#links", DataTable)
        self._ranks = ranks = self.query_one("#ranks", DataTable)
        self._ops = ops = self.query_one("#ops", DataTable)
        for key, label, right in RANK_COLUMNS:
            ranks.add_column(_r(label) if right else label, key=key)
        for key, label, right in OP_COLUMNS:
            ops.add_column(_r(label) if right else label, key=key)
        for key, label, right in LINK_COLUMNS:
            links.add_column(_r(label) if right else label, key=key)
        self._alerts = alerts = self.query_one("#alerts", DataTable)
        for key, label in ALERT_COLUMNS:
            alerts.add_column(label, key=key)
        alerts.display = False
        self._alert_payload: dict[str, dict] = {}
        self._flow.t_anim = self._t_anim0
        if not self._animate:
            self._flow.freeze()
        self._last_anim = self._clock()
        self.refresh_view()
        self.set_interval(1.0 / self.refresh_hz, self.data_tick, name="refresh")
        if self.anim_hz > 0:
            self.set_interval(1.0 / self.anim_hz, self.animate_tick, name="animate")

    # ----------------------------------------------------------------- refresh

    def animate_tick(self) -> None:
        """One animation frame: move the packets (no model access)."""
        now = self._clock()
        dt, self._last_anim = now - self._last_anim, now
        if not self.frozen:
            self._flow.advance(min(dt, 0.5))

    def data_tick(self) -> None:
        """The data clock: refresh, the tables only every `table_every`-th time."""
        self.refresh_view(tables=self.ticks % self.table_every == 0)

    def refresh_view(self, tables: bool = True) -> None:
        """Advance the feed, snapshot the model, update the widgets (the tables too
        unless `tables` is False)."""
        import time

        self.ticks += 1
        feed = self.feed
        feed.advance()
        now = feed.now_ns()
        t0 = time.perf_counter()
        with feed.lock:
            t1 = time.perf_counter()
            if self.frozen:
                info = model_info(feed.model)
            else:
                snap = take_snapshot(feed.model, now, self.focus_rank, self.topology)
                info = snap.info
        t2 = time.perf_counter()
        self.lock_wait_s, self.lock_hold_s = t1 - t0, t2 - t1
        self._update_status(feed.status(), info, now)
        if self.frozen:
            return
        tables = tables or self._force_tables or self.snapshot is None
        self._force_tables = False
        self.snapshot = snap
        self._show(snap, tables)

    def _show(self, snap: Snapshot, tables: bool = True) -> None:
        info = snap.info
        empty = info["nranks"] == 0
        self._empty.display = empty
        self._body.display = not empty
        focus = self.focus_rank
        self._flow.update_data(snap.flow, focus)
        self._flow.border_title = "Flow" + (f" · rank {focus}" if focus is not None else "")
        self._tp.update_series(snap.tp_total, snap.tp_rate, focus, snap.tp_focus, snap.tp_focus_rate)
        alerts = snap.alerts
        self._alert_payload = {key: payload for key, _, payload in alerts}
        self._alerts.display = bool(alerts) and not empty
        if alerts:
            sync_table(self._alerts, ALERT_COLUMNS, [(key, cells) for key, cells, _ in alerts], lambda t: None)
            self._alerts.border_title = f"Alerts ({len(alerts)})"
        if not tables:
            return
        ranks, ops = self._ranks, self._ops
        shown = pick_rank_rows(snap.rank_rows, self.focus_rank)
        procs = getattr(self.feed, "proc_stats", None) or {}
        for row in shown:
            cpu_rss = procs.get(row["rank"])
            if cpu_rss is not None:
                row["cpu"], row["rss"] = cpu_rss
        sync_table(ranks, RANK_COLUMNS, [(str(r["rank"]), rank_cells(r)) for r in shown], _sort_ranks)
        sync_table(
            ops, OP_COLUMNS, [(f"{r['op']}@{r['group']}", op_cells(r)) for r in snap.op_rows], _sort_ops
        )
        ws = info["world_size"]
        ranks.border_title = f"Ranks {info['nranks']}/{ws}" if ws else "Ranks"
        if len(shown) < len(snap.rank_rows):
            ranks.border_title += f" · {len(shown)} shown, trouble first"
        ops.border_title = f"Ops ({len(snap.op_rows)})" if snap.op_rows else "Ops (none finished yet)"
        rows = link_rows(snap.rates, snap.places, self.topology, snap.samples, focus)
        sync_table(self._links, LINK_COLUMNS, rows, lambda t: None)
        self._links.border_title = f"Links ({len(rows)})" if rows else "Links (nothing moving)"

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
        rate = self._event_rate(self._clock(), info["events"])
        if rate is not None:
            t.append(f" ({format_count(int(rate))}/s)")
        if info["start"] is not None:
            t.append(f" · elapsed {format_seconds(max(0, now - info['start']) / 1e9)}")
        if self.focus_rank is not None:
            t.append(f" · focus rank {self.focus_rank}", style="bold")
        self._status.update(t, layout=False)

    def _event_rate(self, t: float, events: int) -> float | None:
        """Events per second over the last ~2 s of ticks (None until two ticks)."""
        hist = self._ev_hist
        hist.append((t, events))
        while len(hist) > 2 and t - hist[0][0] > 2.0:
            hist.pop(0)
        if len(hist) < 2 or hist[-1][0] <= hist[0][0]:
            return None
        return max(0.0, (hist[-1][1] - hist[0][1]) / (hist[-1][0] - hist[0][0]))

    # ----------------------------------------------------------------- actions

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        table = event.data_table.id
        if table == "alerts":
            payload = self._alert_payload.get(event.row_key.value)
            if payload is not None:
                self.push_screen(DiagnosisScreen(payload))
        elif table == "ranks":
            rank = int(event.row_key.value)
            self.set_focus_rank(None if rank == self.focus_rank else rank)

    def on_flow_view_rank_clicked(self, event: FlowView.RankClicked) -> None:
        self.set_focus_rank(None if event.rank == self.focus_rank else event.rank)

    def set_focus_rank(self, rank: int | None) -> None:
        """Focus one rank's traffic and history (None: all ranks)."""
        self.focus_rank = rank
        self._force_tables = True
        if rank is not None and str(rank) in self._ranks.rows:
            self._ranks.move_cursor(row=self._ranks.get_row_index(str(rank)))
        if self.frozen:
            self.frozen = False
            self.refresh_view()
            self.frozen = True
        else:
            self.refresh_view()

    def action_focus_rank(self) -> None:
        """Focus the rank under the Ranks table's cursor (again: back to all ranks)."""
        t = self._ranks
        if not t.row_count:
            return
        key = t.coordinate_to_cell_key((t.cursor_row, 0)).row_key.value
        rank = int(key)
        self.set_focus_rank(None if rank == self.focus_rank else rank)

    def action_unfocus(self) -> None:
        if self.focus_rank is not None:
            self.set_focus_rank(None)

    def action_toggle_links(self) -> None:
        self.screen.toggle_class("-show-links")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.REPLAY_ACTIONS:
            return self.replay is not None
        return True

    def action_freeze(self) -> None:
        self.frozen = not self.frozen
        self.sub_title = "view paused: p to resume" if self.frozen else ""
        if self.frozen:
            self._flow.freeze()
        elif self._animate:
            self._last_anim = self._clock()
            self._flow.thaw()
        self._force_tables = True
        self.refresh_view()

    def _replay_then_refresh(self, fn) -> None:
        rp = self.replay
        if rp is None:
            return
        fn(rp)
        self._force_tables = True
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
