"""What the dashboard reads from: one interface for every feed, and the replay's.

Pure of Textual so replay logic is unit-testable without a terminal. The app only
calls `Feed.fetch` (from its update thread, and after a key press from the UI
thread) and, where `replay` is not None, the replay's controls (from the UI thread,
so `ReplayFeed` serialises them). A replay feeds the model in the one order of
`model.merge` and, once its last event is in, applies the model's end-of-trace
rule, as `summary` does.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from typing import Callable, Protocol, runtime_checkable

from commviz.events import Batch, Event, OpEnd, OpStart
from commviz.model.merge import order_events  # noqa: F401  (tests read it here)
from commviz.model import ledger
from commviz.model.columns import no_gc
from commviz.model.state import Model
from commviz.model.timeline import Timeline, mark_timeline
from commviz.trace import seek
from commviz.trace.seek import MemoryTrace, SeekIndex, StreamTrace
from commviz.trace.stream import TraceStream
from commviz.tui.fmt import format_seconds
from commviz.view.feed import ModelFeed, ViewQuery
from commviz.view.snapshot import Fetched, Hosts

MIN_SPEED = 1 / 1024  # a 10 ms trace still gets about 10 s
MAX_SPEED = 16.0
PACE_S = 10.0  # a shorter trace plays slowed down to last about this long
SEEK_READ_S = 2.0  # the longest a seek reads on from a checkpoint before it stops short


def paced_speed(span_ns: int, pace_s: float = PACE_S) -> float:
    """The default speed: 1× for a trace of `pace_s` or more, slower for a shorter one
    so that it lasts about `pace_s` (a 0.4 s trace at 0.04×) and the eye can follow."""
    span_s = span_ns / 1e9
    if span_s <= 0 or span_s >= pace_s:
        return 1.0
    return max(MIN_SPEED, span_s / pace_s)


@runtime_checkable
class Feed(Protocol):
    """What every feed answers (view/feed.py lists them), so the app draws any of
    them the same way and never asks which one it has."""

    def fetch(self, query: ViewQuery, hosts: Hosts | None = None) -> Fetched:
        """One data tick's reading. `hosts`: which topology each host's ranks sit on,
        as this dashboard knows them (a remote collector places ranks with its own)."""
        ...

    def status(self) -> str:
        """One line: where it listens / which file, counts, errors."""
        ...

    def note_stop(self, by: str, reason: str = "", after_s: float = 0.0) -> None:
        """The dashboard is about to signal the job it launched: mark who stopped it."""
        ...

    def close(self) -> None:
        ...

    @property
    def replay(self) -> ReplayFeed | None:
        """The replay's controls (pause, step, seek, speed, the timeline); None for
        every feed that is not a recorded trace."""
        ...


class ReplayFeed(ModelFeed):
    """Replays a recorded trace into its own Model, at a speed, with pause/step/seek.

    The replay position (`now_ns()`, trace wall-clock ns) moves only in `advance()`,
    by the time that passed on `clock` (seconds, monotonic) times the speed, and every
    event whose trace time is at or before the position is then in the model: the model
    is always exactly the trace's state at `now_ns()`. The position stops at the last
    event's time (`done`). `speed=None` paces the trace (`paced_speed`). `timeline`
    holds the trace's marks and where its diagnoses began, for the timeline bar.

    `source` is a list of batches, or a trace opened for streaming
    (`trace.stream.TraceStream`): that one is never held whole. Its events are read as
    the position reaches them, and a seek restores the nearest checkpoint of the
    `trace.seek.SeekIndex` running beside (its end and event count are estimates until
    that index has read the whole trace).
    """

    def __init__(
        self,
        source: list[Batch] | TraceStream,
        clock: Callable[[], float] = time.monotonic,
        *,
        speed: float | None = 1.0,
        paused: bool = False,
        name: str = "trace",
        model: Model | None = None,
        cut_off: bool = False,
        snapshot: bool = False,
        index_process: bool | None = None,
    ) -> None:
        self.lock = threading.Lock()
        # The app's update thread advances the feed while key presses pause, step and
        # seek it from the UI thread: the position and the clock anchor change together.
        self._control = threading.RLock()
        self.model = model if model is not None else Model()
        self.name = name
        self._clock = clock
        self._trace = MemoryTrace(source) if isinstance(source, list) else StreamTrace(source)
        self.start_ns, self.end_ns = self._trace.start, self._trace.end
        self._open(None)
        self._pos = self.start_ns
        self.paced_speed = paced_speed(self.end_ns - self.start_ns)
        self._speed = self.paced_speed if speed is None else min(MAX_SPEED, max(MIN_SPEED, float(speed)))
        self._paused = paused
        self._anchor: float | None = None  # set by the first advance: the dashboard's start-up is not playback
        self._cut_off = cut_off  # the file ended mid-frame: said at the end of the trace
        self._snapshot = snapshot  # torch's dumps of a running job: its ranks are not gone at the end
        self._ended = False  # the model has been told the trace is over
        self._seek_note = ""  # a seek that stopped short says so here
        # The marks (a trace in memory: at once) and where the diagnoses began, from the
        # index's pass over the whole trace, on a thread or a process, so that a big
        # trace does not keep the dashboard from opening. `timeline_done` is set when
        # they are in.
        if isinstance(self._trace, MemoryTrace):
            self.timeline: Timeline = mark_timeline(self._trace.events)
        else:
            self.timeline = Timeline(self.start_ns, self.end_ns)
        self.timeline_done = threading.Event()
        try:
            template = pickle.dumps(self.model)
        except Exception:  # a model with callbacks: no index, a seek reads from the start
            template = None
        self.index = None if template is None else SeekIndex(self._trace, template, cut_off,
                                                             process=index_process)
        threading.Thread(target=self._await_index, name="commviz-timeline", daemon=True).start()

    # ----------------------------------------------------------------- Feed

    @property
    def replay(self) -> ReplayFeed:
        return self

    def now_ns(self) -> int:
        return self._pos

    def advance(self) -> None:
        """Move the position by the time that passed on the clock (unless paused) and
        put every event up to it into the model."""
        with self._control:
            self._sync()
            if not self._paused:
                self._apply_until(self._pos)

    def fetch(self, query: ViewQuery, hosts: Hosts | None = None) -> Fetched:
        """The model at the position the clock has reached (`advance`), read."""
        self.advance()
        return super().fetch(query, hosts)

    def status(self) -> str:
        if self.done:
            state = "■ end"
        elif self._paused:
            state = "⏸ paused"
        else:
            state = "▶ playing"
        speed = f"{self._speed:.3g}×"
        if self._speed == self.paced_speed != 1.0:
            speed += f" (a {format_seconds((self.end_ns - self.start_ns) / 1e9)} trace in ~{PACE_S:g} s)"
        total = self.total
        counted = f"{self._i}/{total} events" if total is not None else f"{self._i} events"
        s = f"replay {self.name} · {state} {speed} · {self.fraction:.0%} · {counted}"
        idx = self.index
        if idx is not None and idx.state.error:
            s += f" · no seek index ({idx.state.error}): a long seek stops short"
        elif idx is not None and not idx.done.is_set():
            s += f" · indexing {idx.state.fraction:.0%}"
        if self._seek_note:
            s += f" · {self._seek_note}"
        if self.model.decode_errors:
            s += f" · {self.model.decode_errors} unreadable: {self.model.last_decode_error}"
        return s

    def close(self) -> None:
        """Stops the index and removes its files (also done when the feed is collected)."""
        if self.index is not None:
            self.index.close()

    # ------------------------------------------------------------- controls

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def done(self) -> bool:
        return self._next is None

    @property
    def position(self) -> int:
        """Index of the next event to apply (== number of events applied)."""
        return self._i

    @property
    def total(self) -> int | None:
        """Events in the trace; None while a streamed trace's index has not counted them."""
        if self._trace.total is not None:
            return self._trace.total
        return self.index.state.total if self.index is not None else None

    @property
    def fraction(self) -> float:
        span = self.end_ns - self.start_ns
        if span <= 0:
            return 1.0 if self.done else 0.0
        return min(1.0, max(0.0, (self._pos - self.start_ns) / span))

    def set_speed(self, speed: float) -> None:
        with self._control:
            self._sync()
            self._speed = min(MAX_SPEED, max(MIN_SPEED, float(speed)))

    def faster(self) -> None:
        self.set_speed(self._speed * 2)

    def slower(self) -> None:
        self.set_speed(self._speed / 2)

    def pause(self) -> None:
        with self._control:
            if self._paused:
                return
            self._sync()
            self._apply_until(self._pos)  # the model is exactly the trace at the position
            self._paused = True

    def resume(self) -> None:
        with self._control:
            if not self._paused:
                return
            self._sync()
            self._paused = False

    def toggle_pause(self) -> None:
        if self._paused:
            self.resume()
        else:
            self.pause()

    def step(self) -> Event | None:
        """Pause, then apply events up to and including the next OpStart/OpEnd (the
        Hello/GroupDef/… before it come along). Returns that op event, or None at the end."""
        with self._control:
            self.pause()
            self._seek_note = ""
            with self.lock:
                while self._next is not None:
                    t, rank, ev = self._next
                    self._take_one()
                    if t > self._pos:
                        self._pos = t
                    self._end_of_trace()
                    if type(ev) in _OPS:
                        return ev
        return None

    def step_back(self) -> Event | None:
        """Pause, then undo the newest op event applied (the model is rebuilt up to just
        before it; the position moves to the event before it). Returns the op event
        undone, or None at the start."""
        with self._control:
            self.pause()
            j = self._last_op
            if j < 0:
                return None
            with self.lock:
                self._goto(n_max=j)
                self._pos = self._last_t if j > 0 else self.start_ns
                return self._next[2] if self._next is not None else None

    def seek(self, fraction: float) -> None:
        """The model as it was at `fraction` (0..1) of the trace's time."""
        fraction = min(1.0, max(0.0, float(fraction)))
        self.seek_time(self.start_ns + round(fraction * (self.end_ns - self.start_ns)))

    def seek_time(self, t: int) -> None:
        """The model as it was at trace time `t` (clamped to the trace): every event at
        or before it in, from the nearest checkpoint before it (or the start)."""
        target = min(self.end_ns, max(self.start_ns, int(t)))
        with self._control, self.lock:
            self._anchor = self._clock()
            self._goto(t_max=target)
            self._pos = target if not self._seek_note else self._last_t

    def seek_tick(self, forward: bool) -> None:
        """Jump to the next (or previous) mark or diagnosis on the timeline; none: the
        end (or the start) of the trace."""
        if forward:
            tick = self.timeline.next_tick(self._pos)
            self.seek_time(tick.t if tick else self.end_ns)
        else:
            tick = self.timeline.previous_tick(self._pos)
            self.seek_time(tick.t if tick else self.start_ns)

    def seek_by(self, delta: float) -> None:
        self.seek(self.fraction + delta)

    # ------------------------------------------------------------- internals

    def _open(self, checkpoint) -> None:
        """Read from the start, or from `checkpoint`'s place (the model is the caller's)."""
        if checkpoint is None:
            cursor = self._trace.cursor()
            self._i, self._last_op, self._last_t = 0, -1, self.start_ns
        else:
            self.model.reset()  # its memory back before the checkpoint's model comes in
            model, state = seek.load(checkpoint)
            ledger.restore(self.model, model)  # the same object: views hold it
            cursor = self._trace.cursor(state)
            self._i, self._last_op, self._last_t = checkpoint.n, checkpoint.last_op, checkpoint.t
        self._it = iter(cursor)
        self._next = next(self._it, None)

    def _sync(self) -> None:
        """Move the position by the clock time since the last sync (if playing)."""
        now = self._clock()
        if not self._paused and self._anchor is not None:
            self._pos += round((now - self._anchor) * 1e9 * self._speed)
            if self._pos > self.end_ns:
                nxt = self._next
                if nxt is not None and nxt[0] > self.end_ns:  # the end was an estimate, too early: run on
                    self.end_ns = self.timeline.end = self._pos
                else:
                    self._pos = self.end_ns
        self._anchor = now

    def _await_index(self) -> None:
        """The index's findings onto the timeline: a streamed trace's marks as the pass
        reaches them, its end once known, the diagnoses at the end."""
        idx = self.index
        if idx is not None:
            streamed = not isinstance(self._trace, MemoryTrace)  # (in memory: the marks are in already)
            shown = 0
            while not idx.done.wait(0.5):
                if streamed:
                    shown = self._more_marks(idx, shown)
            st = idx.state
            if streamed:
                if st.end is not None:
                    with self._control:
                        self.end_ns = self.timeline.end = max(st.end, self.start_ns)
                self._more_marks(idx, shown)
            self.timeline.add(st.diagnoses or [])
        self.timeline_done.set()

    def _more_marks(self, idx, shown: int) -> int:
        marks = idx.state.marks
        if len(marks) > shown:
            self.timeline.add(marks[shown:])
        return len(marks)

    def _goto(self, n_max: int | None = None, t_max: int | None = None) -> None:
        """The model with the first events of the trace: the first `n_max`, or all
        those at or before `t_max` (call with the lock held). It starts from the state
        it is in, a checkpoint or the start, whichever is latest and not past the target."""
        with no_gc():
            self._goto_here(n_max, t_max)

    def _goto_here(self, n_max: int | None, t_max: int | None) -> None:
        here_ok = (n_max is None or self._i <= n_max) and (t_max is None or self._i == 0 or self._last_t <= t_max)
        if self._ended and not (here_ok and self._next is None):
            here_ok = False
        ck = self.index.best(n_max, t_max) if self.index is not None else None
        if not here_ok or (ck is not None and ck.n > self._i):
            if ck is not None:
                try:
                    self._open(ck)
                except Exception as exc:  # its file went away: from the start, and said
                    self.index.state.error = f"checkpoint {os.path.basename(ck.file)} unreadable: {exc}"
                    ck = None
            if ck is None:
                self.model.reset()
                self._open(None)
            self._ended = False
        self._read_on(n_max, t_max)
        self._end_of_trace()

    def _read_on(self, n_max: int | None, t_max: int | None) -> None:
        """Apply events up to the target: the merge's chunks that lie whole before it in
        bulk, the rest many at a time (`Model.ingest`). While
        the index is still being built, a seek by time that would read on for more
        than `SEEK_READ_S` (its target past what the index has reached) stops early, at
        a time no event is left half-applied, and says so in the status line."""
        ranks: list[int] = []
        evs: list = []
        nxt, it, i, last_op, last_t = self._next, self._it, self._i, self._last_op, self._last_t
        # with the index done, a seek reads on at most ~1/32 of the trace: let it finish
        idx = self.index
        indexing = idx is None or not idx.done.is_set() or bool(idx.state.error)
        deadline = time.monotonic() + SEEK_READ_S if t_max is not None and indexing else None
        self._seek_note = ""
        if nxt is not None and hasattr(it, "take_chunks"):
            it.unread()  # whole chunks first, in bulk (`Model.ingest`); the rest one by one
            for part in it.take_chunks(t_max if t_max is not None else float("inf"),
                                       None if n_max is None else n_max - i):
                self.model.ingest(part)
                last_op = seek.last_op(part, i, last_op)
                i += len(part)
                last_t = int(part.times[-1])
                if deadline is not None and time.monotonic() > deadline:
                    break
            nxt = next(it, None)
        while nxt is not None and (n_max is None or i < n_max) and (t_max is None or nxt[0] <= t_max):
            t, r, ev = nxt
            if type(ev) in _OPS:
                last_op = i
            ranks.append(r)
            evs.append(ev)
            i += 1
            last_t = t
            if len(evs) >= 65_536:
                self.model.ingest(ranks, evs)
                ranks, evs = [], []
            nxt = next(it, None)
            if deadline is not None and not i & 4095 and time.monotonic() > deadline:
                while nxt is not None and nxt[0] == last_t and nxt[0] <= t_max:  # the rest of this instant
                    ranks.append(nxt[1])
                    evs.append(nxt[2])
                    if type(nxt[2]) in _OPS:
                        last_op = i
                    i += 1
                    nxt = next(it, None)
                if nxt is not None and nxt[0] <= t_max:
                    done = self.index.state.fraction if self.index is not None else 0.0
                    self._seek_note = (f"the seek stopped short (the index has read {done:.0%} of the trace; "
                                       "seek again once it is done)")
                break
        if evs:
            self.model.ingest(ranks, evs)
        self._next, self._i, self._last_op, self._last_t = nxt, i, last_op, last_t

    def _take_one(self) -> None:
        t, rank, ev = self._next
        self.model.ingest(rank, ev)
        if type(ev) in _OPS:
            self._last_op = self._i
        self._i += 1
        self._last_t = t
        self._next = next(self._it, None)

    def _apply_until(self, t: int) -> None:
        if self._next is not None and self._next[0] <= t:
            with self.lock:
                self._apply_locked(t)

    def _apply_locked(self, t: int) -> None:
        nxt, it, model, i, last_op, last_t = self._next, self._it, self.model, self._i, self._last_op, self._last_t
        while nxt is not None and nxt[0] <= t:
            tt, rank, ev = nxt
            model.ingest(rank, ev)
            if type(ev) in _OPS:
                last_op = i
            i += 1
            last_t = tt
            nxt = next(it, None)
        self._next, self._i, self._last_op, self._last_t = nxt, i, last_op, last_t
        self._end_of_trace()

    def _end_of_trace(self) -> None:
        """Once the last event is in, the model applies the end-of-trace rule that
        `summary` applies (ranks without a goodbye are gone), so both say the same."""
        if self.done and not self._ended:
            self._ended = True
            self.model.end_of_trace(self._cut_off, self._snapshot)


_OPS = (OpStart, OpEnd)
