"""Timing async ops to completion without the caller having to call wait().

Three ways, picked per (backend, op) on first use:
- future: the Work has a future (gloo collectives); a done-callback stamps the end.
- waiter: gloo point-to-point Work has no future and its is_completed() stays False
  until someone waits. A waiter thread calls the original C++ wait() (which releases
  the GIL); because a second C++ wait() on gloo p2p work blocks until timeout and
  breaks the pair, `Work.wait` is patched so a user's wait() on a tracked Work waits
  for the waiter's result instead of calling into C++ again.
- poll: CUDA work (NCCL) is polled with is_completed() / cuda Event.query() on the
  sender thread; never a device synchronization.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from datetime import timedelta

from commviz.probe import transparent

MAX_WAITERS = 32
WAITER_IDLE_S = 5.0
EXIT_STALL_S = 1.0  # at exit, give up on outstanding completions once none has come this long


class Outstanding:
    """Completions commviz left on threads torch owns: a done-callback on a gloo
    future, a waiter thread inside a C++ wait(). Either takes the GIL when it runs. If
    that happens once the interpreter is finalizing, CPython ends the thread with
    pthread_exit, and the unwind through torch's noexcept C++ frames aborts the process
    ("terminate called without an active exception"). A job that exits with async ops in
    flight exits cleanly without commviz. So exit waits for these to settle first.

    A set, because add and discard are atomic under the GIL and cost ~40 ns. A counter
    would need a lock on the op's path."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def begin(self, op_id: int) -> None:
        """Before the callback is attached: one attached to a done future runs at once."""
        self.ids.add(op_id)

    def end(self, op_id: int) -> None:
        self.ids.discard(op_id)

    def settle(self, stall_s: float = EXIT_STALL_S, clock=time.monotonic, sleep=time.sleep) -> int:
        """Wait, letting go of the GIL, while completions keep coming; return how many
        are left. Plain torch's exit also waits for queued gloo work (its destructor
        drains the queue), so this waits as long as work progresses and gives up only
        on a stall: an op that never completes (a dead peer, an unmatched recv)."""
        left = len(self.ids)
        deadline = clock() + stall_s
        while left and clock() < deadline:
            sleep(0.002)
            now_left = len(self.ids)
            if now_left < left:
                left, deadline = now_left, clock() + stall_s
        return len(self.ids)


class _Tracked:
    __slots__ = ("event", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None


class Waiters:
    """Waits for gloo p2p works on helper threads and makes user wait() safe."""

    def __init__(self, on_done) -> None:
        self.on_done = on_done  # (op_id, t_ns, error_str) -> None
        self.tracked: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0
        self._orig_wait = None

    def install(self, work_cls) -> None:
        """Patch `work_cls.wait` once; untracked works go straight to the original."""
        if getattr(work_cls.wait, "_commviz_original", None) is not None:
            self._orig_wait = work_cls.wait._commviz_original
            return
        orig = work_cls.wait
        tracked = self.tracked

        def wait(self, *args, **kwargs):
            t = tracked.get(self)
            if t is None:
                return orig(self, *args, **kwargs)
            timeout = args[0] if args else kwargs.get("timeout")
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else None
            if not t.event.wait(secs if secs else None):
                raise RuntimeError(f"Work wait timed out after {timeout}")
            if t.error is not None:
                raise t.error
            return True

        transparent.mark_method(wait, orig)
        work_cls.wait = wait
        self._orig_wait = orig

    def track(self, op_id: int, work) -> None:
        t = _Tracked()
        self.tracked[work] = t
        self._q.put((op_id, work, t))
        with self._lock:
            self._queued += 1
            # One thread per outstanding work (up to a cap), so a late send does
            # not delay stamping an early recv.
            if self._queued > self._idle and self._threads < MAX_WAITERS:
                self._threads += 1
                threading.Thread(target=self._loop, name="commviz-waiter", daemon=True).start()

    def _loop(self) -> None:
        orig = self._orig_wait
        while True:
            with self._lock:
                self._idle += 1
            try:
                op_id, work, t = self._q.get(timeout=WAITER_IDLE_S)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._queued == 0:
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            err = ""
            try:
                orig(work)
            except BaseException as exc:  # the user sees it from their own wait()
                t.error = exc
                err = f"{type(exc).__name__}: {exc}"
            self.on_done(op_id, time.monotonic_ns(), err)
            t.event.set()
            del work
