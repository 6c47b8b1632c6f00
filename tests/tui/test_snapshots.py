"""The main screens pinned as SVG snapshots (pytest-textual-snapshot), with the feed's
clock fixed and the animation clock stopped, so the same packets are always in the same
cells. After a deliberate change of the look: `pytest tests/tui/test_snapshots.py
--snapshot-update`, look at the files in __snapshots__/, commit them."""

from __future__ import annotations

from commviz.topo.discover import discover
from commviz.topo.presets import load_preset
from commviz.tui.app import WatchApp

from . import scenes
from .helpers import FakeClock


def app_for(feed, **kw) -> WatchApp:
    return WatchApp(feed, title="commviz", animate=False, t_anim=0.3, clock=FakeClock(), **kw)


def test_busy_ring_80x24(snap_compare):
    """Eight CPU ranks in a ring all_reduce, rank 2 sending to rank 6, at the smallest size."""
    assert snap_compare(app_for(scenes.with_p2p(scenes.busy_ring(8), 2, 6)), terminal_size=(80, 24))


def test_hang_120x40(snap_compare):
    """Rank 5 never joined reduce_scatter #40: banner, alert, red wait lines, '?5'."""
    assert snap_compare(app_for(scenes.hang(8, missing=5)), terminal_size=(120, 40))


def test_gpu_hosts_with_topology_160x45(snap_compare):
    """Two DGX H100 hosts (preset topology): GPUs under their host, NVSwitch fabric,
    network between hosts, measured NVLink rows in Links."""
    topo = discover(load_preset("dgx-h100"))
    feed = scenes.nvlink_samples(scenes.busy_ring(16, gpu=True))
    assert snap_compare(app_for(feed, topology=topo), terminal_size=(160, 45))


def test_focused_rank_120x40(snap_compare):
    """Rank 2 focused: its edges only, its own sparklines."""

    def focus(pilot):
        pilot.app.set_focus_rank(2)

    feed = scenes.with_p2p(scenes.busy_ring(8), 2, 6)
    assert snap_compare(app_for(feed), terminal_size=(120, 40), run_before=focus)


def test_light_theme_100x30(snap_compare):
    """The same ring in Textual's light theme."""

    def light(pilot):
        pilot.app.theme = "textual-light"

    feed = scenes.with_p2p(scenes.busy_ring(8), 2, 6)
    assert snap_compare(app_for(feed), terminal_size=(100, 30), run_before=light)


def test_simulated_dgx_120x40(snap_compare):
    """Eight CPU ranks with --topology dgx-h100: placed on the preset's GPUs (title says
    simulated), the ring on the NVSwitch fabric, links against 450 GB/s."""
    topo = discover(load_preset("dgx-h100"))
    assert snap_compare(app_for(scenes.busy_ring(8), topology=topo, simulate=True), terminal_size=(120, 40))


def test_replay_timeline_100x30(snap_compare):
    """Replay of a 0.4 s trace, paced to 10 s (0.04× in the status line), paused past
    "step 2": the timeline under the flow with the four marks and the playhead."""
    from commviz.tui.feed import ReplayFeed

    from .test_feed import ring_trace

    feed = ReplayFeed(ring_trace(400), clock=FakeClock(), name="lesson.cvz", speed=None)
    feed.seek(0.55)
    feed.pause()
    assert snap_compare(app_for(feed), terminal_size=(100, 30))
