"""Alerts in the dashboard: one shows within a second of the hang threshold, and
opening it shows the diagnosis with each involved rank's stack, its own frame first."""

from __future__ import annotations

import time

import pytest
from textual.widgets import DataTable, Static

from commviz.events import Frame, Stack
from commviz.tui.alerts import DiagnosisScreen
from commviz.tui.app import WatchApp

from . import scenes
from .helpers import MS, FakeClock

pytestmark = pytest.mark.asyncio

HANG_AFTER_MS = 10_000  # the model's default threshold


def hang_before_threshold():
    """scenes.hang, with the clock 100 ms short of the threshold."""
    feed = scenes.hang(8, missing=5)
    entered = feed.now - 12_000 * MS
    feed.now = entered + (HANG_AFTER_MS - 100) * MS
    return feed, entered


async def wait_until(pilot, cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        await pilot.pause(0.02)


async def test_an_alert_shows_within_a_second_of_the_hang_threshold():
    feed, entered = hang_before_threshold()
    app = WatchApp(feed, title="t", animate=False, clock=FakeClock())
    async with app.run_test(size=(120, 40)) as pilot:
        alerts = app.query_one("#alerts", DataTable)
        ticks = app.ticks
        await wait_until(pilot, lambda: app.ticks >= ticks + 2)
        assert not alerts.display  # not a hang yet: 9.9 s of waiting
        feed.now = entered + HANG_AFTER_MS * MS  # the threshold passes
        ticks = app.ticks
        await wait_until(pilot, lambda: alerts.display)
        # counted on the app's own data clock, not the wall (a loaded box delays both alike)
        assert (app.ticks - ticks) / app.refresh_hz <= 1.0
        assert alerts.row_count == 1
        assert "hang" in str(alerts.get_row_at(0)[0])


def stack(op_id: int, line: int) -> Stack:
    return Stack(t=0, op_id=op_id, thread="MainThread", frames=[
        Frame("<frozen runpy>", 88, "_run_code"),
        Frame("/home/me/proj/train.py", 120, "main", "step(model, batch)"),
        Frame("/home/me/proj/train.py", line, "step", "dist.reduce_scatter_tensor(out, grads)"),
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 4100,
              "reduce_scatter_tensor", "work = group._reduce_scatter_base(output, input, opts)"),
    ])


async def test_the_diagnosis_screen_shows_each_waiting_ranks_stack_user_frame_first():
    feed = scenes.hang(8, missing=5)
    for r in (0, 3):
        feed.model.ingest(r, stack(40, 57 + r))  # op 40: the reduce_scatter every rank but 5 is in
    app = WatchApp(feed, title="t", animate=False, clock=FakeClock())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        alerts = app.query_one("#alerts", DataTable)
        alerts.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DiagnosisScreen)
        body = "\n".join(str(w.render()) for w in app.screen.query(Static))
        lines = body.splitlines()
        assert lines[0].startswith("HANG: reduce_scatter_tensor #40")
        assert "waiting 0,1,2,3,4,6,7" in body and "missing 5" in body
        for r in (0, 3):
            i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"rank {r} (MainThread) stuck at"))
            assert f"train.py:{57 + r}" in lines[i]  # where: the user's own line, not torch's
            assert lines[i + 1].strip() == f"/home/me/proj/train.py:{57 + r} in step — dist.reduce_scatter_tensor(out, grads)"
        assert "distributed_c10d.py" not in body  # torch's frames are left out
        assert "rank 5 never entered it" in body
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, DiagnosisScreen)


async def test_events_a_rank_dropped_are_an_alert_naming_the_rank_and_the_count():
    from commviz.events import Counters

    feed = scenes.busy_ring(4)
    feed.model.ingest(2, Counters(t=feed.now, dropped=1234))
    app = WatchApp(feed, title="t", animate=False, clock=FakeClock())
    async with app.run_test(size=(120, 40)) as pilot:
        alerts = app.query_one("#alerts", DataTable)
        await wait_until(pilot, lambda: alerts.display)
        rows = [" ".join(str(c) for c in alerts.get_row_at(i)) for i in range(alerts.row_count)]
        assert rows == ["dropped ranks 2 1234 events never reached this watcher (ranks 2); "
                        "set COMMVIZ_TRACE_DIR to keep everything"]
