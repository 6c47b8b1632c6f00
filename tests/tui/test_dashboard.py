"""The dashboard's flow view, throughput, links and focus, driven by Textual's Pilot
on deterministic scenes (fixed feed clock, animation clock stopped)."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from commviz.topo.discover import discover
from commviz.topo.presets import load_preset
from commviz.tui.app import WatchApp
from commviz.tui.feed import ReplayFeed
from commviz.tui.widgets.flow import FlowView
from commviz.tui.widgets.tables import LinksTable
from commviz.tui.widgets.throughput import ThroughputPanel

from . import scenes
from .helpers import FakeClock, two_rank_trace

pytestmark = pytest.mark.asyncio

EXACT = set("▸◂▾▴")
MODELLED = set("▹◃▿▵")


def flow_text(app: WatchApp) -> str:
    return "\n".join(app.query_one("#flow", FlowView).text_lines())


def panel_text(app: WatchApp, sel: str) -> str:
    return str(app.query_one(sel, Static).render())


def table_keys(table: DataTable) -> list[str]:
    return [k.value for k in table.rows]


def make(feed, **kw) -> WatchApp:
    return WatchApp(feed, title="t", animate=False, clock=FakeClock(), **kw)


async def test_flow_view_draws_a_ring_with_modelled_and_exact_packets():
    feed = scenes.with_p2p(scenes.busy_ring(8), 2, 6)
    app = make(feed)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        flow = app.query_one("#flow", FlowView)
        assert flow.flow_layout.kind == "ring"
        text = flow_text(app)
        for r in range(8):
            assert f"●{r}" in text  # idle ranks that moved data lately
        assert set(text) & MODELLED, "collective traffic is drawn as modelled packets"
        assert set(text) & EXACT, "send/recv is drawn as exact packets"
        assert "all_reduce: modelled ring, 2(n-1)/n·S" in text  # the banner says how it was derived
        assert "▸exact" in text and "▹modelled" in text  # the legend
        # Links: ring edges are modelled, the send is exact.
        links = app.query_one("#links", LinksTable)
        assert "e:2:6" in links.link_keys() and "e:0:1" in links.link_keys()
        assert links.link_cell("e:2:6", "how").plain == "exact"
        assert links.link_cell("e:0:1", "how").plain == "modelled"
        tp = panel_text(app, "#throughput")
        assert "GB/s" in tp and "ops/s" in tp


async def test_packets_move_along_edges_and_only_their_rows_repaint():
    feed = scenes.busy_ring(4)
    app = make(feed, t_anim=0.0)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        flow = app.query_one("#flow", FlowView)
        before = flow.text_lines()
        moving_rows = set(flow._overlay)
        assert moving_rows, "a busy ring has packets"
        flow.thaw()
        flow.advance(1 / 8)  # one cell at 8 cells/s
        after = flow.text_lines()
        assert before != after
        changed = {y for y, (a, b) in enumerate(zip(before, after)) if a != b}
        assert changed <= moving_rows | set(flow._overlay)  # static rows were left alone
        flow.freeze()
        t = flow.t_anim
        app.animate_tick()
        assert flow.t_anim == t  # frozen: the clock stands still


async def test_a_hang_is_visible_at_a_glance():
    feed = scenes.hang(8, missing=5)
    app = make(feed)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = flow_text(app)
        assert "HANG:" in text.splitlines()[0]  # banner
        assert "?5" in text  # the rank everyone waits for
        assert "◐0" in text and "◐7" in text  # the waiting ranks
        assert "·" in text  # wait lines towards rank 5
        nodes_area = "\n".join(text.splitlines()[1:-1])  # without banner and legend
        assert not (set(nodes_area) & (EXACT | MODELLED)), "nothing moves in a hang"
        alerts = app.query_one("#alerts", DataTable)
        assert alerts.display and alerts.row_count == 1
        tp = panel_text(app, "#throughput")
        assert "0 B/s" in tp


async def test_focus_a_rank_from_the_table_and_back():
    feed = scenes.with_p2p(scenes.busy_ring(8), 2, 6)
    app = make(feed)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        ranks = app.query_one("#ranks", DataTable)
        ranks.focus()
        await pilot.press("down", "down", "enter")  # rank 2
        await pilot.pause()
        assert app.focus_rank == 2
        flow = app.query_one("#flow", FlowView)
        assert flow.focus_rank == 2 and "rank 2" in str(flow.border_title)
        assert "focus: rank 2" in flow_text(app)
        tp = panel_text(app, "#throughput")
        assert "r2 tx" in tp and "r2 rx" in tp and "r2 ops" in tp
        links = app.query_one("#links", LinksTable).link_keys()
        assert links and all("2" in k.split(":")[1:] for k in links)  # only rank 2's edges
        assert "focus rank 2" in panel_text(app, "#status")
        await pilot.press("escape")
        await pilot.pause()
        assert app.focus_rank is None and "r2 tx" not in panel_text(app, "#throughput")
        await pilot.press("down", "f")  # rank 3 by key
        await pilot.pause()
        assert app.focus_rank == 3
        await pilot.press("f")  # again: all ranks
        assert app.focus_rank is None


async def test_click_a_node_focuses_it():
    app = make(scenes.busy_ring(4))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        flow = app.query_one("#flow", FlowView)
        x, y, w = flow.flow_layout.nodes[3]
        _, _, top = flow._area()
        await pilot.click("#flow", offset=(x + 1 + 1, y + top + 1))  # +1: the border
        await pilot.pause()
        assert app.focus_rank == 3


async def test_pause_view_stops_tables_and_animation():
    feed = scenes.busy_ring(4, ops=10)
    app = WatchApp(feed, title="t", clock=FakeClock())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("p")
        assert app.frozen and app.query_one("#flow", FlowView).frozen
        ops = app.query_one("#ops", DataTable)
        before = ops.get_cell("all_reduce@0", "count")
        with feed.lock:
            more = scenes.busy_ring(4, ops=20)
            feed.model = more.model
        app.refresh_view()
        await pilot.pause()
        assert ops.get_cell("all_reduce@0", "count") == before
        await pilot.press("p")
        await pilot.pause()
        assert not app.frozen and not app.query_one("#flow", FlowView).frozen
        assert ops.get_cell("all_reduce@0", "count").plain == "20"


async def test_replay_controls_drive_the_flow_view():
    clock = FakeClock()
    feed = ReplayFeed(two_rank_trace(n_ops=3, nbytes=1 << 20), clock=clock, name="run.cvz")
    app = WatchApp(feed, title="replay", animate=False, clock=clock)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("space")  # pause
        await pilot.press("n", "n", "n", "n")  # both starts, both ends of op 0
        await pilot.pause()
        text = flow_text(app)
        assert "●0" in text and "●1" in text
        assert set(text) & MODELLED  # op 0 just moved 1 MiB each way
        assert "replay run.cvz" in panel_text(app, "#status")
        await pilot.press("right_square_bracket", "plus", "space")
        assert feed.speed == 2.0 and not feed.paused
        clock.tick(5.0)
        app.refresh_view()
        await pilot.pause()
        assert feed.done


async def test_gpus_under_their_host_with_topology_and_measured_nvlink():
    topo = discover(load_preset("dgx-h100"))
    feed = scenes.nvlink_samples(scenes.busy_ring(16, gpu=True))
    app = make(feed, topology=topo)
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        flow = app.query_one("#flow", FlowView)
        assert flow.flow_layout.kind == "hosts"
        text = flow_text(app)
        assert "node0 · NVSwitch" in text and "node1 · NVSwitch" in text and "network" in text
        links = app.query_one("#links", LinksTable)
        assert "nv:node0:3" in links.link_keys()  # measured, from rank 0's samples
        assert links.link_cell("nv:node0:3", "how").plain == "measured"
        assert links.link_cell("nv:node0:3", "cap").plain == "450 GB/s"
        assert links.link_cell("e:0:1", "via") == "NVLink×18"
        assert links.link_cell("e:7:8", "via") == "network"


async def test_many_ranks_fall_back_to_a_grid():
    app = make(scenes.busy_ring(1024, ops=3))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        flow = app.query_one("#flow", FlowView)
        assert flow.flow_layout.kind == "grid"
        assert "ranks per cell" in str(flow.border_subtitle)


async def test_light_theme_and_narrow_links_toggle():
    app = make(scenes.busy_ring(8))
    async with app.run_test(size=(80, 24)) as pilot:
        app.theme = "textual-light"
        await pilot.pause()
        assert "●0" in flow_text(app)
        links, side = app.query_one("#links", DataTable), app.query_one("#side")
        assert not side.display and links.size.width == 0  # narrow: hidden until asked for
        await pilot.press("l")
        await pilot.pause()
        assert side.display and links.size.width > 0
        await pilot.press("l")
        await pilot.pause()
        assert not side.display and links.size.width == 0  # hidden again
        assert isinstance(app.query_one("#throughput"), ThroughputPanel)
