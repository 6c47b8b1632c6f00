"""The dashboard: status line, alerts, the flow view in the centre with throughput
sparklines under it and the links panel beside it, ranks and ops tables below.

The app only reads, on two clocks. The data clock (`refresh_hz`, 4/s) asks the
update thread (tui/update.py) for a snapshot: off the UI thread it calls
`feed.fetch(query)`, which gives a `Snapshot` of the model (taken under the model's
lock where the model is: plain reads and small copies, the diagnoses once) whatever
the feed is, and posts it; the app hands it to the widgets (the tables own their rows and update them in place, by row key, so
the cursor stays where the user put it). A key press (focus, pause, replay controls)
refreshes at once, on the UI thread. The animation clock (`anim_hz`) only moves the
flow view's packets: no lock, no model. Ingest therefore never waits for drawing,
and drawing never waits for ingest or for a snapshot.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, Header, Static

from commviz.tui.alerts import DiagnosisScreen
from commviz.tui.feed import Feed, ReplayFeed
from commviz.tui.fmt import format_count, format_seconds
from commviz.tui.update import SnapshotFetched, UpdateThread
from commviz.tui.widgets.flow import FlowView
from commviz.tui.widgets.tables import MAX_RANK_ROWS, AlertsTable, LinksTable, OpsTable, RanksTable
from commviz.tui.widgets.summary import summary_renderable
from commviz.tui.widgets.throughput import ThroughputPanel
from commviz.tui.widgets.timeline import TimelineBar
from commviz.view.feed import ViewQuery
from commviz.view.snapshot import Fetched, ModelInfo, OneTopology, Snapshot

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


class WatchApp(App):
    """Dashboard on a `Feed` (tui/feed.py: a collector, a replay, attach; all alike).

    `topology`: a `commviz.topo.Topology` (from `--topology` or NVML) to lay GPUs out
    by and to know link capacities; None draws what the hellos say. `simulate`: the
    user chose it, so ranks without a GPU are shown on its GPUs (the title says
    "simulated"). `hosts` (`topo.hosts.HostTopologies`, which `commands` hand in):
    each host's ranks on the topology that host sent, `topology` only where it
    describes the host; without it every host is taken to be `topology`. `clock`: monotonic
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
        Binding("s", "toggle_summary", "Summary/flow"),
        Binding("space", "play_pause", "Play/pause"),
        Binding("n", "step", "Step"),
        Binding("minus", "slower", "Slower", key_display="-"),
        Binding("plus,equals_sign", "faster", "Faster", key_display="+"),
        Binding("left_square_bracket", "seek(-0.1)", "Back 10%", key_display="["),
        Binding("right_square_bracket", "seek(0.1)", "Fwd 10%", key_display="]"),
        # Said on the timeline itself (the footer has no room left at 80 columns).
        Binding("b", "step_back", "Step back", show=False),
        Binding("comma", "seek_tick(0)", "Previous mark", show=False),
        Binding("full_stop", "seek_tick(1)", "Next mark", show=False),
    ]

    REPLAY_ACTIONS = {"play_pause", "step", "step_back", "slower", "faster", "seek", "seek_tick"}

    focus_rank: reactive[int | None] = reactive(None, init=False)  # one rank's traffic and history
    frozen: reactive[bool] = reactive(False, init=False)  # the view is paused (p)

    def __init__(self, feed: Feed, title: str = "commviz", refresh_hz: float = 4, anim_hz: float = 20,
                 topology=None, clock=None, animate: bool = True, t_anim: float = 0.0,
                 table_every: int = 2, simulate: bool = False, hosts=None) -> None:
        super().__init__()
        import time

        self.feed = feed
        self.title = self._base_title = title
        self.simulate = simulate
        self.refresh_hz = refresh_hz
        self.anim_hz = anim_hz
        self.topology = topology
        # which topology each host's ranks sit on (see view.snapshot.take_snapshot)
        self.hosts = hosts if hosts is not None else OneTopology(topology)
        self._clock = clock or time.monotonic
        self._animate = animate
        self._t_anim0 = t_anim
        self._force_tables = False
        self.ticks = 0
        self.table_every = max(1, table_every)  # tables repaint on every n-th data tick (DataTable repaints whole)
        self.snapshot: Snapshot | None = None
        self.lock_wait_s = 0.0  # time spent waiting for / holding the feed's lock, last snapshot
        self.lock_hold_s = 0.0
        self._ev_hist: list[tuple[float, int]] = []
        self._numbers = itertools.count(1)  # every snapshot asked for, in order
        self._drawn = 0  # the number of the snapshot on screen
        self._updater: UpdateThread | None = None
        self.ended = False  # live: every rank is gone; the summary replaces the flow view
        self.show_flow = False  # once ended, the user asked for the flow view back (s)
        self._summary_events = -1  # the model's event count when the summary panel got its summary

    @property
    def replay(self) -> ReplayFeed | None:
        return self.feed.replay

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="status")
        yield AlertsTable(id="alerts", cursor_type="row")
        yield Static(REPLAY_HINT if self.replay else LIVE_HINT, id="empty")
        with Vertical(id="body"):
            with Horizontal(id="top"):
                with Vertical(id="centre"):
                    flow = FlowView(id="flow")
                    flow.border_title = "Flow"
                    yield flow
                    yield TimelineBar(id="timeline")
                    tp = ThroughputPanel(id="throughput")
                    tp.border_title = "Throughput"
                    with Vertical(id="under"):  # see "side"
                        yield tp
                    summary = VerticalScroll(Static(id="summary-text"), id="summary")
                    summary.border_title = "Job summary"
                    summary.border_subtitle = "s: flow"
                    yield summary
                # Each in a box of its own: Textual repaints every widget whose clip
                # (its parent's region) meets the rows the flow view's animation
                # changed, so in the flow view's containers the links table and the
                # throughput panel were drawn again at every frame, ~2.5 ms of a
                # 12 ms frame at 1,024 ranks (bench/render.py).
                with Vertical(id="side"):
                    yield LinksTable(self.topology, id="links", cursor_type="row")
            with Horizontal(id="tables"):
                yield RanksTable(id="ranks", cursor_type="row", zebra_stripes=True, fixed_columns=1)
                yield OpsTable(id="ops", cursor_type="row", zebra_stripes=True)
        # The command palette stays on ctrl+p; the footer's room goes to our keys.
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        # Keep references: a snapshot can arrive once more while the app shuts down,
        # after the widgets left the DOM (a query would raise NoMatches then).
        self._status = self.query_one("#status", Static)
        self._empty = self.query_one("#empty", Static)
        self._body = self.query_one("#body", Vertical)
        self._flow = self.query_one("#flow", FlowView)
        self._tp = self.query_one("#throughput", ThroughputPanel)
        self._under = self.query_one("#under", Vertical)
        self._summary = self.query_one("#summary", VerticalScroll)
        self._summary_text = self.query_one("#summary-text", Static)
        self._summary.display = False
        self._links = self.query_one("#links", LinksTable)
        self._ranks = self.query_one("#ranks", RanksTable)
        self._ops = self.query_one("#ops", OpsTable)
        self._alerts = self.query_one("#alerts", AlertsTable)
        self._timeline = self.query_one("#timeline", TimelineBar)
        self._timeline.display = self.replay is not None
        self._flow.t_anim = self._t_anim0
        if not self._animate:
            self._flow.freeze()
        self._last_anim = self._clock()
        self.refresh_view()
        self._updater = UpdateThread(self._fetch, self.post_message, self._numbers)
        self._updater.start()
        self.set_interval(1.0 / self.refresh_hz, self.data_tick, name="refresh")
        if self.anim_hz > 0:
            self.set_interval(1.0 / self.anim_hz, self.animate_tick, name="animate")

    def on_unmount(self) -> None:
        if self._updater is not None:
            self._updater.cancel()
            self._updater.join(timeout=5)

    # ----------------------------------------------------------------- refresh

    def animate_tick(self) -> None:
        """One animation frame: move the packets (no model access)."""
        now = self._clock()
        dt, self._last_anim = now - self._last_anim, now
        if not self.frozen:
            self._flow.advance(min(dt, 0.5))

    def data_tick(self) -> None:
        """The data clock: ask the update thread for a snapshot (the tables only
        every `table_every`-th time); it arrives as `SnapshotFetched`."""
        every = self.table_every
        if self.snapshot is not None and self.snapshot.info.nranks > MAX_RANK_ROWS:
            # Past 128 ranks the tables' text changes on most rows every tick: once a
            # second is as fast as it can be read, and it leaves the UI thread to the
            # flow view's animation (bench/render.py: 12 -> ~18 frames/s at 1,024 ranks).
            every *= 2
        tables = self.ticks % every == 0
        self.ticks += 1
        if self._updater is not None:
            self._updater.schedule_update(tables)

    def _fetch(self, force: bool = False) -> Fetched:
        # a replay's end is a point to seek from, not a job to sum up
        query = ViewQuery(self.focus_rank, self.frozen and not force, self.simulate,
                          None if self.replay else self._summary_events)
        return self.feed.fetch(query, self.hosts)

    def on_snapshot_fetched(self, message: SnapshotFetched) -> None:
        try:
            self._draw(message.fetched, message.number, message.tables)
        finally:
            if self._updater is not None:
                self._updater.drawn()

    def refresh_view(self, tables: bool = True, force: bool = False) -> None:
        """Advance the feed, snapshot the model and draw it now, on this thread (after
        a key press; `force`: even while the view is frozen)."""
        self.ticks += 1
        number = next(self._numbers)
        self._draw(self._fetch(force), number, tables)

    def _draw(self, fetched: Fetched, number: int, tables: bool) -> None:
        if number < self._drawn:
            return  # taken before the one on screen
        self._drawn = number
        self.lock_wait_s, self.lock_hold_s = fetched.lock_wait_s, fetched.lock_hold_s
        if self.replay is not None:
            self._timeline.show(self.replay.timeline, fetched.now)
        snap = fetched.snap
        if snap is None:
            self._update_status(fetched.status, fetched.info, fetched.now)
            return
        tables = tables or self._force_tables or self.snapshot is None
        self._force_tables = False
        self.snapshot = snap
        if snap.simulated:
            self.title = f"{self._base_title} · {self.topology.host} simulated"
        self._show(snap, tables)
        self._show_summary(snap)
        self._update_status(fetched.status, fetched.info, fetched.now)

    def _show(self, snap: Snapshot, tables: bool = True) -> None:
        empty = snap.info.nranks == 0
        self._empty.display = empty
        self._body.display = not empty
        focus = snap.focus
        self._flow.update_data(snap.flow, focus)
        self._flow.border_title = "Flow" + (f" · rank {focus}" if focus is not None else "")
        self._tp.update_series(snap.tp_total, snap.tp_rate, focus, snap.tp_focus, snap.tp_focus_rate)
        self._alerts.snapshot = snap
        if tables:
            self._ranks.snapshot = snap
            self._ops.snapshot = snap
            self._links.snapshot = snap

    def _show_summary(self, snap: Snapshot) -> None:
        """A live job that has ended: its summary in place of the flow view (a new
        job's hello brings the flow back). Replay keeps the flow: its end is a point
        to seek from."""
        ended = self.replay is None and snap.ended
        if ended != self.ended:
            self.ended, self.show_flow = ended, False
            if not ended:
                self._summary_events = -1  # a new job: its own summary when it ends
            self.refresh_bindings()
        if ended and snap.summary is not None:
            self._summary_events = snap.info.events
            self._summary_text.update(summary_renderable(snap.summary))
        on = self.ended and not self.show_flow
        self._summary.display = on
        self._flow.display = self._under.display = not on
        self._body.set_class(on, "-summary")  # the links panel has nothing to say now

    def _update_status(self, feed_status: str, info: ModelInfo, now: int) -> None:
        t = Text(feed_status, style="bold")
        t.append("\n")
        if info.world_size:
            t.append(f"world {info.world_size}", style="bold")
            t.append(f" · {info.backend or '?'}")
            if info.job:
                t.append(f" · job {short_job(info.job)}")
        else:
            t.append("no job yet", style="dim")
        t.append(f" · {format_count(info.events)} events")
        rate = self._event_rate(self._clock(), info.events)
        if rate is not None:
            t.append(f" ({format_count(int(rate))}/s)")
        if info.start is not None:
            t.append(f" · elapsed {format_seconds(max(0, now - info.start) / 1e9)}")
        if self.focus_rank is not None:
            t.append(f" · focus rank {self.focus_rank}", style="bold")
        if self.ended:
            t.append(" · job ended", style="bold")
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
            payload = self._alerts.payloads.get(event.row_key.value)
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

    def watch_focus_rank(self, rank: int | None) -> None:
        self._force_tables = True
        self._ranks.focus_row(rank)
        self.refresh_view(force=True)  # shown even while the view is paused

    def action_focus_rank(self) -> None:
        """Focus the rank under the Ranks table's cursor (again: back to all ranks)."""
        rank = self._ranks.rank_under_cursor()
        if rank is not None:
            self.set_focus_rank(None if rank == self.focus_rank else rank)

    def action_unfocus(self) -> None:
        self.set_focus_rank(None)

    def action_toggle_links(self) -> None:
        self.screen.toggle_class("-show-links")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.REPLAY_ACTIONS:
            return self.replay is not None
        if action == "toggle_summary":
            return self.ended
        return True

    def action_toggle_summary(self) -> None:
        """Once the job has ended: its summary, or the flow view as it was left."""
        self.show_flow = not self.show_flow
        self._force_tables = True
        self.refresh_view()

    def action_freeze(self) -> None:
        self.frozen = not self.frozen

    def watch_frozen(self, frozen: bool) -> None:
        self.sub_title = "view paused: p to resume" if frozen else ""
        if frozen:
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

    def action_step_back(self) -> None:
        self._replay_then_refresh(lambda rp: rp.step_back())

    def action_seek_tick(self, forward: int) -> None:
        self._replay_then_refresh(lambda rp: rp.seek_tick(bool(forward)))

    def on_timeline_bar_seek(self, message: TimelineBar.Seek) -> None:
        self._replay_then_refresh(lambda rp: rp.seek(message.fraction))

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
