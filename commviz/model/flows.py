"""What each edge carries: bytes moved from one rank to another, derived from the ops.

Exact for point-to-point: a send's (isend's, …) bytes went from its rank to its peer.
Modelled for collectives, as the textbook algorithms move data (NCCL and gloo pick
their own algorithms; these are the flows the bus-bandwidth factors assume), with S
the op's `bytes` and n the group's size, members in the group's rank order:

    all_reduce, all_reduce_coalesced, ddp_bucket   ring: 2(n-1)/n * S to the next member
    all_gather*, reduce_scatter*                   ring:  (n-1)/n * S to the next member
    all_to_all*                                    S/n to every other member
    broadcast, broadcast_object_list               direct from the root: S to each member
    scatter, scatter_object_list                   direct from the root: S/n to each member
    reduce                                         direct to the root: S from each member
    gather, gather_object                          direct to the root: S/n from each member
    barrier, monitored_barrier, unknown ops        nothing

Each rank's end credits what that rank sent (ring, all_to_all, reduce, gather) or, for
ops rooted at a sender, what it received (broadcast, scatter) — so every byte is
counted once. A failed op credits nothing. An all_to_all over more than `FANOUT_MAX`
ranks is kept as one edge to `HUB` ("every peer") so memory and cost stay linear.

Rates are bytes/s over the last second, from `BUCKET_NS` buckets (the transfer is
spread over the time it took: for a collective, from the last member's arrival — the
time before that was waiting, not moving). Memory is bounded: a few buckets of edges,
and per-edge totals capped at `MAX_EDGES` (the least recently used go first).

The model owns one `Traffic` (`model.traffic`, made with it and again by `reset()`,
e.g. when replay seeks) and feeds it plain facts as each op ends: who, what, how many
bytes, when, and for a collective its group's members and the last member's arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from commviz import ops as opcat
from commviz.model.keys import unique
from commviz.model.throughput import BUCKET_NS, Throughput, rate_window

HUB = -1  # "every other member of the group" (large all_to_all)
FANOUT_MAX = 32
MAX_EDGES = 65536
KEEP_BUCKETS = 6  # buckets of per-edge bytes kept for the 1 s rate (4 + 1 partial + slack)
SPREAD_MAX = 64  # a transfer is spread over at most this many buckets (16 s)
SAMPLE_FLUSH = 65536  # sampled ends kept before they are credited (`Traffic.sample`)
# While the model sheds detail, flows are estimated from about one op end in this many,
# each weighing as many (`Traffic.drawn`); each model draws from its own seeded
# generator, so a trace read twice gives the same estimate.
SHED_FLOW_SAMPLE = 16
SAMPLE_SEED = 0x636F6D6D
DRAWS_AHEAD = 4096  # the per-event path's draws, made this many at a time

EXACT = 0
MODELLED = 1

RING_2 = "ring2"  # 2(n-1)/n to next
RING_1 = "ring1"  # (n-1)/n to next
ALL_TO_ALL = "a2a"
FROM_ROOT = "from_root"  # broadcast-like: root -> each, S
FROM_ROOT_SPLIT = "from_root_split"  # scatter-like: root -> each, S/n
TO_ROOT = "to_root"  # reduce-like: each -> root, S
TO_ROOT_SPLIT = "to_root_split"  # gather-like: each -> root, S/n
SEND = "send"
NOTHING = ""


RUN_MIN = 64  # a shorter run of ring ends is cheaper through op_end
RUN_WINDOW = 16384  # ends looked at ahead for runs at a time


class RingEnds(NamedTuple):
    """Ends of collectives that did not fail, in position order, as columns (what
    `Traffic.ring_ends` takes): where each lies in the batch, its rank, bytes, start
    and end wall ns, its collective's last arrival before it; for a ring transfer,
    whom it sends to (`dst`, -1 for any other end), how many bytes (`v`) and from when
    (`start`). `sig` codes each end's (op, root, group members) in the three lists."""

    pos: np.ndarray
    rank: np.ndarray
    nbytes: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    arrived: np.ndarray
    dst: np.ndarray
    v: np.ndarray
    start: np.ndarray
    sig: np.ndarray
    ops: list
    roots: list
    members: list
    weight: float = 1.0  # ends each stands for (a sample, while the model sheds detail): its op counts so many


