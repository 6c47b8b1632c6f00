"""What a dashboard asks of a feed each tick, and the feeds that answer from a model
of their own.

A dashboard draws from one of four feeds: the live one (`watcher.LiveFeed`, in a
collector or a test), a collector in another process (`viewlink.RemoteFeed`,
`commands._collector.SpawnedFeed`), a recorded trace (`tui.feed.ReplayFeed`) and
attach's rounds (`attach.feed.AttachFeed`). They answer the same methods
(`tui.feed.Feed`): `fetch(query, hosts)` for one tick's `Fetched`, `status()`,
`note_stop(...)`, `close()`, and `replay`, the replay's controls or None; where a
feed has nothing to do, the method does nothing. So the app never asks which one it
has. `ModelFeed` is what the three that hold a model here share.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode

from commviz.model.state import Model
from commviz.view.snapshot import Fetched, Hosts, OneTopology, model_info, take_snapshot


@dataclass(frozen=True)
class ViewQuery:
    """What a view asks of each tick: the part of a snapshot's arguments that belongs
    to the view, not to where the model is (a remote view sends it in its URL)."""

    focus: int | None = None
    frozen: bool = False  # only the headline: the view is paused
    simulate: bool = False  # CPU ranks on the topology's GPUs (the user chose the topology)
    summary_unless: int | None = -1  # see `take_snapshot`; None: never a summary (a replay)

    def encode(self) -> str:
        q = {"frozen": int(self.frozen), "simulate": int(self.simulate)}
        if self.focus is not None:
            q["focus"] = self.focus
        if self.summary_unless is not None:
            q["summary_unless"] = self.summary_unless
        return urlencode(q)

    @classmethod
    def decode(cls, query: str) -> ViewQuery:
        q = {k: v[0] for k, v in parse_qs(query).items()}

        def num(key: str) -> int | None:
            v = q.get(key)
            return int(v) if v is not None and v.lstrip("-").isdigit() else None

        return cls(focus=num("focus"), frozen=q.get("frozen") == "1", simulate=q.get("simulate") == "1",
                   summary_unless=num("summary_unless"))


class ModelFeed:
    """A feed whose model is in this process: `fetch` takes the snapshot under
    `lock` (a plain lock: taking it does nothing else). A subclass sets `model` and
    `lock`, says its `status`, and overrides what it has something to do for:
    `fetch` to bring the model up to date first (a replay moves to the clock, a live
    feed puts in the frames that have waited long enough), `drain` (everything that
    has arrived, into the model now), `procs`, `note_stop`, `close`.

    The collector's other readers take the same lock: `/summary` (after `drain`, so
    a script sees every frame that arrived), `/metrics`, `/view` (through `fetch`)."""

    model: Model
    lock: threading.Lock
    replay = None  # the replay's controls: only `tui.feed.ReplayFeed` has them

    def now_ns(self) -> int:
        """The clock the view uses: wall ns live, trace wall ns in replay."""
        return time.time_ns()

    def status(self) -> str:
        """One line: where it listens / which file, counts, errors."""
        raise NotImplementedError

    def drain(self) -> None:
        """Everything that has arrived, into the model now (a live feed queues frames)."""

    def ingest_counts(self):
        """How far behind the wire a live feed is and what it sheds
        (`view.ingest.IngestCounts`); None for a feed that reads no wire."""
        return None

    def procs(self) -> dict[int, tuple[float, int]]:
        """rank -> (cpu %, rss bytes) of rank processes this feed can see (the ranks table)."""
        return {}

    def note_stop(self, by: str, reason: str = "", after_s: float = 0.0) -> None:
        """Before the job is signalled: say in the model (and trace) who stopped it."""

    def close(self) -> None:
        pass

    def fetch(self, query: ViewQuery, hosts: Hosts | None = None) -> Fetched:
        """One tick's reading: the snapshot under the lock (frozen: only the headline
        numbers, for the status line). `hosts`: which topology each host's ranks sit
        on (`take_snapshot`); none: no topology."""
        now = self.now_ns()
        t0 = time.perf_counter()
        with self.lock:
            t1 = time.perf_counter()
            snap = None if query.frozen else take_snapshot(
                self.model, now, query.focus, simulate=query.simulate, summary_unless=query.summary_unless,
                hosts=hosts if hosts is not None else OneTopology(None))
            info = model_info(self.model) if snap is None else snap.info
        t2 = time.perf_counter()
        if snap is not None:
            snap.procs = self.procs()
        return Fetched(now, self.status(), info, snap, t1 - t0, t2 - t1)
