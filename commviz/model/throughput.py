"""Throughput over time: per-rank and total wire bytes and ops, in fixed time buckets.

Fed by `commviz.model.flows` as ops end (bytes per edge, spread over the time the
transfer took; one op count per rank at its end); read by the dashboard's sparklines
as GB/s and ops/s per bucket. Memory is fixed: a ring of `SLOTS` buckets for the
totals and `RANK_SLOTS` per rank, whatever the length of the job.

Times are the model's wall-clock nanoseconds; `now` is whatever clock the reader uses
(live wall time, or the replay position), so a job that stops shows its rates fall to
zero as `now` moves on.
"""

from __future__ import annotations

from array import array

BUCKET_NS = 250_000_000  # one sparkline column
SLOTS = 480  # totals: 2 minutes of history
RANK_SLOTS = 240  # per rank: 1 minute


def rate_window(now_ns: int, bucket_ns: int) -> tuple[list[tuple[int, float]], float]:
    """The buckets that make up "the second before `now_ns`", each with its weight,
    and the seconds they span: the current bucket counts in full, the oldest one by
    the part of it inside the second. Flows and throughput both read rates this way."""
    b = bucket_ns
    k = max(1, round(1e9 / b))
    e_now = now_ns // b
    w_old = 1.0 - (now_ns - e_now * b) / b
    return [(e, w_old if e == e_now - k else 1.0) for e in range(e_now - k, e_now + 1)], k * b / 1e9


class _Ring:
    """Three series (tx bytes, rx bytes, ops) over a ring of buckets; a slot is valid
    only for the bucket number stamped on it, so nothing needs clearing as time passes."""

    __slots__ = ("n", "stamp", "tx", "rx", "ops")

    def __init__(self, n: int) -> None:
        self.n = n
        self.stamp = array("q", [-1]) * n
        self.tx = array("d", [0.0]) * n
        self.rx = array("d", [0.0]) * n
        self.ops = array("d", [0.0]) * n

    def _slot(self, e: int) -> int:
        i = e % self.n
        if self.stamp[i] != e:
            if self.stamp[i] > e:
                return -1  # older than the ring reaches
            self.stamp[i] = e
            self.tx[i] = self.rx[i] = self.ops[i] = 0.0
        return i

    def add(self, series: str, e: int, v: float) -> None:
        i = self._slot(e)
        if i >= 0:
            getattr(self, series)[i] += v

    def get(self, series: str, e: int) -> float:
        i = e % self.n
        return getattr(self, series)[i] if self.stamp[i] == e else 0.0


class Throughput:
    """Per-bucket bytes and op counts; answers in GB/s and ops/s.

    Adds to the newest bucket go to plain dicts (the hot path: one dict update each);
    they are folded into the rings when a newer bucket starts or a reader asks."""

    def __init__(self, bucket_ns: int = BUCKET_NS, slots: int = SLOTS, rank_slots: int = RANK_SLOTS) -> None:
        self.bucket_ns = bucket_ns
        self.total = _Ring(slots)
        self.rank_slots = rank_slots
        self.ranks: dict[int, _Ring] = {}
        self.newest = -1  # the open bucket
        self._tx: dict[int, float] = {}
        self._rx: dict[int, float] = {}
        self._ops: dict[int, float] = {}

    def _rank(self, rank: int) -> _Ring:
        r = self.ranks.get(rank)
        if r is None:
            r = self.ranks[rank] = _Ring(self.rank_slots)
        return r

    def flush(self) -> None:
        """Fold the open bucket's sums into the rings (readers call this first)."""
        e = self.newest
        if e < 0:
            return
        for series, acc in (("tx", self._tx), ("rx", self._rx), ("ops", self._ops)):
            if not acc:
                continue
            if series != "rx":
                self.total.add(series, e, sum(acc.values()))
            for rank, v in acc.items():
                self._rank(rank).add(series, e, v)
            acc.clear()

    def _late(self, series: str, rank: int, e: int, v: float) -> None:
        if series != "rx":
            self.total.add(series, e, v)
        self._rank(rank).add(series, e, v)

    # ----------------------------------------------------------------- feeding

    def add_op(self, rank: int, e: int, n: float = 1.0) -> None:
        """One op of `rank` (or `n`, for a sample's) ended in bucket `e` (= wall ns // bucket_ns)."""
        if e != self.newest:
            if e < self.newest:
                self._late("ops", rank, e, n)
                return
            self.flush()
            self.newest = e
        acc = self._ops
        acc[rank] = acc.get(rank, 0.0) + n

    def add_bytes(self, src: int, dst: int | None, e: int, nbytes: float) -> None:
        """`nbytes` left `src` in bucket `e` (towards `dst`; None: spread over peers the
        reader does not track, counted as received by `src` too — a symmetric exchange)."""
        if dst is None:
            dst = src
        if e != self.newest:
            if e < self.newest:
                self._late("tx", src, e, nbytes)
                self._late("rx", dst, e, nbytes)
                return
            self.flush()
            self.newest = e
        tx, rx = self._tx, self._rx
        tx[src] = tx.get(src, 0.0) + nbytes
        rx[dst] = rx.get(dst, 0.0) + nbytes

    # ----------------------------------------------------------------- reading

    def series(self, now_ns: int, width: int, rank: int | None = None) -> dict[str, list[float]]:
        """The last `width` buckets up to the one holding `now_ns`, oldest first, as
        {"gbps": tx GB/s, "rx_gbps": rx GB/s, "ops": ops/s}. Per rank when `rank` is given."""
        self.flush()
        ring = self.total if rank is None else self.ranks.get(rank)
        width = max(0, width)
        if ring is None:
            return {"gbps": [0.0] * width, "rx_gbps": [0.0] * width, "ops": [0.0] * width}
        width = min(width, ring.n)
        e_now = now_ns // self.bucket_ns
        per_s = 1e9 / self.bucket_ns
        es = range(e_now - width + 1, e_now + 1)
        tx = [ring.get("tx", e) * per_s / 1e9 for e in es]
        rx = [ring.get("rx", e) * per_s / 1e9 for e in es] if rank is not None else list(tx)
        ops = [ring.get("ops", e) * per_s for e in es]
        return {"gbps": tx, "rx_gbps": rx, "ops": ops}

    def rate(self, now_ns: int, rank: int | None = None) -> tuple[float, float]:
        """(GB/s, ops/s) over the second before `now_ns` (the current bucket counts in
        full, the oldest one by the part of it inside the second)."""
        self.flush()
        ring = self.total if rank is None else self.ranks.get(rank)
        if ring is None:
            return 0.0, 0.0
        window, span_s = rate_window(now_ns, self.bucket_ns)
        tx = ops = 0.0
        for e, w in window:
            tx += w * ring.get("tx", e)
            ops += w * ring.get("ops", e)
        return tx / span_s / 1e9, ops / span_s
