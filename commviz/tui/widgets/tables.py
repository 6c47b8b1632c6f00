"""The dashboard's four tables. Each owns its DataTable (it is one): its columns, its
rows kept in step with the model by key, its title; the app only hands it a new
`Snapshot` (a reactive), and the table redraws from it.

Rows are updated in place, by row key, so the cursor stays where the user put it;
columns grow to fit and never shrink (shrinking makes DataTable measure the whole
column again).
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from commviz.model.diagnosis import Diagnosis, RankStatus
from commviz.tui.alerts import ALERT_COLUMNS
from commviz.tui.fmt import format_bytes, format_count, format_gbps, format_seconds, format_us
from commviz.tui.snapshot import Snapshot
from commviz.tui.widgets.links import LINK_COLUMNS, link_rows

STATUS_STYLE = {
    RankStatus.OK: "green", RankStatus.WAITING: "yellow", RankStatus.HUNG: "bold red",
    RankStatus.MISSING: "bold reverse red", RankStatus.DEAD: "bold red", RankStatus.EXITED: "dim",
}

# (key, label, right-aligned). Most telling columns first so an 80-column terminal
# shows them; host and device are last (scroll right for them when narrow).
RANK_COLUMNS = [
    ("rank", "rank", True), ("status", "status", False), ("op", "current op", False), ("in_op", "in op", True),
    ("ops_done", "ops", True), ("bytes", "bytes", True), ("cpu", "cpu%", True), ("rss", "rss", True),
    ("seen", "seen", True), ("dropped", "drop", True), ("device", "device", False), ("host", "host", False),
]
OP_COLUMNS = [
    ("op", "op", False), ("group", "group", False), ("count", "count", True), ("bytes", "bytes", True),
    ("p50", "p50 µs", True), ("p99", "p99 µs", True), ("algbw", "algbw", True), ("busbw", "busbw", True),
]
MAX_RANK_ROWS = 128  # beyond this the table shows the ranks worth a look (the flow view shows all)


def _r(s: str, style: str = "") -> Text:
    return Text(s, style=style, justify="right")


def rank_cells(row: dict) -> tuple:
    """One rank-table row from a `Model.rank_rows()` dict."""
    status = row["status"]
    hung = status == RankStatus.HUNG
    in_op = ""
    if row["op"]:
        in_op = _r(format_seconds(row["in_op_s"]), "red" if hung else ("yellow" if row["in_op_s"] >= 1 else ""))
    seen_s = row["last_seen_s"]
    seen_style = "dim" if (seen_s is not None and seen_s < 2) or status == RankStatus.EXITED else "yellow"
    dropped = row["dropped"]
    return (
        _r(str(row["rank"]), "bold"),
        Text(status, style=STATUS_STYLE.get(status, "")),
        # Idle ranks show their last op, dimmed, so a glance still says what they did.
        Text(row["op"], style="bold" if hung else "") if row["op"] else Text(row["last_op"], style="dim"),
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


def pick_rank_rows(rows: list[dict], focus: int | None, limit: int = MAX_RANK_ROWS) -> list[dict]:
    """At most `limit` rows: the focused rank, then trouble (dead, missing, hung,
    waiting), then the lowest ranks; in rank order."""
    if len(rows) <= limit:
        return rows
    ranked = sorted(rows, key=lambda r: (r["rank"] != focus, RankStatus(r["status"]).severity, r["rank"]))
    return sorted(ranked[:limit], key=lambda r: r["rank"])


def _cell_width(value) -> int:
    return value.cell_len if isinstance(value, Text) else len(str(value))


class SnapshotTable(DataTable):
    """A DataTable that shows one part of a `Snapshot`; set `snapshot` to redraw."""

    COLUMNS: list[tuple] = []  # (key, label[, right-aligned])
    TITLE = ""
    SUBTITLE = ""

    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True, init=False, layout=False)

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = self.TITLE
        self.border_subtitle = self.SUBTITLE

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        if self.columns:
            return
        for key, label, *right in self.COLUMNS:
            self.add_column(_r(label) if right and right[0] else label, key=key)

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        if snap is not None:
            self._add_columns()
            self.show(snap)

    def show(self, snap: Snapshot) -> None:
        raise NotImplementedError

    def sort_rows(self) -> None:
        """Called after rows were added (to keep a stable order)."""

    def sync(self, rows: list[tuple[str, tuple]]) -> None:
        """Show `rows` (key, cells) in place: update changed cells, add new rows, drop
        vanished ones; re-sort only when rows were added."""
        want = {key for key, _ in rows}
        for key in [k for k in self.rows if k.value not in want]:
            self.remove_row(key)
        col_keys = [c[0] for c in self.COLUMNS]
        cols = [self.columns.get(k) for k in self.columns]
        added = False
        for key, cells in rows:
            if key in self.rows:
                for ck, col, new, cur in zip(col_keys, cols, cells, self.get_row(key)):
                    if new != cur:
                        grow = col is not None and _cell_width(new) > col.content_width
                        self.update_cell(key, ck, new, update_width=grow)
            else:
                self.add_row(*cells, key=key)
                added = True
        if added and self.row_count > 1:
            self.sort_rows()


class RanksTable(SnapshotTable):
    COLUMNS = RANK_COLUMNS
    TITLE = "Ranks"
    SUBTITLE = "enter: focus"

    def show(self, snap: Snapshot) -> None:
        shown = pick_rank_rows(snap.rank_rows, snap.focus)
        for row in shown:
            cpu_rss = snap.procs.get(row["rank"])
            if cpu_rss is not None:
                row["cpu"], row["rss"] = cpu_rss
        self.sync([(str(r["rank"]), rank_cells(r)) for r in shown])
        info = snap.info
        ws = info["world_size"]
        title = f"Ranks {info['nranks']}/{ws}" if ws else "Ranks"
        if len(shown) < len(snap.rank_rows):
            title += f" · {len(shown)} shown, trouble first"
        self.border_title = title

    def sort_rows(self) -> None:
        self.sort("rank", key=lambda cell: int(cell.plain))

    def focus_row(self, rank: int | None) -> None:
        """Put the cursor on `rank`'s row, if it is shown."""
        if rank is not None and str(rank) in self.rows:
            self.move_cursor(row=self.get_row_index(str(rank)))

    def rank_under_cursor(self) -> int | None:
        if not self.row_count:
            return None
        return int(self.coordinate_to_cell_key((self.cursor_row, 0)).row_key.value)


