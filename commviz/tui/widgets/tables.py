"""The dashboard's four tables. Each owns its DataTable (it is one): its columns, its
rows kept in step with the model by key, its title; the app only hands it a new
`Snapshot` (a reactive), and the table redraws from it.

Rows are updated in place, by row key, so the cursor stays where the user put it;
columns grow to fit and never shrink (shrinking makes DataTable measure the whole
column again).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from commviz.model.diagnosis import RankStatus
from commviz.model.document import RankRow
from commviz.tui.alerts import ALERT_COLUMNS, alert_cells
from commviz.tui.fmt import format_bytes, format_count, format_gbps, format_seconds, format_us
from commviz.view.alerts import AlertRow
from commviz.view.snapshot import Snapshot
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


def rank_cells(row: RankRow, proc: tuple[float, int] | None = None) -> tuple:
    """One rank-table row from a `Model.rank_rows()` row; `proc`, the rank process's
    (cpu %, rss bytes) when it runs on the watcher's host (psutil)."""
    status = row.status
    hung = status == RankStatus.HUNG
    in_op = ""
    if row.op:
        in_op = _r(format_seconds(row.in_op_s), "red" if hung else ("yellow" if row.in_op_s >= 1 else ""))
    seen_s = row.last_seen_s
    seen_style = "dim" if (seen_s is not None and seen_s < 2) or status == RankStatus.EXITED else "yellow"
    dropped = row.dropped
    cpu, rss = proc if proc is not None else (None, None)
    return (
        _r(str(row.rank), "bold"),
        Text(status, style=STATUS_STYLE.get(status, "")),
        # Idle ranks show their last op, dimmed, so a glance still says what they did.
        Text(row.op, style="bold" if hung else "") if row.op else Text(row.last_op, style="dim"),
        in_op or _r(""),
        _r(format_count(row.ops_done)),
        _r(format_bytes(row.bytes)),
        _r(f"{cpu:.0f}" if cpu is not None else "", "dim"),
        _r(format_bytes(rss) if rss is not None else "", "dim"),
        _r(format_seconds(seen_s), seen_style),
        _r(str(dropped), "bold red" if dropped else "dim"),
        Text(row.device),
        Text(row.host),
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


# Statuses that earn a row past MAX_RANK_ROWS. Not `waiting`: every rank inside a
# collective is waiting for a moment, so picking by it swapped rows in and out on every
# tick of a healthy job (and DataTable lays the whole screen out again per row removed).
_WORTH_A_ROW = frozenset({RankStatus.DEAD, RankStatus.MISSING, RankStatus.HUNG})


def pick_rank_rows(rows: list[RankRow], focus: int | None, limit: int = MAX_RANK_ROWS) -> list[RankRow]:
    """At most `limit` rows: the focused rank, then trouble (dead, missing, hung,
    worst first), then the lowest ranks; in rank order."""
    if len(rows) <= limit:
        return rows

    def rank(r: RankRow) -> tuple:
        st = r.status
        return (r.rank != focus, st.severity if st in _WORTH_A_ROW else 99, r.rank)

    return sorted(sorted(rows, key=rank)[:limit], key=lambda r: r.rank)


def _cell_width(value) -> int:
    """Cells on screen, as DataTable measures them (wide characters take two)."""
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))