def _acc_add(acc: dict, keys: np.ndarray, v: np.ndarray) -> None:
    """`acc[k] = acc.get(k, 0.0) + v[i]` for each i in order, keys new to `acc` added in
    the order they first come."""
    uk, first, inv = unique(keys, index=True, inverse=True)
    ks = uk.tolist()
    sums = np.array([acc.get(k, 0.0) for k in ks])
    np.add.at(sums, inv.reshape(-1), v)
    sums = sums.tolist()
    for i in np.argsort(first, kind="stable").tolist():
        acc[ks[i]] = sums[i]


def _pattern(op: str) -> str:
    spec = opcat.spec(op)
    if spec is None:
        return NOTHING
    if spec.kind == opcat.P2P:
        return SEND if spec.direction == "send" else NOTHING
    if spec.busbw == opcat.ALLREDUCE:
        return RING_2
    if spec.busbw == opcat.ZERO:
        return NOTHING
    if "all_to_all" in op:
        return ALL_TO_ALL
    if spec.root_arg == "src":  # broadcast, scatter: from the root
        return FROM_ROOT if spec.busbw == opcat.ONE else FROM_ROOT_SPLIT
    if spec.root_arg == "dst":  # reduce, gather: to the root
        return TO_ROOT if spec.busbw == opcat.ONE else TO_ROOT_SPLIT
    if spec.busbw == opcat.SPREAD:  # all_gather*, reduce_scatter*
        return RING_1
    return NOTHING


PATTERNS: dict[str, str] = {name: _pattern(name) for name in opcat.CATALOGUE}

# In words, for legends and the links panel.
PATTERN_TEXT = {
    RING_2: "ring, 2(n-1)/n·S to next",
    RING_1: "ring, (n-1)/n·S to next",
    ALL_TO_ALL: "S/n to each peer",
    FROM_ROOT: "S from root to each",
    FROM_ROOT_SPLIT: "S/n from root to each",
    TO_ROOT: "S from each to root",
    TO_ROOT_SPLIT: "S/n from each to root",
    SEND: "exact",
}


def edge_bytes(op: str, nbytes: int, rank: int, members: list[int], root: int = -1,
               peer: int = -1) -> list[tuple[int, int, float, int]]:
    """What rank `rank`'s end of `op` credits: [(src, dst, bytes, EXACT|MODELLED)].

    Pure: the rules above, for tests and for anyone who wants them without a model.
    `members` are the group's global ranks in group order; `root`/`peer` global ranks."""
    pat = PATTERNS.get(op, NOTHING)
    if pat == SEND:
        return [(rank, peer, float(nbytes), EXACT)] if peer >= 0 and peer != rank else []
    n = len(members)
    if pat == NOTHING or n < 2 or nbytes <= 0:
        return []
    if pat in (RING_2, RING_1):
        try:
            i = members.index(rank)
        except ValueError:
            return []
        f = 2.0 * (n - 1) / n if pat == RING_2 else (n - 1) / n
        return [(rank, members[(i + 1) % n], f * nbytes, MODELLED)]
    if pat == ALL_TO_ALL:
        if rank not in members:
            return []
        share = nbytes / n
        if n > FANOUT_MAX:
            return [(rank, HUB, share * (n - 1), MODELLED)]
        return [(rank, m, share, MODELLED) for m in members if m != rank]
    if root < 0 or root == rank or root not in members:
        return []
    if pat == FROM_ROOT:
        return [(root, rank, float(nbytes), MODELLED)]
    if pat == FROM_ROOT_SPLIT:
        return [(root, rank, nbytes / n, MODELLED)]
    if pat == TO_ROOT:
        return [(rank, root, float(nbytes), MODELLED)]
    if pat == TO_ROOT_SPLIT:
        return [(rank, root, nbytes / n, MODELLED)]
    return []


