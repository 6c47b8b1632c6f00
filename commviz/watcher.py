"""The watcher's live source: a transport server feeding one model, optionally
recording every valid frame to a trace file. The model is guarded by one lock,
held only to ingest a batch or copy a snapshot."""

from __future__ import annotations

import os
import socket
import threading
import time

from commviz.events import Batch
from commviz.model import Model
from commviz.model.diagnosis import RankStatus
from commviz.model.overload import Overload
from commviz.trace.file import TraceWriter
from commviz.transport.server import Server

LIVENESS_EVERY_S = 0.5


class LiveFeed:
    def __init__(self, addr: str, record_to: str | None = None, hang_after_s: float = 10.0,
                 ring_dir: str | None = None, token: str | None = None) -> None:
        self.ring_dir = ring_dir  # crash rings of a job we launched (COMMVIZ_RING_DIR)
        self.lock = threading.Lock()
        self.model = Model(hang_after_s=hang_after_s)
        self.overload = Overload()  # how far behind the job we are; sheds detail past a bound
        self.writer = TraceWriter(record_to) if record_to else None
        self.errors: list[str] = []
        self._unsynced = 0  # error lines the model has not counted yet
        self.host = socket.gethostname()
        self.started = time.monotonic()
        self.server = Server(addr, self._on_batch, self._on_error, token=token)
        self.addr = self.server.addr
        self._stop = threading.Event()
        self._liveness = threading.Thread(target=self._watch_pids, name="commviz-liveness", daemon=True)
        self._procs: dict = {}  # pid -> psutil.Process
        self.proc_stats: dict[int, tuple[float, int]] = {}  # rank -> (cpu %, rss bytes), this host only

    def start(self) -> "LiveFeed":
        self.server.start()
        self._liveness.start()
        return self

    def _on_batch(self, batch: Batch, payload: bytes) -> None:
        with self.lock:
            if self.writer is not None:
                self.writer.write(payload)
            self.model.ingest_batch(batch)
            self.model.shed = self.overload.update(time.time_ns(), self.model.last_t)

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
        with self.lock:
            m = self.model
            if n and self.errors:
                m.note_decode_error(self.errors[-1])
            m.decode_errors = max(m.decode_errors + max(n - 1, 0), self.server.bad_frames)

    def _watch_pids(self) -> None:
        """A rank on this host whose process is gone without a goodbye is dead."""
        while not self._stop.wait(LIVENESS_EVERY_S):
            self._sync_counts()
            self.collect_rings()
            with self.lock:
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
                        r = self.model.ranks.get(rank)
                        # Re-check under the lock: its goodbye may just have arrived.
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
            for r in self.model.ranks.values():
                if r.hello is None or r.gone:
                    continue
                ev = Stopped(now - r.offset_ns, by, reason, after_s)  # in the rank's own clock
                if self.writer is not None:
                    self.writer.write(encode_batch(r.rank, [ev], schema=STOPPED_SINCE))
                self.model.ingest(r.rank, ev)

    # Feed protocol (read by the TUI) ------------------------------------

    def now_ns(self) -> int:
        return time.time_ns()

    def advance(self) -> None:
        pass

    def status(self) -> str:
        m, srv = self.model, self.server
        bits = [f"listening on {self.addr}", f"{len(m.ranks)} ranks", f"{m.events} events"]
        if m.ranks:
            bits.append(self.overload.words())  # as of the newest batch: an idle job is not lag
        if srv.bad_frames:
            bits.append(f"{srv.bad_frames} bad frames")
        if srv.shed_frames:
            worst = ", ".join(f"{p} {n}" for p, n in srv.shed.top(2))
            bits.append(f"{srv.shed_frames} frames shed ({worst})")
        if srv.denied:
            bits.append(f"{srv.denied} connections refused (no valid token)")
        if srv.turned_away:
            bits.append(f"{srv.turned_away} connections refused (over {srv.conns.max_open} at once)")
        return " · ".join(bits)

    def all_exited(self) -> bool:
        with self.lock:
            rs = self.model.ranks.values()
            return bool(rs) and all(r.gone for r in rs)

    def close(self) -> None:
        self._stop.set()
        self.server.close()
        self._sync_counts()
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
