"""WatchApp driven by Textual's Pilot on a fake live feed and on a ReplayFeed."""

from __future__ import annotations

import os
import tempfile

import msgspec
import pytest
from textual.widgets import DataTable, Static

from commviz.events import GroupDef, OpEnd, OpStart
from commviz.model.state import Model
from commviz.tui.app import WatchApp
from commviz.tui.feed import ReplayFeed

from .helpers import MS, WALL0, FakeClock, hello, two_rank_trace
from .scenes import FakeFeed

pytestmark = pytest.mark.asyncio

SHOTS = os.environ.get("COMMVIZ_SHOTS", tempfile.gettempdir())


def fill(model: Model, n_ops: int, nbytes: int = 4096, first: int = 0) -> None:
    """Ops first..first+n_ops-1 on ranks 0 and 1 (wall = mono: offset 0)."""
    if first == 0:
        for r in (0, 1):
            model.ingest(r, hello(r, mono_ns=WALL0, wall_ns=WALL0))
            model.ingest(r, GroupDef("g0", [0, 1], "gloo"))
    for i in range(first, first + n_ops):
        for r in (0, 1):
            t = WALL0 + (10 + 10 * i) * MS
            model.ingest(r, OpStart(id=i, t=t + r * MS, op="all_reduce", group="g0", seq=i, bytes=nbytes))
            model.ingest(r, OpEnd(id=i, t=t + 4 * MS))


def cell(table: DataTable, row: str, col: str) -> str:
    v = table.get_cell(row, col)
    return getattr(v, "plain", v)


async def test_tables_show_ranks_and_ops():
    feed = FakeFeed()
    fill(feed.model, 2)
    # Rank 1 is in a third op that rank 0 has not joined.
    feed.model.ingest(1, OpStart(id=2, t=WALL0 + 40 * MS, op="broadcast", group="g0", seq=2, bytes=64))
    app = WatchApp(feed, title="test job")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert feed.advanced >= 1
        ranks = app.query_one("#ranks", DataTable)
        assert ranks.row_count == 2
        assert [cell(ranks, k, "rank") for k in ("0", "1")] == ["0", "1"]
        assert cell(ranks, "0", "status") == "ok"
        assert cell(ranks, "1", "status") == "waiting"
        assert cell(ranks, "1", "op") == "broadcast#2"
        assert cell(ranks, "1", "in_op") == "60ms"  # now is 100 ms, it started at 40
        assert cell(ranks, "0", "bytes") == "8.0 KiB"
        assert cell(ranks, "0", "ops_done") == "2"
        assert cell(ranks, "0", "device") == "cpu"
        ops = app.query_one("#ops", DataTable)
        assert ops.row_count == 1
        key = "all_reduce@g0"
        assert cell(ops, key, "op") == "all_reduce"
        assert cell(ops, key, "count") == "2"
        assert cell(ops, key, "bytes") == "8.0 KiB"
        assert cell(ops, key, "p50") == "3,000"  # µs: the last arrival's 3 ms
        assert not app.query_one("#empty").display
        status = str(app.query_one("#status", Static).render())
        assert "world 2" in status and "gloo" in status and "listening" in status
        app.save_screenshot("commviz-live-100x30.svg", path=SHOTS)


async def test_empty_state_says_what_to_do():
    app = WatchApp(FakeFeed(), title="empty")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        empty = app.query_one("#empty", Static)
        assert empty.display and not app.query_one("#body").display
        text = str(empty.render())
        assert "torchrun --nproc-per-node 4" in text and "commviz watch --" in text
        # Replay keys are hidden and inert on a live feed.
        assert app.check_action("step", ()) is False
        ran = []
        for action in ("step", "play_pause", "faster"):
            setattr(app, f"action_{action}", lambda a=action: ran.append(a))
        await pilot.press("n", "space", "plus")
        await pilot.pause()
        assert ran == []  # inert: the keys reached no action
        footer = " ".join(str(b.binding.description) for b in app.active_bindings.values() if b.binding.show and b.enabled)
        assert "Quit" in footer and "Step" not in footer and "Play/pause" not in footer  # and hidden
        # positive control: the same stand-ins do run on a replay
        replay = WatchApp(ReplayFeed(two_rank_trace(), clock=FakeClock(), name="r.cvz"), title="replay")
        replay.action_step = lambda: ran.append("step")
        async with replay.run_test(size=(80, 24)) as rp:
            await rp.press("n")
            await rp.pause()
        assert ran == ["step"]
        app.save_screenshot("commviz-empty-80x24.svg", path=SHOTS)


