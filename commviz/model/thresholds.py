"""The knobs of the diagnoses, in one place with their defaults.

Defaults are chosen so that a healthy job — every rank finishes every collective,
with the ordinary jitter of a loaded machine — produces no diagnosis at all, even with
a short hang threshold: waits have to outlast `hang_after_s`, a death has to be
seen by the others for `dead_grace_s`, and a straggler has to be late consistently
and by a margin that costs the others real time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    # A rank inside a collective or p2p op this long, while a peer it needs has not
    # entered (or posted the match), is hung.
    hang_after_s: float = 10.0
    # A rank gone (goodbye, connection or pid gone) counts as the dead cause of a wait
    # once the other ranks were still heard from this long after its last sign of
    # life. Ranks killed together at the end of a run (a cut-off trace) are within
    # a heartbeat (1 s) of each other, so they are not blamed for each other's waits.
    dead_grace_s: float = 1.5
    # No event (the probe's heartbeat is 1 s) for this long: say so in messages.
    silent_after_s: float = 3.0
    # Straggler: over the last `straggler_window` completed collectives of a group,
    # with at least `straggler_min_instances` of them, one rank arrives last at
    # `straggler_last_share` or more, and its median lateness (after the next-latest
    # rank) is at least `straggler_min_s`, `straggler_rel_op` × the median op time
    # (the transfer itself) and `straggler_rel_interval` × the median time between
    # consecutive collectives (so the others spend a real share of their time waiting).
    # The same rank being last that often must also be unlikely by chance (each of
    # n ranks is last with probability 1/n): binomial tail ≤ `straggler_chance`. With
    # 2 ranks that takes 20 of 20, or 42 of 50; with 4 ranks 10 of 10.
    straggler_window: int = 50
    straggler_min_instances: int = 10
    straggler_last_share: float = 0.7
    straggler_chance: float = 1e-6
    straggler_min_s: float = 1e-3
    straggler_rel_op: float = 0.2
    straggler_rel_interval: float = 0.05

    @property
    def hang_after_ns(self) -> int:
        return int(self.hang_after_s * 1e9)

    @property
    def dead_grace_ns(self) -> int:
        return int(self.dead_grace_s * 1e9)

    @property
    def silent_after_ns(self) -> int:
        return int(self.silent_after_s * 1e9)