def _differs(new, cur) -> bool:
    """Rich's Text equality reads the text and its spans, not its own style: a hung
    rank's op turning bold, the same words, would not be redrawn."""
    if new != cur:
        return True
    return isinstance(new, Text) and (new.style != cur.style or new.justify != cur.justify)


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
        self._drawn_cells: dict[tuple, tuple] = {}  # see _render_cell

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
        vanished ones; re-sort only when rows were added.

        Changed cells that fit their column are written straight into the table's
        data and repainted once: `update_cell` repaints per call, ~6 µs each, and at
        1,024 ranks a tick changes most of 128 rows × 12 cells. A cell that widens its
        column widens it here, with room to spare (see below); without the fast path
        it goes through `update_cell`, which measures it."""
        # Rows added since the last idle are not measured yet: measured now, as the
        # idle would, so that a cell that widens a column finds it as wide as it would
        # be had an idle come between the two ticks (whether one does is the event
        # loop's timing: on Python 3.13 it did not, and Links drew 13 cells for 11).
        if _FAST_SYNC and self._new_rows:
            new_rows = self._new_rows.copy()
            self._new_rows.clear()
            self._update_dimensions(new_rows)
        want = {key for key, _ in rows}
        for key in [k for k in self.rows if k.value not in want]:
            self.remove_row(key)
        col_keys = [c[0] for c in self.COLUMNS]
        cols = [self.columns.get(k) for k in self.columns]
        data = self._data if _FAST_SYNC else None
        added = written = False
        for key, cells in rows:
            if key in self.rows:
                row = data[key] if data is not None else None
                for ck, col, new, cur in zip(col_keys, cols, cells, self.get_row(key)):
                    if _differs(new, cur):
                        need = _cell_width(new)
                        grow = col is not None and need > col.content_width
                        if row is None:
                            self.update_cell(key, ck, new, update_width=grow)
                        else:
                            row[ck] = new
                            written = True
                            if grow:
                                # A wider column lays the whole screen out again (~86 ms
                                # at 1,024 ranks, a dropped frame or five), and counts and
                                # ages widen one digit at a time: room for the next two.
                                # Widened here, not by update_cell(update_width=True),
                                # whose measure on idle would take the room back.
                                col.content_width = need + WIDEN_ROOM
                                self._require_update_dimensions = True
            else:
                self.add_row(*cells, key=key)
                added = True
        if written:
            self._update_count += 1  # what DataTable's render caches are keyed on
            self.refresh()
        if added and self.row_count > 1:
            self.sort_rows()

    def _render_cell(self, row_index: int, column_index: int, base_style, width: int,
                     cursor: bool = False, hover: bool = False):
        """DataTable renders every visible cell again after any update (its cache is
        keyed on an update count); here a cell whose value object is the one last
        drawn in that place, the same way, is not rendered again. `sync` keeps the
        objects of unchanged cells, so a tick re-renders only what changed. The header
        row's cells (row -1, their column's label) too: through Rich they cost ~120 µs
        each, and DataTable drew every table's header again at every data tick."""
        if row_index < -1 or column_index < 0 or not _FAST_SYNC:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        col = self._column_locations.get_key(column_index)
        if row_index < 0:
            cell = self.columns[col].label
        else:
            cell = self._data[self._row_locations.get_key(row_index)][col]
        key = (row_index, column_index, base_style, width, cursor, hover, self._show_hover_cursor,
               self._pseudo_class_state)
        drawn = self._drawn_cells.get(key)
        if drawn is not None and drawn[0] is cell:
            return drawn[1]
        lines = None
        if row_index >= 0 and type(cell) is Text and self.rows[self._row_locations.get_key(row_index)].height == 1:
            lines = self._text_lines(cell, row_index, column_index, base_style, width, cursor, hover)
        if lines is None:
            lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        if len(self._drawn_cells) >= _DRAWN_CELLS_MAX:
            self._drawn_cells.clear()
        self._drawn_cells[key] = (cell, lines)
        return lines

    def _text_lines(self, cell: Text, row_index: int, column_index: int, base_style: Style, width: int,
                    cursor: bool, hover: bool) -> list[list[Segment]] | None:
        """The lines DataTable's `_render_cell` gets from Rich for a one-line Text with
        one style that fits its column, built here: Rich's console pipeline (Padding,
        justify, styles) costs ~120 µs a cell, this ~10. The same styles, in the same
        order (`_get_styles_to_render_cell`, the cell's meta); tests/tui/test_tables.py
        compares the two on every cell of a real table. None: let DataTable do it."""
        plain = cell.plain
        if cell._spans or "\n" in plain or "\t" in plain or cell.justify not in _JUSTIFIED:
            return None
        pad = self.cell_padding
        room = width - 2 * pad
        n = cell.cell_len
        if room < 0 or n > room:
            return None
        component, post = self._get_styles_to_render_cell(
            False, False, row_index < self.fixed_rows or column_index < self.fixed_columns, hover, cursor,
            self.show_cursor, self._show_hover_cursor, self.cursor_foreground_priority == "css",
            self.cursor_background_priority == "css")
        pre = base_style + Style.from_meta({"row": row_index, "column": column_index}) + component
        edge = pre + post
        own = (pre + self.app.console.get_style(cell.style) + post) if cell.style and plain else edge
        excess = room - n
        justify = cell.justify if plain else None  # Rich justifies no empty line
        if justify == "right":
            body = [Segment(" " * excess + plain, own)]
        elif justify == "center":
            body = [Segment(" " * (excess // 2) + plain + " " * (excess - excess // 2), own)]
        elif justify == "left":
            body = [Segment(plain + " " * excess, own)]
        else:  # default: the text, then Padding's fill in the cell's own style
            body = [Segment(plain, own)] + ([Segment(" " * excess, edge)] if excess else [])
        if pad:
            side = Segment(" " * pad, edge)
            body = [side, *body, side]
        return [body]

    def notify_style_update(self) -> None:
        self._drawn_cells.clear()
        super().notify_style_update()

    def _clear_caches(self) -> None:
        """DataTable clears its caches when what a cell looks like may have changed
        (cursor shown or not, fixed rows or columns, clear, sort): so does this one."""
        cells = self.__dict__.get("_drawn_cells")  # DataTable's __init__ may clear before ours ran
        if cells:
            cells.clear()
        super()._clear_caches()



class RanksTable(SnapshotTable):
    COLUMNS = RANK_COLUMNS
    TITLE = "Ranks"
    SUBTITLE = "enter: focus"

    def show(self, snap: Snapshot) -> None:
        shown = pick_rank_rows(snap.rank_rows, snap.focus)
        self.sync([(str(r.rank), rank_cells(r, snap.procs.get(r.rank))) for r in shown])
        info = snap.info
        ws = info.world_size
        title = f"Ranks {info.nranks}/{ws}" if ws else "Ranks"
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
    """Rows are places, not links: a link that stays keeps its row, one that goes
    gives its row to the next, and only a shorter list removes rows. A removed row
    costs the whole screen a layout (~80 ms at 1,024 ranks on 2 busy cores), and at
    that size the fastest links change every second. So the rows are in rate order
    (measured NVLink first) when the list is made or gets shorter, and a newcomer
    takes the row that was freed; the cursor stays on its row, whatever link is
    there next."""

    COLUMNS = LINK_COLUMNS
    TITLE = "Links"
    SUBTITLE = "last second"

    def __init__(self, topology=None, **kw) -> None:
        super().__init__(**kw)
        self.topology = topology
        self._slots: list[str] = []  # the link (link_rows' key) in each row, row key str(i)

    def show(self, snap: Snapshot) -> None:
        rows = link_rows(snap.rates, snap.places, self.topology, snap.samples, snap.focus,
                         topologies=snap.topologies, shown=set(self._slots))
        cells = dict(rows)
        if len(rows) < len(self._slots):  # fewer: packed again, in rate order
            slots = [k for k, _ in rows]
        else:
            had = set(self._slots)
            new = iter([k for k, _ in rows if k not in had])
            slots = [k if k in cells else next(new) for k in self._slots] + list(new)
        self._slots = slots
        self.sync([(str(i), cells[k]) for i, k in enumerate(slots)])
        self.border_title = f"Links ({len(rows)})" if rows else "Links (nothing moving)"

    def link_keys(self) -> list[str]:
        """The links shown, by row: "e:SRC:DST" for an edge, "nv:HOST:GPU" measured
        (row keys are places, so a caller asking for a link asks here)."""
        return list(self._slots)

    def link_cell(self, link: str, column: str):
        """The cell of `column` in `link`'s row."""
        return self.get_cell(str(self._slots.index(link)), column)


class AlertsTable(SnapshotTable):
    """Diagnoses and the probe's / the wire's own trouble; hidden when there is none."""

    COLUMNS = ALERT_COLUMNS
    TITLE = "Alerts"
    SUBTITLE = "enter: details"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.payloads: dict[str, AlertRow] = {}  # row key -> the alert its detail screen opens

    def on_mount(self) -> None:
        super().on_mount()
        self.display = False

    def show(self, snap: Snapshot) -> None:
        alerts = snap.alerts
        self.payloads = {a.key: a for a in alerts}
        self.display = bool(alerts) and snap.info.nranks > 0
        if alerts:
            self.sync([(a.key, alert_cells(a)) for a in alerts])
            self.border_title = f"Alerts ({len(alerts)})"


_JUSTIFIED = ("right", "left", "center", "default", None)


def _textual_has_what_sync_needs() -> bool:
    """The shortcuts above rest on DataTable internals of Textual 8 (a dict of row
    dicts in `_data`, render caches keyed on `_update_count`, rows to measure in `_new_rows`, `_render_cell`'s
    arguments, how it styles a cell, `_require_update_dimensions` read on idle);
    checked once, so that another Textual gets the public API and DataTable's own
    rendering instead. tests/tui/test_tables.py checks
    that what is drawn follows the data, and is what DataTable would draw."""
    import inspect

    try:
        params = list(inspect.signature(DataTable._render_cell).parameters)
        names = set(DataTable.__init__.__code__.co_names)
        on_idle = set(DataTable._on_idle.__code__.co_names)
    except (AttributeError, ValueError, TypeError):
        return False
    return (params[:7] == ["self", "row_index", "column_index", "base_style", "width", "cursor", "hover"]
            and hasattr(DataTable, "_clear_caches")
            and {"_data", "_update_count", "_row_locations", "_column_locations", "_show_hover_cursor", "_new_rows",
                 "cursor_foreground_priority", "cursor_background_priority"} <= names
            and {"_require_update_dimensions", "_update_dimensions"} <= on_idle
            and all(hasattr(DataTable, a) for a in ("_get_styles_to_render_cell", "cell_padding", "fixed_rows",
                                                    "fixed_columns")))


_FAST_SYNC = _textual_has_what_sync_needs()
WIDEN_ROOM = 2  # cells a widening column gets beyond what its widest cell needs
_DRAWN_CELLS_MAX = 20_000  # (place, look) keys: 128 rows × 12 columns × a few looks fit
