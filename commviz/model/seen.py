"""The op ids a rank has started (`SeenIds`): how a start resent after a reconnect
is told from a new one, in memory that does not grow with the run."""

from __future__ import annotations

import bisect
from array import array

import numpy as np


class SeenIds:
    """The op ids a rank has started, in memory that does not grow with the run:
    the probe numbers its ops 0, 1, 2 … so the ids below a floor are all seen, and
    above a gap (a lost frame) the seen ids are kept as runs (`lo[j]..hi[j]`), not
    one by one: a frame of 64 ops costs two numbers, not 64 set entries (at 1,024
    ranks losing frames that was 4 MB a rank). Ids more than `SPAN` below the
    highest are taken as seen: a start resent after a reconnect is a recent one.
    Which ids count as seen depends only on which were added, not on their order,
    so the batch path (`add_sorted`) and one event at a time end the same."""

    SPAN = 1 << 16
    __slots__ = ("floor", "lo", "hi", "top")

    def __init__(self) -> None:
        self.floor = -1  # every id <= floor has been seen
        self.lo = array("q")  # runs of seen ids above floor + 1, ascending, never touching
        self.hi = array("q")
        self.top = -1  # the highest id seen (the batch path checks new ids against it)

    def __contains__(self, op_id: int) -> bool:
        if op_id <= self.floor:
            return True
        j = bisect.bisect_right(self.lo, op_id) - 1
        return j >= 0 and op_id <= self.hi[j]

    def runs(self) -> list[tuple[int, int]]:
        """The seen ids above the floor's gap, as (first, last) runs: what two models
        fed the same ids compare (tests), without the arrays they are kept in."""
        return list(zip(self.lo, self.hi))

    def add(self, op_id: int) -> None:
        if op_id <= self.floor:
            return
        if op_id > self.top:
            self.top = op_id
        lo, hi = self.lo, self.hi
        if op_id == self.floor + 1:
            self.floor = op_id
            if lo and lo[0] == op_id + 1:
                self.floor = hi[0]
                del lo[0], hi[0]
            return
        j = bisect.bisect_right(lo, op_id) - 1
        if j >= 0 and op_id <= hi[j]:
            return
        left = j >= 0 and hi[j] == op_id - 1
        right = j + 1 < len(lo) and lo[j + 1] == op_id + 1
        if left and right:
            hi[j] = hi[j + 1]
            del lo[j + 1], hi[j + 1]
        elif left:
            hi[j] = op_id
        elif right:
            lo[j + 1] = op_id
        else:
            lo.insert(j + 1, op_id)
            hi.insert(j + 1, op_id)
        if self.top - self.SPAN > self.floor:
            self._window()

    def add_sorted(self, ids) -> None:
        """Add ascending, distinct ids (a numpy array) at once: one rank's ids of a
        batch, some of which the per-event path may have added already. Costs the
        runs they make, not the ids."""
        n = len(ids)
        if not n:
            return
        first, last = int(ids[0]), int(ids[-1])
        if last - first == n - 1:
            new = [(first, last)]
        else:
            br = np.flatnonzero(np.diff(ids) != 1)
            new = list(zip([first] + ids[br + 1].tolist(), ids[br].tolist() + [last]))
        lo, hi = self.lo, self.hi
        k = bisect.bisect_left(hi, first - 1)  # the runs these may touch or overlap
        if k < len(lo):
            new = sorted(new + list(zip(lo[k:], hi[k:])))
            del lo[k:], hi[k:]
        out: list[list[int]] = []
        for a, b in new:
            if out and a <= out[-1][1] + 1:
                if b > out[-1][1]:
                    out[-1][1] = b
            else:
                out.append([a, b])
        j = 0
        if not lo:  # nothing between the floor and these: they may move it
            while j < len(out) and out[j][0] <= self.floor + 1:
                self.floor = max(self.floor, out[j][1])
                j += 1
        for a, b in out[j:]:
            lo.append(a)
            hi.append(b)
        if last > self.top:
            self.top = last
        if self.top - self.SPAN > self.floor:
            self._window()

    def _window(self) -> None:
        """Ids more than SPAN below the top count as seen: the floor rises to there, and
        the runs it passes go. This is what bounds the runs, and since it depends only
        on the top, it ends the same whatever order the ids came in. (Each run that goes
        shifts the arrays: cheap while runs are lost frames, a few hundred; only a loss
        of every other op id makes it tens of thousands.)"""
        floor = self.top - self.SPAN
        lo, hi = self.lo, self.hi
        k = bisect.bisect_right(hi, floor)  # runs wholly at or below the new floor
        del lo[:k], hi[:k]
        if lo and lo[0] <= floor + 1:
            floor = hi[0]
            del lo[0], hi[0]
        self.floor = floor
