"""The collector of `watch`, `demo` and `lesson`, in a process of its own.

One command still does everything, but the dashboard no longer shares a GIL with
ingest: the command starts `commviz serve` as its child on the address the ranks use,
and draws as `watch --connect` does. The child outlives nothing: it stops when the
dashboard closes it, and by itself if the dashboard's process is gone.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time

from commviz.errors import CommvizError
from commviz.viewlink import RemoteFeed, ViewError

READY = "commviz serve: listening on "
STOP_NOTED = "  stop noted"
METRICS = "  metrics: "
START_S = 60.0  # an import of commviz on a loaded machine takes seconds, not minutes
NOTE_S = 3.0  # what quitting waits for the collector to mark the stop (it looks twice a second)
CLOSE_S = 10.0  # what it waits for the collector to close the trace


class SpawnedCollector:
    """`commviz serve` as a child: its address, its HTTP view, its output kept (the
    last lines, for an error), and the stop marker asked for by signal."""

    def __init__(self, listen: str, record_to: str | None, hang_after_s: float,
                 metrics: tuple[str, int] | None = None, ring_dir: str | None = None,
                 stop_by: str = "commviz watch", topology: str | None = None) -> None:
        from commviz.commands.serve import VIEW_TOKEN_ENV
        from commviz.transport.token import make_token

        argv = [sys.executable, "-m", "commviz.cli", "serve", "--listen", listen, "--hang-after", str(hang_after_s),
                "--parent", str(os.getpid()), "--stop-by", stop_by]
        if record_to:
            argv += ["-o", record_to]
        if metrics:
            argv += ["--metrics", f"[{metrics[0]}]:{metrics[1]}" if ":" in metrics[0] else f"{metrics[0]}:{metrics[1]}"]
        if ring_dir:
            argv += ["--ring-dir", ring_dir]
        if topology:
            argv += ["--topology", topology]
        # Its HTTP view is this dashboard's alone: another user on the machine reaches
        # 127.0.0.1 too, so it wants a token of its own (not the job's: ranks never ask).
        self.view_token = make_token()
        env = dict(os.environ, **{VIEW_TOKEN_ENV: self.view_token, "PYTHONIOENCODING": "utf-8"})
        self.lines: collections.deque[str] = collections.deque(maxlen=50)
        self._noted = threading.Event()
        self._ready = threading.Event()
        self.addr = self.metrics_url = None
        try:
            # Its own session: a Ctrl-C at the terminal is the dashboard's to handle.
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         encoding="utf-8", errors="replace", stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        except OSError as exc:
            raise CommvizError(f"could not start the collector ({exc})") from exc
        # Read for as long as it runs: a full pipe would stop it mid-print.
        self._reader = threading.Thread(target=self._read, name="commviz-collector-out", daemon=True)
        self._reader.start()
        end = time.monotonic() + START_S
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.close()
                self._reader.join(2.0)  # its last words, up to the end of the pipe
                raise CommvizError(f"the collector did not start:\n{self.last_words()}")

    def last_words(self) -> str:
        return "\n".join(line for line in self.lines if line.strip()) or "(it printed nothing)"

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith(READY):
                self.addr = line[len(READY):].split(" ", 1)[0]
                self._ready.set()
            elif line.startswith(METRICS):
                self.metrics_url = line[len(METRICS):]
            elif line == STOP_NOTED:
                self._noted.set()

    def note_stop(self) -> bool:
        """A `Stopped` marker under every running rank, before the job is signalled
        (watcher.LiveFeed.note_stop, in the collector); whether it was made in time."""
        if self.proc.poll() is not None:
            return False
        self._noted.clear()
        self.proc.send_signal(signal.SIGUSR1)
        return self._noted.wait(NOTE_S)

    def close(self) -> None:
        """Stop it (SIGTERM: it closes the trace and says what it saw) and wait."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(CLOSE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SpawnedFeed(RemoteFeed):
    """The dashboard's feed on its own collector: a view of it whose status line is
    the collector's own, and whose closing stops it."""

    def __init__(self, collector: SpawnedCollector) -> None:
        self.collector = collector
        try:
            super().__init__(collector.addr, token=collector.view_token)
        except ViewError:
            collector.close()
            raise
        self.addr = collector.addr

    @property
    def metrics_url(self) -> str | None:
        """(printed after the line the dashboard waited for: read when asked)"""
        return self.collector.metrics_url

    def fetch(self, query, hosts=None):
        got = super().fetch(query, hosts)
        prefix = f"view of {self.url} · "
        if got.status.startswith(prefix):
            got.status = got.status[len(prefix):]
        rc = self.collector.proc.poll()
        if rc is not None:  # what is on screen is all there will be: say why
            last = self.collector.last_words().splitlines()[-1]
            got.status = f"the collector exited (status {rc}): {last} · the picture is its last"
        return got

    def note_stop(self, by: str, reason: str = "", after_s: float = 0.0) -> None:
        """The collector is this dashboard's: it marks the stop (SIGUSR1, in its own
        words: `serve --stop-by`)."""
        self.collector.note_stop()

    def close(self) -> None:
        self.collector.close()
