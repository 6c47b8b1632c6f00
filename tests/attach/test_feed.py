"""`commviz attach --watch`'s feed: each round's model swapped in whole, under the
lock the dashboard snapshots with; a failed round keeps the last model and says why."""

import pytest

from commviz.attach.feed import AttachFeed
from commviz.model import Model
from tests.helpers import hello


def round_of(n: int):
    m = Model()
    for r in range(n):
        m.ingest(r, hello(r, world=n))
    return m, {"job": "torchrun:x", "stacks": {"read": n, "of": n}, "flight_recorder": {}, "ras": {}}


def test_each_round_replaces_the_model_and_the_status_says_what_was_read():
    sizes = iter([2, 4])
    feed = AttachFeed(lambda: round_of(next(sizes)))
    assert "looking at the ranks" in feed.status()
    feed.look_once()
    assert len(feed.model.ranks) == 2 and "2/2 ranks read" in feed.status() and "round 1" in feed.status()
    feed.look_once()
    assert len(feed.model.ranks) == 4 and "round 2" in feed.status()


def test_a_failed_round_keeps_the_last_model_and_says_why():
    calls = []

    def observe():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("py-spy did not answer")
        return round_of(3)

    feed = AttachFeed(observe)
    feed.look_once()
    before = feed.model
    feed.look_once()
    assert feed.model is before and "py-spy did not answer" in feed.status()


@pytest.mark.asyncio
async def test_the_dashboard_opens_on_an_attach_feed():
    from textual.widgets import DataTable

    from commviz.tui.app import WatchApp

    feed = AttachFeed(lambda: round_of(4))
    feed.look_once()
    app = WatchApp(feed, title="commviz attach", animate=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        ranks = app.query_one("#ranks", DataTable)
        assert ranks.row_count == 4
