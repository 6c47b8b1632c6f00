"""Probe health: counters and one-time warnings. The probe never raises into user
code; what goes wrong inside it is counted, said once on stderr, and sent along."""

from __future__ import annotations

import sys


class Health:
    def __init__(self) -> None:
        self.dropped = 0  # events lost: queue full, or no watcher to take them
        self.behind = 0  # events left out while a connected watcher was not taking them
        self.internal_errors = 0
        self.trace_errors = 0
        self._said: set[str] = set()

    def warn_once(self, key: str, message: str) -> None:
        if key in self._said:
            return
        self._said.add(key)
        try:
            sys.stderr.write(f"commviz: {message}\n")
        except Exception:
            pass

    def internal(self, where: str, exc: BaseException) -> None:
        self.internal_errors += 1
        self.warn_once(
            "internal:" + where,
            f"internal error in {where} ({type(exc).__name__}: {exc}); "
            "the job goes on, this op may be missing from the view",
        )
