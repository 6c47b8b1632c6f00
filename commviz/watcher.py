"""The watcher's live source: a transport server feeding one model, optionally
recording every valid frame to a trace file. The model is guarded by one plain
lock, held only to ingest a batch or copy a snapshot.

Frames wait in a queue and go into the model a batch at a time. Taking the lock
does not put them in: that is a step of its own, taken where it is wanted. The
drainer thread, a view's tick and the reader (`_on_batch`) put in what has
waited `DRAIN_S` (`drain_due`), so a 20 frames/s screen does not cut the batches to
50 ms; whoever must see every frame that has arrived (`drain`: a script's summary,
`note_stop`, the liveness checks, `close`) forces them all in first. Under the lock
alone the model is at most ~1.5 × `DRAIN_S` behind what has arrived.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from commviz.events import Batch, batch_len
from commviz.model import Model
from commviz.model.diagnosis import RankStatus
from commviz.model.overload import Overload
from commviz.model.store import EventStore, decode_frame
from commviz.trace.file import TraceWriter
from commviz.transport.server import Server
from commviz.view.feed import ModelFeed, ViewQuery
from commviz.view.ingest import IngestCounts
from commviz.view.snapshot import Fetched, Hosts

LIVENESS_EVERY_S = 0.5
# Frames wait in a queue and reach the model a batch at a time (`Model.ingest`):
# a collective is taken in bulk only when all its members' frames are in one batch.
# The model is at most this far behind what has arrived...
DRAIN_S = 0.25
# ...or this many events, whichever comes first (1: each frame goes in on arrival, its
# own batch). A batch takes a collective in bulk only if all its members' frames are
# in it: at 1,024 ranks whose frames carry 64 steps, one instance spans 131,072 events.
DRAIN_EVENTS = 200_000


class LiveFeed(ModelFeed):
    """A collector's model, fed by the transport server (and the crash rings and
    liveness checks of the ranks on this host)."""

    def __init__(self, addr: str, record_to: str | None = None, hang_after_s: float = 10.0,
                 ring_dir: str | None = None, token: str | None = None, clock=time.monotonic) -> None:
        """`clock`: what frames' waits for a drain (DRAIN_S) are measured by; tests step it."""
        self.clock = clock
        self.ring_dir = ring_dir  # crash rings of a job we launched (COMMVIZ_RING_DIR)
        self._queue: list[Batch] = []  # frames not yet in the model, in arrival order
        self._carry = EventStore.join([])  # the events a drain left for the next
        self._carried_at = 0.0  # monotonic time the newest carry was left
        self._queued = 0  # events in them
        self._queued_at = 0.0  # monotonic time the oldest arrived
        self._qlock = threading.Lock()
        self.lock = threading.Lock()  # the model's: taking it puts nothing in (`drain`, `drain_due` do)
        self.model = Model(hang_after_s=hang_after_s)
        self.overload = Overload()  # how far behind the job we are; sheds detail past a bound
        self.writer = TraceWriter(record_to) if record_to else None
        self.errors: list[str] = []
        self._unsynced = 0  # error lines the model has not counted yet
        self.host = socket.gethostname()
        self.started = time.monotonic()
        self.server = Server(addr, self._on_batch, self._on_error, token=token, decode=decode_frame)
        self.addr = self.server.addr
        self._stop = threading.Event()
        self._liveness = threading.Thread(target=self._watch_pids, name="commviz-liveness", daemon=True)
        self._drainer = threading.Thread(target=self._drain_now_and_then, name="commviz-drain", daemon=True)
        self._procs: dict = {}  # pid -> psutil.Process
        self.proc_stats: dict[int, tuple[float, int]] = {}  # rank -> (cpu %, rss bytes), this host only
        self.metrics_url: str | None = None  # where `--metrics` serves Prometheus (commands/_live.py)

    def start(self) -> "LiveFeed":
        self.server.start()
        self._liveness.start()
        self._drainer.start()
        return self

    def _on_batch(self, batch: Batch, payload: bytes) -> None:
        # Taking the model's lock per frame keeps the backpressure of before: while the
        # dashboard holds the model the reader waits, and the server sheds (and says so).
        with self.lock:
            self._drain_locked(force=False)  # the frames that have waited DRAIN_S
            with self._qlock:
                if self.writer is not None:
                    self.writer.write(payload)
                if not self._queue:
                    self._queued_at = self.clock()
                self._queue.append(batch)
                self._queued += batch_len(batch)
                due = self._queued >= DRAIN_EVENTS
            if due:
                self._drain_locked(force=False)

    def drain(self) -> None:
        """Put every frame that has arrived into the model now: for a reader that must
        see them all (a summary, the end of a job), at the cost of cutting a batch
        before its collectives are whole."""
        with self.lock:
            self._drain_locked(force=True)

    def drain_due(self) -> None:
        """Put in the frames that have waited `DRAIN_S` (or past `DRAIN_EVENTS`), and
        leave the youngest queued: what the drainer and a view do, often, without
        cutting the batch the queue is building."""
        with self.lock:
            self._drain_locked(force=False)

    def _drain_locked(self, force: bool) -> None:
        """With the model's lock held: the queued frames into the model, in one batch.
        Unless `force`d, the newest events after the point where the fewest collectives
        are half-way stay for the next batch (`columns.settle_point`), so most
        collectives reach the model whole."""
        with self._qlock:
            if not self._queue and len(self._carry) and self.clock() - self._carried_at >= DRAIN_S:
                # Nothing more has come (a frozen job, a hung one): what a drain held
                # back for the next batch goes in whole, often the very op that hangs.
                force = True
            if not (self._queue or force and len(self._carry)):
                return
            if not (force or self.clock() - self._queued_at >= DRAIN_S or self._queued >= DRAIN_EVENTS):
                return
            queue, self._queue, self._queued = self._queue, [], 0
        # (a batch without every rank still goes in bulk: the collectives whose members
        # present entered and left in it are taken whole, and left open)
        events = EventStore.join([self._carry, *queue] if len(self._carry) else queue)
        # (while shedding, an instance cut by the batch's edge is counted as it is:
        # nothing is gained by carrying the tail)
        done = self.model.ingest(events.rank, events, settle=not (force or self.model.shed))
        self._carry = events[done:]
        if done < len(events):
            self._carried_at = self.clock()
        with self._qlock:
            self._queued += len(events) - done
        # frames the inbox had no room for, and events the probes left out because this
        # watcher was not taking them (Counters.behind), leave nearly every collective
        # with a member missing: shed detail as when behind (not asked: a peer over its
        # rate, which is its own fault, and a rank's own `dropped`, which also counts
        # what it dropped with no watcher to send to)
        lost = self.server.behind_frames + self.model.behind_events
        self.model.shed = self.overload.update(time.time_ns(), self.model.last_t, lost)

    def _drain_now_and_then(self) -> None:
        while not self._stop.wait(DRAIN_S / 2):
            if self._queue or len(self._carry):
                self.drain_due()

    def _on_error(self, peer: str, message: str) -> None:
        """Called by the reader thread too, which must never wait for the model's
        lock: the line is kept here and reaches the model with the counts."""
        line = f"from {peer}: {message}"
        self.errors.append(line)
        del self.errors[:-100]
        self._unsynced += 1

    def _proc_stats(self, candidates: list[tuple[int, int]]) -> None:
        """CPU% and RSS of rank processes on this host, for the Ranks panel."""
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is a dependency
            return
        stats = {}
        for rank, pid in candidates:
            p = self._procs.get(pid)
            try:
                if p is None:
                    p = self._procs[pid] = psutil.Process(pid)
                    p.cpu_percent(None)  # the first reading only starts the interval
                with p.oneshot():
                    stats[rank] = (p.cpu_percent(None), p.memory_info().rss)
            except (psutil.Error, OSError):
                self._procs.pop(pid, None)
        self.proc_stats = stats

    def _sync_counts(self) -> None:
        """Bad frames are counted by the reader without the model's lock and described
        at most once a second per peer; the model learns the count and the last
        description here."""
        n, self._unsynced = self._unsynced, 0
        with self.lock:  # counts only: no reason to cut the batch the queue is building
            m = self.model
            if n and self.errors:
                m.note_decode_error(self.errors[-1])
            m.note_decode_errors(max(m.decode_errors + max(n - 1, 0), self.server.bad_frames))

    def _watch_pids(self) -> None:
        """A rank on this host whose process is gone without a goodbye is dead."""
        while not self._stop.wait(LIVENESS_EVERY_S):
            self._sync_counts()
            self.collect_rings()
            with self.lock:  # a hello still queued is seen on the next round
                candidates = [
                    (r.rank, r.hello.pid)
                    for r in self.model.ranks.values()
                    if r.hello is not None and r.hello.host == self.host and not r.gone
                ]
            self._proc_stats(candidates)
            for rank, pid in candidates:
                if not _pid_alive(pid):
                    recovered = self._read_ring(rank, pid)
                    with self.lock:
                        self._drain_locked(force=True)  # its goodbye may just have arrived:
                        r = self.model.ranks.get(rank)  # re-check with every frame in
                        if r is not None and r.hello is not None and r.hello.pid == pid and r.status is not RankStatus.EXITED:
                            for ev in recovered:
                                self.model.ingest(rank, ev)
                            self.model.mark_gone(rank, "process ended without a goodbye")

    def _read_ring(self, rank: int, pid: int) -> list:
        """What a dead rank started (and finished) but never sent: its crash ring."""
        with self.lock:
            r = self.model.ranks.get(rank)
            path = r.hello.ring if r is not None and r.hello is not None else ""
        got = self._recover(path) if path else None
        return got[2] if got is not None and got[0] == rank and got[1] == pid else []

    def _recover(self, path: str):
        """(rank, pid, events) from a ring file, recorded to the trace; a private ring
        (ring-<pid>.ring) is removed once read, a trace-dir one is left for summary."""
        from commviz.trace.ring import RingError, read_ring

        if not os.path.exists(path):
            return None
        try:
            rank, pid, events = read_ring(path)
        except (RingError, OSError) as exc:
            self._on_error("crash ring", f"{path} unreadable: {exc}")
            return None
        if os.path.basename(path).startswith("ring-"):
            try:
                os.unlink(path)
            except OSError:
                pass
        if self.writer is not None and events:
            from commviz.events import encode_batch

            with self.lock:
                if self.writer is not None:
                    with self._qlock:  # frames are written from the reader's thread too
                        self.writer.write(encode_batch(rank, events))
        return rank, pid, events

    def collect_rings(self) -> None:
        """Rings left in our job's ring dir by processes that are gone: ranks that
        died, possibly before their first hello reached us."""
        if not self.ring_dir or not os.path.isdir(self.ring_dir):
            return
        for name in os.listdir(self.ring_dir):
            if not name.startswith("ring-") or not name.endswith(".ring"):
                continue
            try:
                pid = int(name[len("ring-"):-len(".ring")])
            except ValueError:
                continue
            if _pid_alive(pid):
                continue
            got = self._recover(os.path.join(self.ring_dir, name))
            if got is None:
                continue
            rank, pid, events = got
            with self.lock:
                self._drain_locked(force=True)  # what it sent before it died goes first (or says goodbye)
                r = self.model.ranks.get(rank)
                if r is not None and r.status is RankStatus.EXITED:
                    continue
                for ev in events:
                    self.model.ingest(rank, ev)
                self.model.mark_gone(rank, "process ended without a goodbye (recovered from its crash ring)")

    def note_stop(self, by: str, reason: str = "", after_s: float = 0.0) -> None:
        """Before the watcher signals the job: a `Stopped` marker under every rank still
        running, recorded like any frame, so the trace (and the model) say who ended it."""
        from commviz.events import STOPPED_SINCE, Stopped, encode_batch

        now = time.time_ns()
        with self.lock:
            self._drain_locked(force=True)  # a rank whose goodbye has arrived is not stopped by us
            for r in self.model.ranks.values():
                if r.hello is None or r.gone:
                    continue
                ev = Stopped(now - r.offset_ns, by, reason, after_s)  # in the rank's own clock
                if self.writer is not None:
                    with self._qlock:
                        self.writer.write(encode_batch(r.rank, [ev], schema=STOPPED_SINCE))
                self.model.ingest(r.rank, ev)

    def ingest_counts(self) -> IngestCounts:
        """How far behind the job this feed is and what it sheds; call it under a
        lock of the model's, with what is read from the model."""
        ov, srv = self.overload, self.server
        return IngestCounts(lag_s=ov.lag_ns / 1e9, shedding=ov.shedding, why=ov.why, shed_spells=ov.spells,
                            shed_frames=srv.shed_frames, probe_behind_events=self.model.behind_events,
                            read_pauses=srv.paused,
                            refused_token=srv.denied, refused_limit=srv.turned_away)

    # Feed (tui/feed.py) ----------------------------------------------------

    def fetch(self, query: ViewQuery, hosts: Hosts | None = None) -> Fetched:
        """A view's reading: the frames that have waited `DRAIN_S` first, the youngest
        left to build the next batch."""
        self.drain_due()
        return super().fetch(query, hosts)

    def procs(self) -> dict[int, tuple[float, int]]:
        return dict(self.proc_stats)

    def status(self) -> str:
        m, srv = self.model, self.server
        bits = [f"listening on {self.addr}", f"{len(m.ranks)} ranks", f"{m.events} events"]
        if self.metrics_url:
            bits.insert(1, f"metrics {self.metrics_url}")
        if m.ranks:
            bits.append(self.overload.words())  # as of the newest batch: an idle job is not lag
        if srv.bad_frames:
            bits.append(f"{srv.bad_frames} bad frames")
            if not srv.reads_in_c:  # when it matters: frames are being turned away
                bits.append("read through pyzmq, a third as fast: reinstall commviz where a C compiler is")
        if srv.shed_frames:
            worst = ", ".join(f"{p} {n}" for p, n in srv.shed.top(2))
            bits.append(f"{srv.shed_frames} frames shed ({worst})")
        if m.behind_events:
            bits.append(f"{m.behind_events} events left out by the probes (this watcher took none)")
        if srv.paused:
            bits.append(f"reading paused {srv.paused} times (the model's queue full: frames wait at the ranks)")
        if srv.denied:
            bits.append(f"{srv.denied} connections refused (no valid token)")
        if srv.turned_away:
            bits.append(f"{srv.turned_away} connections refused (over {srv.conns.max_open} at once)")
        return " · ".join(bits)

    def all_exited(self) -> bool:
        with self.lock:
            self._drain_locked(force=True)  # a goodbye that has arrived counts
            rs = self.model.ranks.values()
            return bool(rs) and all(r.gone for r in rs)

    def close(self) -> None:
        self._stop.set()
        self.server.close()
        self._sync_counts()
        self.drain()
        with self.lock:
            if self.writer is not None:
                self.writer.close()
                self.writer = None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
