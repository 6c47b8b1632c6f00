"""What the dashboard reads from: a model, the lock that guards it and a clock.

Pure of Textual so replay logic is unit-testable without a terminal. The live feed
(transport → model) and the replay feed (trace file → model) both satisfy `Feed`; the
app only ever calls `advance()`, takes `lock` to copy a snapshot, and asks `now_ns()`
(from its update thread; replay controls come from the UI thread, so `ReplayFeed`
serialises them). A replay feeds the model in the one order of `model.clock` and,
once its last event is in, applies the model's end-of-trace rule, as `summary` does.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Callable, Protocol, runtime_checkable

from commviz.events import Batch, Event, OpEnd, OpStart
from commviz.model.clock import order_events
from commviz.model.state import Model
from commviz.model.timeline import Timeline, diagnosis_ticks, mark_timeline
from commviz.tui.fmt import format_seconds

MIN_SPEED = 1 / 1024  # a 10 ms trace still gets about 10 s
MAX_SPEED = 16.0
PACE_S = 10.0  # a shorter trace plays slowed down to last about this long


def paced_speed(span_ns: int, pace_s: float = PACE_S) -> float:
    """The default speed: 1× for a trace of `pace_s` or more, slower for a shorter one
    so that it lasts about `pace_s` (a 0.4 s trace at 0.04×) and the eye can follow."""
    span_s = span_ns / 1e9
    if span_s <= 0 or span_s >= pace_s:
        return 1.0
    return max(MIN_SPEED, span_s / pace_s)


@runtime_checkable
class Feed(Protocol):
    lock: threading.Lock  # guards model; hold it only while copying a snapshot
    model: Model

    def now_ns(self) -> int:
        """The clock the view uses: wall ns live, trace wall ns in replay."""
        ...

    def status(self) -> str:
        """One line: where it listens / which file, counts, errors."""
        ...

    def advance(self) -> None:
        """Called by the app on every refresh tick (replay feeds events up to now)."""
        ...


class ReplayFeed:
    """Replays a recorded trace into its own Model, at a speed, with pause/step/seek.

    The replay position (`now_ns()`, trace wall-clock ns) moves only in `advance()`,
    by the time that passed on `clock` (seconds, monotonic) times the speed, and every
    event whose trace time is at or before the position is then in the model: the model
    is always exactly the trace's state at `now_ns()`. The position stops at the last
    event's time (`done`). `speed=None` paces the trace (`paced_speed`). `timeline`
    holds the trace's marks and where its diagnoses began, for the timeline bar.
    """

    def __init__(
        self,
        batches: list[Batch],
        clock: Callable[[], float] = time.monotonic,
        *,
        speed: float | None = 1.0,
        paused: bool = False,
        name: str = "trace",
        model: Model | None = None,
        cut_off: bool = False,
        snapshot: bool = False,
    ) -> None:
        self.lock = threading.Lock()
        # The app's update thread advances the feed while key presses pause, step and
        # seek it from the UI thread: the position and the clock anchor change together.
        self._control = threading.RLock()
        self.model = model if model is not None else Model()
        self.name = name
        self._clock = clock
        self._events = order_events(batches)
        self._times = [t for t, _, _ in self._events]
        self.start_ns = self._times[0] if self._times else 0
        self.end_ns = self._times[-1] if self._times else 0
        self._i = 0
        self._pos = self.start_ns
        self.paced_speed = paced_speed(self.end_ns - self.start_ns)
        self._speed = self.paced_speed if speed is None else min(MAX_SPEED, max(MIN_SPEED, float(speed)))
        # The marks at once; the diagnoses (a model fed the whole trace) on a thread, so
        # a big trace does not keep the dashboard from opening. `timeline_done` is set
        # when they are in.
        self.timeline: Timeline = mark_timeline(self._events)
        self.timeline_done = threading.Event()
        finder = threading.Thread(target=self._find_diagnoses, args=(cut_off,), name="commviz-timeline",
                                  daemon=True)
        finder.start()
        self._paused = paused
        self._anchor: float | None = None  # set by the first advance: the dashboard's start-up is not playback
        self._cut_off = cut_off  # the file ended mid-frame: said at the end of the trace
        self._snapshot = snapshot  # torch's dumps of a running job: its ranks are not gone at the end
        self._ended = False  # the model has been told the trace is over

    # ----------------------------------------------------------------- Feed

    def now_ns(self) -> int:
        return self._pos

    def advance(self) -> None:
        with self._control:
            self._sync()
            if not self._paused:
                self._apply_until(self._pos)

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
        s = f"replay {self.name} · {state} {speed} · {self.fraction:.0%} · {self._i}/{len(self._events)} events"
        if self.model.decode_errors:
            s += f" · {self.model.decode_errors} unreadable: {self.model.last_decode_error}"
        return s

    # ------------------------------------------------------------- controls

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def done(self) -> bool:
        return self._i >= len(self._events)

    @property
    def position(self) -> int:
        """Index of the next event to apply (== number of events applied)."""
        return self._i

    @property
    def total(self) -> int:
        return len(self._events)

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
            with self.lock:
                while self._i < len(self._events):
                    t, rank, ev = self._events[self._i]
                    self.model.ingest(rank, ev)
                    self._i += 1
                    if t > self._pos:
                        self._pos = t
                    self._end_of_trace()
                    if isinstance(ev, (OpStart, OpEnd)):
                        return ev
        return None

    def step_back(self) -> Event | None:
        """Pause, then undo the newest op event applied (the model is rebuilt up to just
        before it; the position moves to the event before it). Returns the op event
        undone, or None at the start."""
        with self._control:
            self.pause()
            i = self._i - 1
            while i >= 0 and not isinstance(self._events[i][2], (OpStart, OpEnd)):
                i -= 1
            if i < 0:
                return None
            with self.lock:
                self._rebuild(i, self._times[i - 1] if i > 0 else self.start_ns)
            return self._events[i][2]

    def seek(self, fraction: float) -> None:
        """Rebuild the model from scratch up to `fraction` (0..1) of the trace's time."""
        fraction = min(1.0, max(0.0, float(fraction)))
        self.seek_time(self.start_ns + round(fraction * (self.end_ns - self.start_ns)))

    def seek_time(self, t: int) -> None:
        """Rebuild the model from scratch up to trace time `t` (clamped to the trace)."""
        target = min(self.end_ns, max(self.start_ns, int(t)))
        with self._control, self.lock:
            self._anchor = self._clock()
            self._rebuild(bisect.bisect_right(self._times, target), target)

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

    def _sync(self) -> None:
        """Move the position by the clock time since the last sync (if playing)."""
        now = self._clock()
        if not self._paused and self._anchor is not None:
            self._pos += round((now - self._anchor) * 1e9 * self._speed)
            if self._pos > self.end_ns:
                self._pos = self.end_ns
        self._anchor = now

    def _find_diagnoses(self, cut_off: bool) -> None:
        try:
            self.timeline.add(diagnosis_ticks(self._events, cut_off, self.model.thresholds))
        finally:
            self.timeline_done.set()

    def _rebuild(self, n: int, pos: int) -> None:
        """The model from scratch with the first `n` events, the position at `pos`
        (call with the lock held)."""
        self.model.reset()
        self._ended = False
        self._i = 0
        events, model = self._events, self.model
        for k in range(min(n, len(events))):
            model.ingest(events[k][1], events[k][2])
        self._i = min(n, len(events))
        self._pos = pos
        self._end_of_trace()

    def _apply_until(self, t: int) -> None:
        if self._i < len(self._events) and self._times[self._i] <= t:
            with self.lock:
                self._apply_locked(t)

    def _apply_locked(self, t: int) -> None:
        events, times, model = self._events, self._times, self.model
        i, n = self._i, len(events)
        while i < n and times[i] <= t:
            _, rank, ev = events[i]
            model.ingest(rank, ev)
            i += 1
        self._i = i
        self._end_of_trace()

    def _end_of_trace(self) -> None:
        """Once the last event is in, the model applies the end-of-trace rule that
        `summary` applies (ranks without a goodbye are gone), so both say the same."""
        if self.done and not self._ended:
            self._ended = True
            self.model.end_of_trace(self._cut_off, self._snapshot)
