"""The dashboard's tables: which ranks get a row past 128, and that what is drawn
follows the data when `sync` writes changed cells straight into the DataTable."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App
from textual.widgets import DataTable

from commviz.model.diagnosis import RankStatus
from commviz.model.document import RankRow
from commviz.tui.widgets import tables
from commviz.tui.widgets.tables import MAX_RANK_ROWS, SnapshotTable, pick_rank_rows


def rows(n: int, status: dict[int, RankStatus] | None = None) -> list[RankRow]:
    status = status or {}
    return [RankRow(r, status=status.get(r, RankStatus.OK)) for r in range(n)]


def shown(picked: list[RankRow]) -> list[int]:
    return [r.rank for r in picked]


def test_past_the_limit_trouble_and_the_focus_get_rows_and_busy_ranks_do_not():
    # Ranks inside a collective are `waiting` for a moment on every tick of a healthy job:
    # they must not push the lowest ranks out (the rows would churn four times a second).
    waiting = {r: RankStatus.WAITING for r in range(0, 1024, 3)}
    assert shown(pick_rank_rows(rows(1024, waiting), None)) == list(range(MAX_RANK_ROWS))
    trouble = waiting | {900: RankStatus.HUNG, 901: RankStatus.DEAD, 902: RankStatus.MISSING}
    got = shown(pick_rank_rows(rows(1024, trouble), focus=700))
    assert len(got) == MAX_RANK_ROWS and got == sorted(got)
    assert {700, 900, 901, 902} <= set(got)
    assert got[:MAX_RANK_ROWS - 4] == list(range(MAX_RANK_ROWS - 4))
    # the worst first when trouble alone overflows the table
    many = {r: RankStatus.HUNG for r in range(200)} | {r: RankStatus.DEAD for r in range(500, 510)}
    got = shown(pick_rank_rows(rows(1024, many), None))
    assert set(range(500, 510)) <= set(got) and len(got) == MAX_RANK_ROWS
    assert shown(pick_rank_rows(rows(5, waiting), None)) == [0, 1, 2, 3, 4]


class Counts(SnapshotTable):
    COLUMNS = [("name", "name", False), ("n", "n", True)]

    def show(self, snap) -> None:  # driven by `sync` directly here
        pass


class One(App):
    def compose(self):
        yield Counts(id="t")


def drawn(table: DataTable) -> list[str]:
    return [table.render_line(y).text.rstrip() for y in range(table.row_count + 1)]


@pytest.mark.asyncio
async def test_what_is_drawn_follows_each_sync_and_only_changed_cells_are_rendered_again(monkeypatch):
    assert tables._FAST_SYNC, "Textual changed: sync and the cell cache fall back to the public API"
    renders = []  # cells rendered, by Rich (DataTable) or by _text_lines
    real, built = DataTable._render_cell, SnapshotTable._text_lines

    def counting(real):
        def render(self, cell_or_row, *a, **kw):
            if isinstance(cell_or_row, Text):
                renders.append(a[:2])
            else:
                renders.append((cell_or_row, a[0]))
            return real(self, cell_or_row, *a, **kw)
        return render

    monkeypatch.setattr(DataTable, "_render_cell", counting(real))
    monkeypatch.setattr(SnapshotTable, "_text_lines", counting(built))
    app = One()
    async with app.run_test(size=(40, 10)) as pilot:
        t = app.query_one(Counts)

        def sync(values):
            t.sync([(name, (name, Text(str(v), justify="right"))) for name, v in values])

        sync([("a", 1), ("b", 2), ("c", 3)])
        await pilot.pause()
        assert [line.split() for line in drawn(t)][1:] == [["a", "1"], ["b", "2"], ["c", "3"]]
        renders.clear()
        sync([("a", 1), ("b", 7), ("c", 3)])  # one cell changed
        await pilot.pause()
        assert [line.split() for line in drawn(t)][1:] == [["a", "1"], ["b", "7"], ["c", "3"]]
        body = {rc for rc in renders if rc[0] >= 0}
        assert body == {(1, 1)}, body  # row b, column n; the rest came from the cache
        assert not [rc for rc in renders if rc[0] < 0]  # nor the header (Rich: ~120 µs a cell)
        sync([("a", 1), ("b", 123456789), ("c", 3)])  # wider than its column: it grows
        await pilot.pause()
        await pilot.pause()
        assert [line.split() for line in drawn(t)][1:] == [["a", "1"], ["b", "123456789"], ["c", "3"]]
        # a column that widened kept room for two more cells: a count growing a digit
        # does not lay the screen out again (~86 ms at 1,024 ranks)
        width = t.virtual_size.width
        assert width == sum(c.get_render_width(t) for c in t.columns.values())  # laid out anew once
        assert drawn(t)[0].split() == ["name", "n"]  # the header, kept from before the widening
        sync([("a", 1), ("b", 12345678901), ("c", 3)])
        await pilot.pause()
        await pilot.pause()
        assert [line.split() for line in drawn(t)][1:] == [["a", "1"], ["b", "12345678901"], ["c", "3"]]
        assert t.virtual_size.width == width
        t.sync([("a", ("a", "中文字中文字")), ("b", ("b", Text("123456789", justify="right"))),
                ("c", ("c", Text("3", justify="right")))])  # wide characters: two cells each
        await pilot.pause()
        await pilot.pause()
        assert drawn(t)[1].split() == ["a", "中文字中文字"]  # whole: its column measured in cells
        sync([("a", 1), ("b", 123456789), ("c", 3)])
        await pilot.pause()
        # the same words in another style (a hung rank's op turns bold): drawn again
        t.sync([(name, (name, Text(str(v), justify="right", style="bold" if name == "c" else "")))
                for name, v in [("a", 1), ("b", 123456789), ("c", 3)]])
        await pilot.pause()
        assert any(seg.style is not None and seg.style.bold and seg.text.strip() == "3"
                   for seg in t.render_line(3))
        t.cursor_type = "row"
        t.move_cursor(row=2)
        await pilot.pause()
        assert drawn(t)[3].split() == ["c", "3"]  # drawn again under the cursor, same text


@pytest.mark.asyncio
@pytest.mark.parametrize("then", ["4.71 GB/s", "14.70 GB/s"])
async def test_a_columns_width_does_not_depend_on_whether_an_idle_came_between_two_ticks(then):
    """Rows added and, before any idle measured them, written again (a dashboard
    focused on a rank at once): the columns are as wide as when an idle came between
    the two. On Python 3.13 none did, and Links drew 13 cells where 3.11 drew 11."""
    widths = []
    for idle_between in (True, False):
        app = One()
        async with app.run_test(size=(40, 10)) as pilot:
            t = app.query_one(Counts)
            t.sync([(name, (name, Text("4.70 GB/s", justify="right"))) for name in "abc"])
            if idle_between:
                await pilot.pause()
                await pilot.pause()
                assert [c.content_width for c in t.columns.values()] == [4, 9]  # measured
            t.sync([(name, (name, Text(then, justify="right"))) for name in "ab"])
            await pilot.pause()
            await pilot.pause()
            widths.append([c.content_width for c in t.columns.values()])
    assert widths[0] == widths[1]


@pytest.mark.asyncio
async def test_cells_built_without_rich_are_what_datatable_draws(monkeypatch):
    """Every body cell the dashboard's tables draw (zebra rows, the cursor row, the
    fixed rank column, right- and left-justified, styled and plain, dark and light):
    the lines `_text_lines` builds equal DataTable's own rendering through Rich."""
    from commviz.tui.app import WatchApp

    from .scenes import busy_ring

    calls = []
    real, fast_lines = DataTable._render_cell, SnapshotTable._text_lines

    def recording(self, cell, row_index, column_index, base_style, width, cursor, hover):
        calls.append((self, row_index, column_index, base_style, width, cursor, hover))
        return fast_lines(self, cell, row_index, column_index, base_style, width, cursor, hover)

    monkeypatch.setattr(SnapshotTable, "_text_lines", recording)
    feed = busy_ring(world=16, ops=30)
    app = WatchApp(feed, title="cells")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        ranks = app.query_one("#ranks", DataTable)
        ranks.focus()
        ranks.move_cursor(row=3)
        await pilot.pause()
        app.theme = "textual-light"
        await pilot.pause()
        assert len(calls) > 100
        built = 0
        for table, r, c, base, width, cursor, hover in calls:
            cell = table._data[table._row_locations.get_key(r)][table._column_locations.get_key(c)]
            if type(cell) is not Text:
                continue
            fast = fast_lines(table, cell, r, c, base, width, cursor, hover)
            if fast is None:
                continue
            table._update_count += 1  # past DataTable's own cache
            slow = real(table, r, c, base, width, cursor, hover)
            assert fast == slow, (type(table).__name__, r, c, cell)
            built += 1
        assert built > 100
