"""How far behind the job the watcher is, and what it gives up to catch up.

Lag is the watcher's clock minus the newest event's time (each rank's stamps are on
the wall clock through its host's offset, `model.merge`). A watcher that falls
further behind than `shed_after_s` sheds per-event detail — flows and throughput,
latency samples, straggler and desync checks — and keeps what a user counts on
exactly: ops, bytes and sequence numbers per rank and per op, and the in-flight
tables that hang diagnosis reads. It resumes full detail once it is back under
half the bound, so it does not flap.
"""

from __future__ import annotations

from dataclasses import dataclass

SHED_AFTER_S = 5.0


@dataclass
class Overload:
    shed_after_s: float = SHED_AFTER_S
    lag_ns: int = 0
    shedding: bool = False
    spells: int = 0  # how many times shedding began

    def update(self, now_ns: int, newest_ns: int) -> bool:
        """Note the lag at `now_ns` (wall clock) given the newest event's time;
        returns whether to shed detail from now on."""
        self.lag_ns = max(0, now_ns - newest_ns) if newest_ns else 0
        lag_s = self.lag_ns / 1e9
        if not self.shedding and lag_s > self.shed_after_s:
            self.shedding = True
            self.spells += 1
        elif self.shedding and lag_s < self.shed_after_s / 2:
            self.shedding = False
        return self.shedding

    def words(self) -> str:
        """The status line's part: `lag 0.2 s`, or what is being shed and why."""
        lag = f"lag {self.lag_ns / 1e9:.1f} s"
        if self.shedding:
            return (f"{lag} behind the job: shedding detail (flows, latency, straggler/desync checks); "
                    "counts and bytes stay exact")
        return lag
