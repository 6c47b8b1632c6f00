"""The one queue between the wire and the model, sized in bytes across all peers.

The reader thread decodes and validates frames and never waits for the model's lock:
it puts good batches here, and one ingest thread hands them to the model in order.
When the model falls behind by more than `max_bytes`, new frames are shed (and the
reader counts them per peer) instead of piling up, so a flood of valid frames costs
bounded memory however many peers send it; and while it is `full` the reader reads
only now and then (server.FULL_PAUSE_S), so most of such a flood waits at its senders
instead of being read only to be shed."""

from __future__ import annotations

import collections
import threading
from typing import Callable

# A decoded event costs about this much memory (msgspec Structs and their fields),
# measured on a batch of 4,096 ops: ~260 bytes each, against ~35 on the wire.
EVENT_BYTES = 256
WIRE_BYTES = 48  # an op's start or end on the wire is 30-45 bytes: a frame holds at least len/48 events
FULL_ROOM = 64 * 1024  # less room than this: `full` (a frame of 128 ops costs ~40 KB queued)


def cost(payload: bytes, n_events: int) -> int:
    return len(payload) + EVENT_BYTES * n_events


class Inbox:
    def __init__(self, max_bytes: int, deliver: Callable, on_error: Callable[[str, str], None]) -> None:
        self.max_bytes = max_bytes
        self._deliver = deliver
        self._on_error = on_error
        self._q: collections.deque = collections.deque()
        # Each counter has one writer (reader thread: _in; ingest thread: _out), so
        # neither needs a lock; what is queued is their difference.
        self._in = 0
        self._out = 0
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="commviz-ingest", daemon=True)

    def full_for(self, payload: bytes) -> bool:
        """Whether a frame would be turned away now, by the cost its size suggests
        (WIRE_BYTES an event): the reader asks before it decodes one, so a flood the
        model cannot take costs it no decoding (that decoding took the core the model
        needed to catch up). A frame that would have just fit may go with the rest."""
        return self._no_room(cost(payload, len(payload) // WIRE_BYTES))

    def full(self) -> bool:
        """Whether the queue has no room left for a frame of the usual size (FULL_ROOM)."""
        return self._no_room(FULL_ROOM)

    def _no_room(self, size: int) -> bool:
        """Whether `size` more bytes would not fit. An empty queue takes any frame;
        the frame being ingested counts until it is done."""
        queued = self._in - self._out
        return bool(queued) and queued + size > self.max_bytes

    def put(self, item: tuple, size: int) -> bool:
        """Queue one decoded frame; False (and nothing kept) when it would not fit."""
        if self._no_room(size):
            return False
        self._q.append((item, size))
        self._in += size
        self._ready.set()
        return True

    def _run(self) -> None:
        q = self._q
        while True:
            if not q:
                if self._stop.is_set():
                    return
                self._ready.wait(0.1)
                self._ready.clear()
                continue
            item, size = q.popleft()
            try:
                self._deliver(*item)
            except Exception as exc:  # a bug in a consumer must not kill the watcher
                self._on_error("watcher", f"internal error: {type(exc).__name__}: {exc}")
            finally:
                self._out += size

    def start(self) -> None:
        self.thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Hand over what is queued (the last frames of a job), then stop."""
        self._stop.set()
        self._ready.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
