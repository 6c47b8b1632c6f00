"""The dashboard's data clock, off the UI thread: a thread that, when asked, advances
the feed, takes the snapshot under the feed's lock and posts it to the app as a
`SnapshotFetched` message. The UI thread only draws what arrives, so a slow
snapshot (thousands of ranks, diagnoses) never stalls a frame or a key press.

Each request carries a number; the app drops a snapshot older than one it has
already drawn (a key press refreshes at once, on the UI thread, and a snapshot the
thread started before it must not paint over it). At most one snapshot is on its way
at a time: the next is taken once the app says it drew the last (`drawn()`), so a UI
thread that falls behind draws the newest state, not a queue of old ones.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from textual.message import Message

from commviz.view.snapshot import Fetched


class SnapshotFetched(Message):
    def __init__(self, fetched: Fetched, number: int, tables: bool) -> None:
        super().__init__()
        self.fetched = fetched
        self.number = number
        self.tables = tables


class UpdateThread(threading.Thread):
    """Runs `read()` (→ Fetched) whenever `schedule_update` asks, posts the result
    with `post(message)`. One read at a time; requests that come while one runs are
    folded into the next."""

    def __init__(self, read: Callable[[], Fetched], post: Callable[[Message], object],
                 numbers: itertools.count) -> None:
        super().__init__(name="commviz-snapshot", daemon=True)
        self._read = read
        self._post = post
        self._numbers = numbers
        self._requested = threading.Event()
        self._canceled = threading.Event()
        self._idle = threading.Event()  # the app drew the last snapshot posted
        self._idle.set()
        self._tables = False

    def run(self) -> None:
        while self._requested.wait():
            while not self._idle.wait(0.1):
                if self._canceled.is_set():
                    return
            if self._canceled.is_set():
                return
            self._requested.clear()
            tables, self._tables = self._tables, False
            number = next(self._numbers)
            fetched = self._read()
            if self._canceled.is_set():
                return
            self._idle.clear()
            self._post(SnapshotFetched(fetched, number, tables))

    def drawn(self) -> None:
        """The app has drawn (or dropped) the last snapshot: the next may be taken."""
        self._idle.set()

    def schedule_update(self, tables: bool = True) -> None:
        self._tables = self._tables or tables
        self._requested.set()

    def cancel(self) -> None:
        self._canceled.set()
        self._requested.set()