async def test_rows_update_in_place_and_pause_freezes():
    feed = FakeFeed()
    fill(feed.model, 1)
    app = WatchApp(feed, title="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        ops = app.query_one("#ops", DataTable)
        ranks = app.query_one("#ranks", DataTable)
        ranks.focus()
        await pilot.press("down")  # cursor on rank 1
        assert ranks.cursor_row == 1
        await pilot.press("p")
        assert app.frozen
        with feed.lock:
            fill(feed.model, 2, first=1)
        app.refresh_view()
        await pilot.pause()
        assert cell(ops, "all_reduce@g0", "count") == "1"  # frozen
        assert "paused" in app.sub_title
        await pilot.press("p")
        assert not app.frozen
        await pilot.pause()
        assert cell(ops, "all_reduce@g0", "count") == "3"
        assert cell(ranks, "1", "ops_done") == "3"
        assert ranks.cursor_row == 1  # updated in place: the cursor did not jump


async def test_replay_keys_drive_the_feed():
    clock = FakeClock()
    feed = ReplayFeed(two_rank_trace(), clock=clock, name="run.cvz")
    app = WatchApp(feed, title="replay")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.check_action("step", ()) is True
        await pilot.press("space")
        assert feed.paused
        await pilot.press("plus")
        assert feed.speed == 2.0
        await pilot.press("minus", "minus", "minus")
        assert feed.speed == 0.25
        await pilot.press("n")  # first OpStart, with both hellos and group defs
        assert feed.position == 5
        ranks = app.query_one("#ranks", DataTable)
        assert ranks.row_count == 2
        assert cell(ranks, "0", "status") == "waiting"
        assert cell(ranks, "0", "op") == "all_reduce#0"
        await pilot.press("right_square_bracket")  # 10 ms + 10% of 34 ms = 13.4 ms
        assert feed.now_ns() == WALL0 + 13_400_000
        await pilot.press(*["left_square_bracket"] * 4)
        assert feed.fraction == 0.0  # rebuilt: only rank 0 has said hello at the start
        assert ranks.row_count == 1 and feed.model.events == 2
        await pilot.press("space")
        assert not feed.paused
        clock.tick(1.0)  # 0.25 s of trace at 0.25x: plays to the end
        app.refresh_view()
        await pilot.pause()
        assert feed.done
        ops = app.query_one("#ops", DataTable)
        assert cell(ops, "all_reduce@g0", "count") == "3"
        assert cell(ops, "all_reduce@g0", "bytes") == "12.0 KiB"
        status = str(app.query_one("#status", Static).render())
        assert "run.cvz" in status and "end" in status


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_screenshot_many_ranks(size):
    """Eight busy ranks, one hung: saved to $COMMVIZ_SHOTS (default /tmp) for eyeballing."""
    feed = FakeFeed()
    m = feed.model
    world = 8
    for r in range(world):
        m.ingest(r, hello(r, mono_ns=WALL0, wall_ns=WALL0, world_size=world))
        m.ingest(r, GroupDef("g0", list(range(world)), "nccl"))
    for i in range(50):
        for r in range(world):
            t = WALL0 + i * 20 * MS
            m.ingest(r, OpStart(id=i, t=t + r * 10_000, op="all_reduce", group="g0", seq=i, bytes=256 << 20))
            m.ingest(r, OpEnd(id=i, t=t + 5 * MS))
    for r in range(world):
        t = WALL0 + 1000 * MS + r * 20_000
        m.ingest(r, OpStart(id=50, t=t, op="all_gather_into_tensor", group="g0", seq=50, bytes=64 << 20))
        m.ingest(r, OpEnd(id=50, t=t + 2 * MS))
    for r in range(world - 1):  # rank 7 never arrives
        m.ingest(r, OpStart(id=51, t=WALL0 + 1100 * MS, op="reduce_scatter_tensor", group="g0", seq=51, bytes=1 << 30))
    feed.now = WALL0 + 13_000 * MS
    app = WatchApp(feed, title="commviz · 8 ranks")
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        ranks = app.query_one("#ranks", DataTable)
        assert ranks.row_count == world
        assert cell(ranks, "0", "status") == "hung"
        assert cell(ranks, "7", "status") == "missing"  # the one the others wait for
        path = app.save_screenshot(f"commviz-8ranks-{size[0]}x{size[1]}.svg", path=SHOTS)
        assert os.path.exists(path)


def panel_text(app: WatchApp, width: int = 100) -> str:
    """The summary panel's content as a terminal shows it."""
    import io

    from rich.console import Console

    con = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    con.print(app.query_one("#summary-text", Static).content)
    return con.export_text()


async def test_when_the_job_ends_its_summary_replaces_the_flow():
    from commviz.events import Goodbye, GroupDef

    from .scenes import straggler_job_that_ended

    feed = straggler_job_that_ended(goodbye=False)
    app = WatchApp(feed, title="ended")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        summary, flow = app.query_one("#summary"), app.query_one("#flow")
        assert flow.display and not summary.display  # still running: the flow view
        with feed.lock:
            for r in range(4):
                feed.model.ingest(r, Goodbye(WALL0 + 3200 * MS))
        app.refresh_view()
        await pilot.pause()
        assert summary.display and not flow.display and summary.region.height > 5
        text = panel_text(app)
        assert "job ended · 4 exited · world size 4 · backend gloo" in text
        [row] = [ln for ln in text.splitlines() if ln.startswith("all_reduce")]
        assert row.split()[:5] == ["all_reduce", "0", "20", "20.0", "MiB"]  # count, bytes as record prints them
        assert "STRAGGLER: rank 3 arrives last at 20 of the last 20 collectives" in text
        assert "job ended" in str(app.query_one("#status", Static).render())
        app.save_screenshot("commviz-ended-120x40.svg", path=SHOTS)
        await pilot.press("s")  # the flow view as it was left, and back
        assert flow.display and not summary.display
        await pilot.press("s")
        assert summary.display and not flow.display
        with feed.lock:  # a new job says hello: live again
            feed.model.ingest(0, msgspec.structs.replace(hello(0, WALL0, WALL0 + 5000 * MS), job="job-2", pid=77))
            feed.model.ingest(0, GroupDef("0", [0, 1], "gloo"))
        app.refresh_view()
        await pilot.pause()
        assert flow.display and not summary.display and not app.ended


async def test_a_job_that_ended_clean_says_no_findings():
    from .scenes import straggler_job_that_ended

    app = WatchApp(straggler_job_that_ended(late_ms=0), title="ended")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.query_one("#summary").display
        text = panel_text(app, 76)
        assert "no findings" in text and "all_reduce" in text
        app.save_screenshot("commviz-ended-80x24.svg", path=SHOTS)


async def test_replay_keeps_the_flow_at_the_end_of_the_trace():
    """Replay steps through time: its end is a point to seek from, not a summary."""
    from commviz.events import Batch, Goodbye

    trace = two_rank_trace()
    trace += [Batch(1, r, [Goodbye(b.events[-1].t + MS)]) for r, b in ((0, trace[1]), (1, trace[3]))]
    feed = ReplayFeed(trace)
    feed.seek(1.0)
    app = WatchApp(feed, title="replay")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert {cell(app.query_one("#ranks", DataTable), k, "status") for k in ("0", "1")} == {"exited"}
        assert app.query_one("#flow").display and not app.query_one("#summary").display