class OpsTable(SnapshotTable):
    COLUMNS = OP_COLUMNS
    TITLE = "Ops"
    SUBTITLE = "bandwidth in GB/s"

    def show(self, snap: Snapshot) -> None:
        self.sync([(f"{r['op']}@{r['group']}", op_cells(r)) for r in snap.op_rows])
        self.border_title = f"Ops ({len(snap.op_rows)})" if snap.op_rows else "Ops (none finished yet)"

    def sort_rows(self) -> None:
        self.sort("group", "op")


class LinksTable(SnapshotTable):
    COLUMNS = LINK_COLUMNS
    TITLE = "Links"
    SUBTITLE = "last second"

    def __init__(self, topology=None, **kw) -> None:
        super().__init__(**kw)
        self.topology = topology

    def show(self, snap: Snapshot) -> None:
        rows = link_rows(snap.rates, snap.places, self.topology, snap.samples, snap.focus,
                         topologies=snap.topologies)
        self.sync(rows)
        self.border_title = f"Links ({len(rows)})" if rows else "Links (nothing moving)"


class AlertsTable(SnapshotTable):
    """Diagnoses and the probe's / the wire's own trouble; hidden when there is none."""

    COLUMNS = ALERT_COLUMNS
    TITLE = "Alerts"
    SUBTITLE = "enter: details"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.payloads: dict[str, Diagnosis | dict] = {}

    def on_mount(self) -> None:
        super().on_mount()
        self.display = False

    def show(self, snap: Snapshot) -> None:
        alerts = snap.alerts
        self.payloads = {key: payload for key, _, payload in alerts}
        self.display = bool(alerts) and snap.info["nranks"] > 0
        if alerts:
            self.sync([(key, cells) for key, cells, _ in alerts])
            self.border_title = f"Alerts ({len(alerts)})"