@dataclass(frozen=True)
class EdgeRate:
    src: int
    dst: int  # HUB: every other member
    exact_Bps: float
    modelled_Bps: float
    op: str  # what it carried last

    @property
    def Bps(self) -> float:
        return self.exact_Bps + self.modelled_Bps

    @property
    def modelled(self) -> bool:
        """Mostly modelled (label it so)."""
        return self.modelled_Bps > self.exact_Bps


# Per-edge all-time record: [exact bytes, modelled bytes, last credit wall ns, last op].
EXACT_TOTAL, MODELLED_TOTAL, LAST_T, LAST_OP = 0, 1, 2, 3


class FlowModel:
    """Per-edge bytes: totals (`edges`), and recent buckets for rates over the last second."""

    def __init__(self, bucket_ns: int = BUCKET_NS) -> None:
        self.bucket_ns = bucket_ns
        self.buckets: dict[int, dict[tuple[int, int], list[float]]] = {}  # bucket -> edge -> [exact, modelled]
        self.newest = -1
        self.edges: dict[tuple[int, int], list] = {}  # edge -> [exact, modelled, last_t, last_op]
        self.evicted = 0

    def credit(self, src: int, dst: int, nbytes: float, kind: int, t0: int, t1: int, op: str,
               throughput: Throughput | None = None) -> None:
        """`nbytes` moved src→dst between wall ns t0 and t1 (kind EXACT or MODELLED)."""
        key = (src, dst)
        info = self.edges.get(key)
        if info is None:
            info = self.edges[key] = [0.0, 0.0, 0, ""]
            if len(self.edges) > MAX_EDGES:
                self._evict()
        info[kind] += nbytes
        if t1 > info[2]:
            info[2] = t1
        info[3] = op
        b = self.bucket_ns
        e1 = t1 // b
        if e1 > self.newest:
            self.newest = e1
            if len(self.buckets) >= KEEP_BUCKETS:
                for old in [e for e in self.buckets if e <= e1 - KEEP_BUCKETS]:
                    del self.buckets[old]
        e0 = t0 // b if t0 < t1 else e1
        if e0 == e1:
            self._add(e1, key, kind, nbytes, throughput, src, dst)
            return
        # Spread in proportion to the time spent in each bucket.
        e0 = max(e0, e1 - SPREAD_MAX + 1)
        lo = max(t0, e0 * b)
        span = t1 - lo
        for e in range(e0, e1 + 1):
            x = max(lo, e * b)
            z = min(t1, (e + 1) * b)
            if z > x:
                self._add(e, key, kind, nbytes * (z - x) / span, throughput, src, dst)

    def _add(self, e: int, key: tuple[int, int], kind: int, v: float, throughput: Throughput | None,
             src: int, dst: int) -> None:
        if throughput is not None:
            throughput.add_bytes(src, None if dst == HUB else dst, e, v)
        if e <= self.newest - KEEP_BUCKETS:
            return  # too old for the rate window; it is in the totals
        bucket = self.buckets.get(e)
        if bucket is None:
            bucket = self.buckets[e] = {}
        cell = bucket.get(key)
        if cell is None:
            cell = bucket[key] = [0.0, 0.0]
        cell[kind] += v

    def _evict(self) -> None:
        keep = sorted(self.edges.items(), key=lambda kv: kv[1][LAST_T])[len(self.edges) // 10:]
        self.evicted += len(self.edges) - len(keep)
        self.edges = dict(keep)

    # ----------------------------------------------------------------- reading

    def total(self, src: int, dst: int) -> tuple[float, float]:
        """All-time (exact, modelled) bytes of an edge."""
        info = self.edges.get((src, dst))
        return (info[0], info[1]) if info is not None else (0.0, 0.0)

    def rates(self, now_ns: int) -> dict[tuple[int, int], EdgeRate]:
        """Bytes/s per edge over the second before `now_ns` (edges that moved nothing
        in it are left out)."""
        window, span_s = rate_window(now_ns, self.bucket_ns)
        acc: dict[tuple[int, int], list[float]] = {}
        for e, weight in window:
            bucket = self.buckets.get(e)
            if not bucket:
                continue
            w = weight / span_s
            for key, (x, m) in bucket.items():
                a = acc.get(key)
                if a is None:
                    acc[key] = [x * w, m * w]
                else:
                    a[0] += x * w
                    a[1] += m * w
        out = {}
        edges = self.edges
        for key, (x, m) in acc.items():
            if x > 0 or m > 0:
                info = edges.get(key)
                out[key] = EdgeRate(key[0], key[1], x, m, info[3] if info else "")
        return out

    def recent_edges(self, now_ns: int, within_ns: int) -> list[tuple[int, int]]:
        """Edges that carried anything in the `within_ns` before `now_ns`."""
        since = now_ns - within_ns
        return [k for k, v in self.edges.items() if v[2] >= since]


class Traffic:
    """Flows and throughput of one model (one job, until the model resets)."""

    def __init__(self) -> None:
        self.flows = FlowModel()
        self.throughput = Throughput()
        self._index: dict[int, tuple[list[int], dict[int, int]]] = {}  # id(members) -> (members, rank -> index)
        self._sampled: list[tuple] = []  # `sample`'s ends, not yet credited
        self._sampled_n = 0
        self._rng = np.random.default_rng(SAMPLE_SEED)
        self._hits: list[bool] = []  # the next draws, for `drawn_one`
        self._at = 0

    def drawn(self, n: int) -> np.ndarray:
        """Which of `n` ends a shedding model credits (about one in `SHED_FLOW_SAMPLE`)."""
        return np.flatnonzero(self._rng.random(n) * SHED_FLOW_SAMPLE < 1.0)

    def drawn_one(self) -> bool:
        """Whether the per-event path credits this end: `drawn(1)` cost ~3 us an end, a
        third of a shedding model's time when batches went one event at a time."""
        if self._at >= len(self._hits):
            self._hits = (self._rng.random(DRAWS_AHEAD) * SHED_FLOW_SAMPLE < 1.0).tolist()
            self._at = 0
        self._at += 1
        return self._hits[self._at - 1]

    def sample(self, rank: np.ndarray, dst: np.ndarray, v: np.ndarray, t1: np.ndarray, ops: list[str],
               weight: float) -> None:
        """While the model sheds detail: ring transfers of a sample of ends, each end
        standing for `weight` (its `v` already so scaled), `ops[i]` its op. Kept until
        they span a bucket, then credited per (edge, bucket) and per (rank, bucket) in
        one go (`flush_sample`): per batch, the exact path's bookkeeping cost the
        shedding model a tenth of its rate at 1,024 ranks, and this estimate needs none
        of it. A transfer counts in the bucket where it ended."""
        if not len(rank):
            return
        self._sampled.append((rank, dst, v, t1, ops, weight))
        self._sampled_n += len(rank)
        b = self.throughput.bucket_ns
        first = self._sampled[0][3]
        if self._sampled_n >= SAMPLE_FLUSH or int(t1.max()) // b > int(first.min()) // b:
            self.flush_sample()

    def flush_sample(self) -> None:
        """Credit what `sample` holds: before exact ends that follow it, and before a
        reader reads (`view/snapshot.py`)."""
        if not self._sampled:
            return
        parts, self._sampled, self._sampled_n = self._sampled, [], 0
        flows, tp = self.flows, self.throughput
        b = tp.bucket_ns
        rank, dst, v, t1 = (np.concatenate([x[k] for x in parts]) for k in range(4))
        ops = [o for x in parts for o in x[4]]
        w = np.concatenate([np.full(len(x[0]), x[5]) for x in parts])
        e = t1 // b
        for keys, fn in (((rank, dst, e), self._credit_edges), ((rank, e), self._credit_ops)):  # oldest bucket first
            order = np.lexsort(keys)
            cols = [k[order] for k in keys]
            cut = np.flatnonzero(np.any([c[1:] != c[:-1] for c in cols], axis=0)) + 1
            fn(order, np.r_[0, cut], rank, dst, v, w, t1, e, ops, flows, tp)

    @staticmethod
    def _credit_edges(order, starts, rank, dst, v, w, t1, e, ops, flows, tp) -> None:
        sums = np.add.reduceat(v[order], starts)
        last = np.maximum.reduceat(t1[order], starts)
        at = order[np.r_[starts[1:], len(order)] - 1]  # each group's last end: its op
        for src, d, x, t, k in zip(rank[at].tolist(), dst[at].tolist(), sums.tolist(), last.tolist(), at.tolist()):
            flows.credit(src, d, x, MODELLED, t, t, ops[k], tp)

    @staticmethod
    def _credit_ops(order, starts, rank, dst, v, w, t1, e, ops, flows, tp) -> None:
        n = np.add.reduceat(w[order], starts)
        at = order[starts]
        for r, b, x in zip(rank[at].tolist(), e[at].tolist(), n.tolist()):
            tp.add_op(r, b, x)

    def _position(self, members: list[int], rank: int) -> int | None:
        """`rank`'s index in `members`, from an index built once per members list."""
        got = self._index.get(id(members))
        if got is None or got[0] is not members:
            if len(self._index) >= 4096:
                self._index.clear()
            got = self._index[id(members)] = (members, {r: i for i, r in enumerate(members)})
        return got[1].get(rank)

    def ring_ends(self, ends: "RingEnds", slow: list[tuple]) -> None:
        """Many ends at once, in position order, leaving what `op_end` one at a time
        would leave, to the bit: `ends` of collectives that did not fail, `slow`
        (pos, args, kwargs) of `op_end` calls to interleave by position.

        A run of ring ends whose transfers lie in the newest bucket of both flows and
        throughput is applied in columns (`_ring_run`): within such a run no bucket
        opens or closes, so each sum it touches only grows, and `np.add.at` adds in
        index order, the order `op_end` would. Every other end (a transfer over two
        buckets, a late one, one that opens a bucket, any other pattern) goes through
        `op_end` in its place, and the runs after it are found again."""
        if self._sampled:
            self.flush_sample()  # exact ends go in after the estimate that came before them
        flows, tp = self.flows, self.throughput
        op_end = self.op_end
        b = flows.bucket_ns
        n = len(ends.pos)
        e = ends.t1 // b
        ring = (ends.dst >= 0) & ((ends.start >= ends.t1) | (ends.start // b == e)) & (b == tp.bucket_ns)
        slow_at = np.searchsorted(ends.pos, np.fromiter((x[0] for x in slow), np.int64, len(slow)))
        j, ns = 0, len(slow)
        state = None
        i = hi = 0
        while i < n or j < ns:
            while j < ns and (i >= n or slow_at[j] <= i):
                op_end(*slow[j][1], **slow[j][2])
                j += 1
            if i >= n:
                continue
            if state != (flows.newest, tp.newest) or i >= hi:
                # The ends that cannot go in a run, over a window ahead: a chunk that
                # spans many buckets costs a window per bucket, not the whole chunk.
                state = (flows.newest, tp.newest)
                lo, hi = i, min(n, i + RUN_WINDOW)
                odd = lo + np.flatnonzero(~(ring[lo:hi] & (e[lo:hi] == flows.newest) & (e[lo:hi] == tp.newest)))
            stop = min(int(odd[k]) if (k := np.searchsorted(odd, i)) < len(odd) else hi,
                       int(slow_at[j]) if j < ns else n)
            if stop > i and self._ring_run(ends, i, stop):
                i = stop
                continue
            for k in range(i, max(stop, i + 1)):  # one by one: an odd end, or a run `_ring_run` declined
                g = int(ends.sig[k])
                op_end(int(ends.rank[k]), ends.ops[g], int(ends.nbytes[k]), int(ends.t0[k]), int(ends.t1[k]),
                       failed=False, root=ends.roots[g], members=ends.members[g], arrived=int(ends.arrived[k]),
                       weight=ends.weight)
            i = max(stop, i + 1)

    def _ring_run(self, ends: "RingEnds", lo: int, hi: int) -> bool:
        """Ends lo..hi-1, ring transfers inside the newest bucket, in columns; False
        (nothing done) where a new edge would push the table past `MAX_EDGES` (its
        eviction is for `op_end`) or a rank does not pack into a key."""
        flows, tp = self.flows, self.throughput
        rank, dst, v, t1 = ends.rank[lo:hi], ends.dst[lo:hi], ends.v[lo:hi], ends.t1[lo:hi]
        if hi - lo < RUN_MIN or rank.min() < 0 or max(int(rank.max()), int(dst.max())) >= 1 << 31:
            return False
        edges = flows.edges
        ukey, first, inv = unique((rank << 32) | dst, index=True, inverse=True)
        keys = [(k >> 32, k & 0xFFFFFFFF) for k in ukey.tolist()]
        infos = [edges.get(k) for k in keys]
        by_first = np.argsort(first, kind="stable").tolist()  # the keys in the order of their first credit
        new = [i for i in by_first if infos[i] is None]
        if len(edges) + len(new) > MAX_EDGES:
            return False
        for i in new:
            infos[i] = edges[keys[i]] = [0.0, 0.0, 0, ""]
        inv = inv.reshape(-1)
        # the edges' totals, newest times and last ops
        total = np.array([x[MODELLED] for x in infos])
        np.add.at(total, inv, v)
        newest_t = np.zeros(len(keys), np.int64)
        np.maximum.at(newest_t, inv, t1)
        last = np.zeros(len(keys), np.int64)
        np.maximum.at(last, inv, np.arange(hi - lo))
        ops, sig = ends.ops, ends.sig[lo:hi]
        for x, tot, t, k in zip(infos, total.tolist(), newest_t.tolist(), sig[last].tolist()):
            x[MODELLED] = tot
            if t > x[LAST_T]:
                x[LAST_T] = t
            x[LAST_OP] = ops[k]
        # the newest bucket's cells
        bucket = flows.buckets.get(flows.newest)
        if bucket is None:
            bucket = flows.buckets[flows.newest] = {}
        cells = [bucket.get(k) for k in keys]
        for i in by_first:
            if cells[i] is None:
                cells[i] = bucket[keys[i]] = [0.0, 0.0]
        part = np.array([c[MODELLED] for c in cells])
        np.add.at(part, inv, v)
        for c, x in zip(cells, part.tolist()):
            c[MODELLED] = x
        # throughput's open bucket: ops and bytes sent per rank, bytes received per rank
        _acc_add(tp._ops, rank, np.full(hi - lo, ends.weight))
        _acc_add(tp._tx, rank, v)
        _acc_add(tp._rx, dst, v)
        return True

    def op_end(self, rank: int, op: str, nbytes: int, t0: int, t1: int, *, failed: bool = False,
               peer: int = -1, root: int = -1, members: list[int] | None = None, arrived: int = 0,
               weight: float = 1.0) -> None:
        """`rank` finished `op` moving `nbytes` between wall ns `t0` and `t1`. For a
        collective: its group's `members` (global ranks, group order) and when the
        last of them arrived (the time before that was waiting, not moving). `weight`:
        the ops it stands for (a sample's end: `RingEnds.weight`)."""
        if self._sampled and weight == 1.0:
            self.flush_sample()  # exact ends go in after the estimate that came before them
        tp = self.throughput
        tp.add_op(rank, t1 // tp.bucket_ns, weight)
        if failed:
            return
        pat = PATTERNS.get(op, NOTHING)
        if pat == NOTHING:
            return
        flows = self.flows
        if pat == SEND:
            if peer >= 0 and peer != rank and nbytes > 0:
                flows.credit(rank, peer, float(nbytes), EXACT, t0, t1, op, tp)
            return
        if members is None or nbytes <= 0:
            return
        n = len(members)
        i = self._position(members, rank)
        if n < 2 or i is None:
            return
        if t0 < arrived < t1:
            t0 = arrived
        if pat == RING_2:
            flows.credit(rank, members[(i + 1) % n], 2.0 * (n - 1) / n * nbytes, MODELLED, t0, t1, op, tp)
        elif pat == RING_1:
            flows.credit(rank, members[(i + 1) % n], (n - 1) / n * nbytes, MODELLED, t0, t1, op, tp)
        else:
            for src, dst, v, kind in edge_bytes(op, nbytes, rank, members, root=root):
                flows.credit(src, dst, v, kind, t0, t1, op, tp)
