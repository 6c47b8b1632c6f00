"""The links panel: its utilisation figure, and which edges earn a row."""

import random

from commviz.model.flows import EdgeRate
from commviz.tui.widgets.links import MAX_ROWS, link_rows, util_text


def _ring(rng: random.Random, n: int = 1024) -> dict:
    """A ring's edges all carrying about the same, as at 1,024 ranks."""
    return {(r, (r + 1) % n): EdgeRate(r, (r + 1) % n, 0.0, 1e9 * rng.uniform(0.9, 1.1), "all_reduce")
            for r in range(n)}


def test_utilisation_under_one_percent_still_says_how_much_in_five_columns():
    """A CPU lesson on a simulated DGX moves MB/s over GB/s links: the ratio between
    edges must stay visible (0.1% on PCIe against 0.01% on NVLink)."""
    assert [util_text(f) for f in (0, 0.5, 0.012, 0.0011, 0.00011, 0.000016)] == [
        "  0%", " 50%", "  1%", "0.1%", "0.01%", "<.01%"]
    assert max(len(util_text(f / 1e6)) for f in range(1, 10**6, 997)) <= 5


def test_a_rings_links_keep_their_rows_from_one_second_to_the_next():
    """Ranked afresh each second, the 40 fastest of 1,024 near-equal edges were a new
    set every time: the table churned unreadably, and each row removed cost the whole
    screen a layout."""
    rng = random.Random(0)
    first = [k for k, _ in link_rows(_ring(rng), {})]
    again = [k for k, _ in link_rows(_ring(rng), {}, shown=set(first))]
    fresh = [k for k, _ in link_rows(_ring(rng), {})]
    assert len(first) == len(again) == MAX_ROWS
    assert set(again) == set(first)
    assert len(set(fresh) & set(first)) < MAX_ROWS // 2  # what it was without


def test_an_edge_that_goes_quiet_gives_its_row_to_a_busier_one():
    rng = random.Random(1)
    rates = _ring(rng)
    shown = {k for k, _ in link_rows(rates, {})}
    quiet = next(iter(shown))
    src, dst = map(int, quiet.split(":")[1:])
    rates[src, dst] = EdgeRate(src, dst, 0.0, 1e6, "all_reduce")
    rates[5000, 5001] = EdgeRate(5000, 5001, 5e9, 0.0, "send")
    keys = [k for k, _ in link_rows(rates, {}, shown=shown)]
    assert quiet not in keys and keys[0] == "e:5000:5001" and len(keys) == MAX_ROWS


async def test_links_that_stay_keep_their_rows_and_nothing_is_removed():
    """A link that stays keeps its row; one that goes gives its row to the next. Rows
    are removed only when the list gets shorter: each removal lays the screen out."""
    from textual.app import App

    from commviz.view.snapshot import Snapshot
    from commviz.tui.widgets.tables import LinksTable

    class One(App):
        def compose(self):
            yield LinksTable(id="links")

    removed = []
    rng = random.Random(2)
    async with One().run_test(size=(120, 50)) as pilot:
        table = pilot.app.query_one(LinksTable)
        real = table.remove_row
        table.remove_row = lambda key: (removed.append(key), real(key))
        rates = _ring(rng)
        table.snapshot = Snapshot(now=0, info=None, rates=rates)
        await pilot.pause()
        before = dict(zip(table.link_keys(), map(str, range(MAX_ROWS))))
        src, dst = map(int, table.link_keys()[3].split(":")[1:])
        rates = _ring(rng)
        rates[src, dst] = EdgeRate(src, dst, 0.0, 1.0, "all_reduce")  # went quiet
        table.snapshot = Snapshot(now=1, info=None, rates=rates)
        await pilot.pause()
        after = table.link_keys()
        assert not removed and len(after) == MAX_ROWS
        assert after[3] != f"e:{src}:{dst}"  # its row went to another link
        assert all(str(after.index(k)) == row for k, row in before.items() if k in after)
        rates = dict(list(rates.items())[:10])  # fewer links: packed again
        table.snapshot = Snapshot(now=2, info=None, rates=rates)
        await pilot.pause()
        assert len(table.link_keys()) == 10 and len(removed) == MAX_ROWS - 10


def test_a_link_far_faster_than_those_shown_takes_a_row_at_once():
    rng = random.Random(3)
    rates = _ring(rng)
    shown = {k for k, _ in link_rows(rates, {})}
    rates[5000, 5001] = EdgeRate(5000, 5001, 100e9, 0.0, "send")
    keys = [k for k, _ in link_rows(rates, {}, shown=shown)]
    assert keys[0] == "e:5000:5001" and len(keys) == MAX_ROWS and len(set(keys) & shown) == MAX_ROWS - 1
