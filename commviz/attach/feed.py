"""`commviz attach --watch`: the dashboard on what attach sees, looked at again and
again. Each round is a whole attach (two looks at every rank, `--interval` apart,
the dumps and RAS where there are any) turned into a fresh model, swapped in under
the lock the dashboard takes its snapshots with: the dashboard reads an attached job
exactly as it reads a live one, through the same `Feed` interface (tui/feed.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from commviz.model import Model
from commviz.view.feed import ModelFeed

MIN_PAUSE_S = 1.0  # between the end of one round and the start of the next


class AttachFeed(ModelFeed):
    """`observe() -> (model, tiers)`: one round of attach (commands/attach.py)."""

    def __init__(self, observe: Callable[[], tuple[Model, dict]], pause_s: float = MIN_PAUSE_S) -> None:
        self.lock = threading.Lock()
        self.model = Model()
        self.tiers: dict = {}
        self.rounds = 0
        self.looked_at = 0.0  # monotonic time of the latest round's end
        self.error = ""
        self._observe = observe
        self._pause_s = max(MIN_PAUSE_S, pause_s)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="commviz-attach", daemon=True)

    def start(self) -> AttachFeed:
        self.thread.start()
        return self

    def look_once(self) -> None:
        try:
            model, tiers = self._observe()
        except Exception as exc:  # a round that failed: the last model stays, the line says why
            self.error = f"{type(exc).__name__}: {exc}"[:200]
            return
        with self.lock:
            self.model, self.tiers = model, tiers
            self.rounds += 1
            self.looked_at = time.monotonic()
            self.error = ""

    def _run(self) -> None:
        while not self._stop.is_set():
            self.look_once()
            self._stop.wait(self._pause_s)

    # Feed (tui/feed.py) ----------------------------------------------------

    def status(self) -> str:
        t = self.tiers
        if not self.rounds:
            return "attach: looking at the ranks…" + (f" ({self.error})" if self.error else "")
        st = t.get("stacks", {})
        ago = time.monotonic() - self.looked_at
        bits = [f"attach · job {t.get('job', '?')}", f"{st.get('read', 0)}/{st.get('of', 0)} ranks read by py-spy",
                f"looked {ago:.0f} s ago (round {self.rounds})"]
        if t.get("flight_recorder", {}).get("dumps"):
            bits.append("flight-recorder dumps read")
        if "addr" in t.get("ras", {}):
            bits.append("NCCL RAS answered")
        if self.error:
            bits.append(f"last round failed: {self.error}")
        return " · ".join(bits)

    def close(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
