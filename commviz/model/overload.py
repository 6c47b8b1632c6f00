"""How far behind the job the watcher is, and what it gives up to catch up.

Lag is the watcher's clock minus the newest event's time (each rank's stamps are on
the wall clock through its host's offset, `model.merge`). A watcher that falls
further behind than `shed_after_s`, or that is losing frames (its inbox full), sheds
per-event detail — latency samples, straggler and
desync checks; flows and throughput become an estimate from a sample of the ops
(`flows.SHED_FLOW_SAMPLE`) — and keeps what a user counts on exactly: ops,
bytes and sequence numbers per rank and per op, and the in-flight tables that hang
diagnosis reads. Losing frames matters as much as lag: nearly every collective then
arrives with a member missing, and keeping each open for a member that never comes
is what cost the watcher nine tenths of its rate (model/retired.py is the cheap way).
It resumes full detail once it is back under half the bound and has lost nothing for
`quiet_s`, so it does not flap.
"""

from __future__ import annotations

from dataclasses import dataclass

SHED_AFTER_S = 5.0
QUIET_S = 2.0  # after the last frame lost, detail is shed this long


@dataclass
class Overload:
    shed_after_s: float = SHED_AFTER_S
    quiet_s: float = QUIET_S
    lag_ns: int = 0
    shedding: bool = False
    spells: int = 0  # how many times shedding began
    lost: int = 0  # lost on the way so far (frames, events), as last told
    lost_at: int = 0  # wall ns when that count last grew (0: never)
    why: str = ""  # while shedding, what for: "behind the job" or "frames lost"

    def update(self, now_ns: int, newest_ns: int, lost: int = 0) -> bool:
        """Note the lag at `now_ns` (wall clock) given the newest event's time, and
        `lost`, what was lost so far because the watcher was behind (frames the inbox
        shed, events the probes left out), a count that only rises; returns whether
        to shed detail from now on."""
        self.lag_ns = max(0, now_ns - newest_ns) if newest_ns else 0
        if lost > self.lost:
            self.lost, self.lost_at = lost, now_ns
        losing = self.lost_at and now_ns - self.lost_at < self.quiet_s * 1e9
        lag_s = self.lag_ns / 1e9
        if not self.shedding and (lag_s > self.shed_after_s or losing):
            self.shedding = True
            self.spells += 1
        elif self.shedding and lag_s < self.shed_after_s / 2 and not losing:
            self.shedding = False
        self.why = ("frames lost" if losing else "behind the job") if self.shedding else ""
        return self.shedding

    def words(self) -> str:
        """The status line's part: `lag 0.2 s`, or what is being shed and why."""
        lag = f"lag {self.lag_ns / 1e9:.1f} s"
        if self.shedding:
            return (f"{lag}, {self.why}: shedding detail (latency, straggler/desync checks; flows "
                    "estimated from a sample); counts and bytes stay exact")
        return lag
