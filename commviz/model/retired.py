"""The collective instances a shedding model has already counted, per group.

Behind a flood (model/overload.py) nearly every collective arrives with a member
missing: a frame lost at a client or shed by the inbox, or still to come. Keeping
each such instance open until a late member or the stale-instance sweep closes it
is what made the watcher fall to a tenth of its rate exactly when it most needed
to keep up. While shedding, an instance is counted into the statistics once its
members present have all left it, and its key (group, seq) is remembered here; a
member that comes later counts for its own rank (ops, bytes, seq) and opens
nothing, so the instance is never counted twice.

Memory does not grow with the run: sequence numbers of a group run 0, 1, 2 … so
those at or below a floor are all counted and only the keys above a gap are held
one by one, at most `MAX_ABOVE` per group (past that the oldest gaps are taken as
counted: a member that late is counted for its rank only, and a key none of whose
frames came is counted as if one had). The floor is also raised, as the spell goes
on, to what every member has reached (`ledger.raise_floors`), so keys whose every
frame was lost do not hold it back.
"""

from __future__ import annotations

import numpy as np

from commviz.model.keys import unique

MAX_ABOVE = 16384


class Retired:
    """One group's counted sequence numbers."""

    __slots__ = ("floor", "above")

    def __init__(self, floor: int = -1) -> None:
        self.floor = floor  # every seq <= floor is counted
        self.above: set[int] = set()

    def __contains__(self, seq: int) -> bool:
        return seq <= self.floor or seq in self.above

    def raise_floor(self, floor: int) -> None:
        """Everything at or below `floor` counts as counted (a new spell of shedding
        begins above what the model already folded)."""
        if floor > self.floor:
            self.floor = floor
            self.above = {s for s in self.above if s > floor}
            self._run_on()

    def add(self, seq: int) -> None:
        if seq <= self.floor:
            return
        if seq == self.floor + 1:
            self.floor = seq
            self._run_on()
            return
        self.above.add(seq)
        if len(self.above) > MAX_ABOVE:
            keep = sorted(self.above)
            self.floor = keep[len(keep) // 2]
            self.above = set(keep[len(keep) // 2 + 1:])
            self._run_on()

    def add_many(self, seqs: np.ndarray) -> None:
        """`add` for each (any order, repeats allowed), a batch at a time."""
        new = seqs[seqs > self.floor]
        if not len(new):
            return
        if self.above:
            new = np.concatenate([new, np.fromiter(self.above, np.int64, len(self.above))])
        new = unique(new)
        run = new - np.arange(len(new)) == self.floor + 1  # the run that goes on from the floor
        k = len(new) if run.all() else int(np.argmin(run))
        self.floor += k
        self.above = set(new[k:].tolist())
        if len(self.above) > MAX_ABOVE:  # the newest half of the cap stays one by one
            keep = new[k:]
            cut = len(keep) - MAX_ABOVE // 2
            self.floor = int(keep[cut - 1])
            self.above = set(keep[cut:].tolist())
            self._run_on()

    def mask(self, seqs: np.ndarray) -> np.ndarray:
        """Which of `seqs` are counted."""
        hit = seqs <= self.floor
        if self.above:
            hit |= np.isin(seqs, np.fromiter(self.above, np.int64, len(self.above)))
        return hit

    def _run_on(self) -> None:
        above = self.above
        while above and self.floor + 1 in above:
            self.floor += 1
            above.discard(self.floor)
