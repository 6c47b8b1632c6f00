"""Events as the columns the batch path reads, each event's object made only when
something asks for it.

The batch path (`model/columns.py`) needs a few fields of each start and end; the
per-event path needs objects. Decoding every event into a msgspec Struct, then
reading its fields back into columns, was two thirds of what the watcher spent on an
event. A frame from the wire is instead read straight into rows of int64 columns
(`model/_fastcols.c`'s `frame`, where it is built): a `ColFrame`. Only the events the
per-event path takes (hellos, p2p, errors, instances cut by a batch's edge) become
objects, each decoded from its own bytes when asked (`EventStore.objects`).

An `EventStore` is a run of frames (columnar or decoded) and of other stores, in one
order: its columns and, per event, where its object comes from. `Chunk` takes one as
it takes a list of events.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple, Sequence

import msgspec
import numpy as np

from commviz import native
from commviz.events import SCHEMA_VERSION, Batch, Counters, Event, Mark, OpEnd, OpStart, Sample, decode_batch
from commviz.model.keys import unique

# Kinds a batch may hold and still take the fast path: none of them reads or changes
# state a fast instance touches. Every other kind (an Audit reads the in-flight table
# and windows, a Hello moves a clock offset, a GroupDef can complete instances, a
# Goodbye or Stack is rare enough to go slowly) is OTHER: `columns.ingest_chunk` cuts
# the chunk there and ingests it on its own.
START, END, QUIET, OTHER = 0, 1, 2, 3
_KIND = {OpStart: START, OpEnd: END, Counters: QUIET, Sample: QUIET, Mark: QUIET}

# A decoded frame's rows: R_N int64 per event (model/_fastcols.c writes them).
R_KIND, R_ID, R_T, R_SEQ, R_SIG, R_ERR, R_EBYTES, R_DEV, R_OFF, R_LEN, R_N = range(11)

_id, _t, _seq = attrgetter("id"), attrgetter("t"), attrgetter("seq")
_SIG = ("op", "group", "bytes", "dtype", "root", "reduce_op")
_TAIL = ("error", "bytes", "device_ns", "captured", "first")
_sig, _tail = attrgetter(*_SIG), attrgetter(*_TAIL)
_one = msgspec.msgpack.Decoder(Event)
_decode_one = _one.decode


def _bind_c():
    """model/_fastcols.c, handed the event types and where their fields lie; None
    where it is not built, or the types are not laid out as it reads them."""
    c = native.load("commviz.model._fastcols")
    if c is None:
        return None
    try:
        c.bind(OpStart, OpEnd, tuple(k for k, v in _KIND.items() if v == QUIET),
               tuple(OpStart.__dict__[f] for f in ("id", "t", "seq", *_SIG)),
               tuple(OpEnd.__dict__[f] for f in ("id", "t", *_TAIL)))
    except (TypeError, KeyError) as exc:
        native.declined("commviz.model._fastcols", f"the event layout changed ({exc})")
        return None
    return c


_fastcols = _bind_c()
_frame = getattr(_fastcols, "frame", None)


class ColFrame(msgspec.Struct, gc=False):
    """A valid frame read into rows (`_fastcols.frame`): `rows` R_N int64 per event,
    `sigs` its starts' distinct signatures, `objs` its events that are neither starts
    nor ends (None if none), `tmax` its starts' and ends' latest time. `events` decodes the whole frame, for code that wants
    objects. Not tracked by the cyclic collector (it holds no cycle): a queue of
    thousands of frames would otherwise be walked at every collection."""

    payload: bytes
    schema: int
    rank: int
    rows: bytes
    sigs: tuple
    objs: list | None
    tmax: int
    count: int
    decoded: list | None = None
    # where the payload lies, for a reader in another process (`trace/readahead.py`):
    # the index of its file among the trace's, and its offset there; -1 if not read from one
    file: int = -1
    at: int = -1

    @property
    def events(self) -> list:
        if self.decoded is None:
            self.decoded = decode_batch(self.payload).events
        return self.decoded


def decode_frame(payload: bytes) -> Batch | ColFrame:
    """`decode_batch`, as columns where the C reader takes the frame: the same events,
    the same validation (it declines what it is not sure of, and msgspec judges)."""
    if _frame is not None:
        got = _frame(payload, SCHEMA_VERSION, _decode_one)
        if got is not None:
            return ColFrame(payload, *got)
    return decode_batch(payload)


def _blank(m: int) -> tuple:
    """id, t, seq and sig columns for `m` events, as an event that has none of the
    field leaves them."""
    return np.full(m, -1, np.int64), np.zeros(m, np.int64), np.full(m, -1, np.int64), np.full(m, -1, np.int64)


def _pick(events: Sequence, idx: np.ndarray) -> tuple:
    if len(idx) == 1:
        return (events[int(idx[0])],)
    return itemgetter(*idx.tolist())(events) if len(idx) else ()


def _interned(keys: list) -> tuple[np.ndarray, list]:
    """Each key's code (its index among the distinct keys, in first-seen order) and
    the distinct keys: a batch's starts share a few signatures, its ends a few tails."""
    table = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return np.fromiter(map(table.__getitem__, keys), np.int64, len(keys)), list(table)


def _read(store: Sequence) -> tuple:
    """What a Chunk reads of each event object, in store order: kind, id and t (starts
    and ends), seq and signature code (starts), tail code (ends); and the two tables."""
    m = len(store)
    kind = np.fromiter(map(_KIND.get, map(type, store), repeat(OTHER)), np.int8, m)
    sp = np.flatnonzero(kind == START)
    ep = np.flatnonzero(kind == END)
    starts = _pick(store, sp)
    ends = _pick(store, ep)
    ident, t, seq, sig = _blank(m)
    tail = np.full(m, -1, np.int64)
    sigs: list = []
    tails: list = []
    if starts:
        ident[sp] = np.fromiter(map(_id, starts), np.int64, len(sp))
        t[sp] = np.fromiter(map(_t, starts), np.int64, len(sp))
        seq[sp] = np.fromiter(map(_seq, starts), np.int64, len(sp))
        sig[sp], sigs = _interned(list(map(_sig, starts)))
    if ends:
        ident[ep] = np.fromiter(map(_id, ends), np.int64, len(ep))
        t[ep] = np.fromiter(map(_t, ends), np.int64, len(ep))
        tail[ep], tails = _interned(list(map(_tail, ends)))
    return kind, ident, t, seq, sig, tail, sigs, tails


def _read_c(store: Sequence) -> tuple | None:
    """`_read` in one pass in C (model/_fastcols.c); None where it is not built or
    declines (then `_read` does it, and raises what it raises)."""
    if _fastcols is None or not isinstance(store, (list, tuple)):
        return None
    m = len(store)
    cols = (np.full(m, OTHER, np.int8), *_blank(m), np.full(m, -1, np.int64))
    sigs: list = []
    tails: list = []
    try:
        _fastcols.fill(store, *cols, {}, sigs, {}, tails)
    except Exception:  # an int past 64 bits, an empty slot: the Python reader says what is wrong
        return None
    return (*cols, sigs, tails)


def object_columns(store: Sequence) -> tuple:
    """Event objects' columns as a Chunk reads them: kind, id, t, seq, sig, err, ebytes,
    dev (an end's: an error, a captured or first op, its bytes, its device time), and the
    signature table `sig` indexes."""
    kind, ident, t, seq, sig, tail, sigs, tails = _read_c(store) or _read(store)
    m = len(kind)
    err, ebytes, dev = np.zeros(m, bool), np.full(m, -1, np.int64), np.full(m, -1, np.int64)
    if tails:
        e = np.flatnonzero(tail >= 0)
        codes = tail[e]
        err[e] = np.array([bool(k[0]) or bool(k[3]) or bool(k[4]) for k in tails], bool)[codes]
        ebytes[e] = np.array([k[1] for k in tails], np.int64)[codes]
        dev[e] = np.array([k[2] for k in tails], np.int64)[codes]
    return (kind, ident, t, seq, sig, err, ebytes, dev), sigs


def _bare(cls, names: Sequence[str], cols: Sequence, **fixed):
    """An instance of `cls` holding `cols` under `names` and `fixed`, its __init__ not
    run: what a reader in another process rebuilds from handed-over columns."""
    obj = object.__new__(cls)
    for f, a in (*zip(names, cols), *fixed.items()):
        setattr(obj, f, a)
    return obj


class Objects(NamedTuple):
    """Decoded events, each with its own rank: a part of an `EventStore` that is not
    one frame (a merge's events stamped one by one, a resumed merge's kept ones)."""

    events: list
    ranks: list


_COLS = ("kind", "id", "t", "seq", "sig", "err", "ebytes", "dev", "rank", "src", "pos", "off", "len")
PLACES = ("src", "pos", "off", "len")  # where each event's object comes from (`EventStore.objects`)


class EventStore:
    """Events of frames in one order, as columns; `store[i]` (or `objects(idx)`, many at
    once) makes the i-th event's object. Per event: `src` its frame (an index into
    `frames`), `pos` its index among that frame's events, `off`/`len` its bytes in the
    frame's payload (`len` -1: an object the frame already holds, `objs[off]` of a
    ColFrame)."""

    __slots__ = _COLS + ("frames", "sigs")

    def __len__(self) -> int:
        return len(self.kind)

    def columns(self) -> tuple:
        return self.kind, self.id, self.t, self.seq, self.sig, self.err, self.ebytes, self.dev

    @classmethod
    def join(cls, parts: Sequence) -> EventStore:
        """The events of `parts` (ColFrames, decoded Batches, EventStores) in order."""
        frames: list = []
        table: dict = {}
        blocks: list[tuple] = []
        run: list[ColFrame] = []
        for p in parts:
            if type(p) is ColFrame:
                run.append(p)
                continue
            if run:
                blocks.append(_col_block(run, frames, table))
                run = []
            if type(p) is EventStore:
                blocks.append(_store_block(p, frames, table))
            else:
                blocks.append(_object_block(p, frames, table))
        if run:
            blocks.append(_col_block(run, frames, table))
        s = object.__new__(cls)
        s.frames, s.sigs = frames, list(table)
        if len(blocks) == 1:
            cols = blocks[0]
        elif blocks:
            cols = [np.concatenate(c) for c in zip(*blocks)]
        else:
            cols = [np.zeros(0, np.int8 if f == "kind" else bool if f == "err" else np.int64) for f in _COLS]
        for f, c in zip(_COLS, cols):
            setattr(s, f, c)
        return s

    @classmethod
    def of_places(cls, frames, sigs: list, places: Sequence[np.ndarray]) -> EventStore:
        """A store that can only make its events' objects: `frames` and, per event,
        its `PLACES` among them (what a chunk asks of its store; a reader in another
        process rebuilds it so: `trace/readahead.py`)."""
        return _bare(cls, PLACES, places, frames=frames, sigs=sigs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._sub(i)
        return self.objects(np.array([i]))[0]

    def __iter__(self):
        return iter(self.objects(np.arange(len(self))))

    def take(self, idx: np.ndarray) -> EventStore:
        return self._sub(idx)

    def _sub(self, sel) -> EventStore:
        s = object.__new__(EventStore)
        s.frames, s.sigs = self.frames, self.sigs
        for f in _COLS:
            setattr(s, f, getattr(self, f)[sel])
        return s

    def objects(self, idx: np.ndarray, whole: dict[int, list] | None = None) -> list:
        """The objects of events `idx`: those a frame holds as they are, the rest
        decoded each from its own bytes; a frame asked for a third of its events or
        more is decoded whole (msgspec's speed on a batch) into `whole` (frame index ->
        its events: a caller asking again soon passes the same dict; kept on the frame,
        they would live as long as any event of it is carried)."""
        frames, out = self.frames, []
        one, add = _one.decode, out.append
        src = self.src[idx]
        if whole is None:
            whole = {}
        if len(src) > 64:
            asked = np.bincount(src, minlength=len(frames))
            short = False  # a frame not decoded whole: some events decoded one by one
            for f in np.flatnonzero(asked).tolist():
                if f in whole:
                    continue
                fr = frames[f]
                if type(fr) is not ColFrame or fr.decoded is not None:
                    whole[f] = fr.events
                elif asked[f] >= 4 and 3 * asked[f] >= fr.count:
                    whole[f] = decode_batch(fr.payload).events
                else:
                    short = True
            if not short:  # every one at hand: no branch per event
                return [whole[f][p] for f, p in zip(src.tolist(), self.pos[idx].tolist())]
        for f, p, o, n in zip(src.tolist(), self.pos[idx].tolist(), self.off[idx].tolist(),
                              self.len[idx].tolist()):
            w = whole.get(f)
            if w is not None:
                add(w[p])
                continue
            fr = frames[f]
            if type(fr) is not ColFrame or fr.decoded is not None:
                whole[f] = w = fr.events
                add(w[p])
            elif n < 0:
                add(fr.objs[o])
            else:
                add(one(fr.payload[o:o + n]))
        return out


def _col_block(run: list[ColFrame], frames: list, table: dict) -> tuple:
    """The columns of consecutive ColFrames: their rows joined, each start's signature
    renumbered into `table`."""
    base = len(frames)
    frames.extend(run)
    lut: list[int] = []
    first, counts, ranks, rows = [], [], [], []
    prev, at = None, 0
    for f in run:
        sg = f.sigs
        if sg is not prev:  # frames in a row share their signatures' tuple (model/_fastcols.c)
            at, prev = len(lut), sg
            lut += [table.setdefault(k, len(table)) for k in sg]
        first.append(at)
        counts.append(f.count)
        ranks.append(f.rank)
        rows.append(f.rows)
    rows = np.frombuffer(b"".join(rows), np.int64).reshape(-1, R_N)
    counts = np.array(counts, np.int64)
    src = np.repeat(np.arange(base, base + len(run), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    pos = np.arange(len(rows), dtype=np.int64) - np.repeat(starts, counts)
    local = rows[:, R_SIG]
    sig = np.full(len(rows), -1, np.int64)
    if lut:
        s = np.flatnonzero(local >= 0)
        sig[s] = np.array(lut, np.int64)[np.repeat(np.array(first, np.int64), counts)[s] + local[s]]
    rank = np.repeat(np.array(ranks, np.int64), counts)
    # views into the rows (no copies: a merge takes its chunk's events out by index)
    return (rows[:, R_KIND].astype(np.int8), rows[:, R_ID], rows[:, R_T], rows[:, R_SEQ], sig, rows[:, R_ERR] != 0,
            rows[:, R_EBYTES], rows[:, R_DEV], rank, src, pos, rows[:, R_OFF], rows[:, R_LEN])


def _object_block(b, frames: list, table: dict) -> tuple:
    """The columns of a decoded frame (anything with `rank` and `events`), or of
    `Objects`."""
    evs = b.events
    (kind, ident, t, seq, sig, err, ebytes, dev), sigs = object_columns(evs)
    m = len(evs)
    if sigs:
        lut = np.array([table.setdefault(k, len(table)) for k in sigs], np.int64)
        s = np.flatnonzero(sig >= 0)
        sig[s] = lut[sig[s]]
    frames.append(b)
    rank = np.array(b.ranks, np.int64) if type(b) is Objects else np.full(m, b.rank, np.int64)
    return (kind, ident, t, seq, sig, err, ebytes, dev, rank,
            np.full(m, len(frames) - 1, np.int64), np.arange(m, dtype=np.int64), np.zeros(m, np.int64),
            np.full(m, -1, np.int64))


def _store_block(st: EventStore, frames: list, table: dict) -> tuple:
    """An EventStore's columns, renumbered into the new frames and signatures; only
    the frames and signatures its events still use go on (a carried tail must not
    keep every frame of the batch it came from)."""
    used = np.zeros(len(st.frames), bool)
    used[st.src] = True
    keep = np.flatnonzero(used)
    src = (np.cumsum(used) - 1 + len(frames))[st.src]
    frames.extend(itemgetter(*keep.tolist())(st.frames) if len(keep) > 1 else [st.frames[int(k)] for k in keep])
    sig = _renumbered(st.sig, st.sigs, table)
    return (st.kind, st.id, st.t, st.seq, sig, st.err, st.ebytes, st.dev, st.rank, src, st.pos, st.off, st.len)


def _renumbered(sig: np.ndarray, sigs: list, table: dict) -> np.ndarray:
    """`sig` (codes into `sigs`; -1: no signature) as codes into `table`, which gains
    only the signatures `sig` uses: a carried tail's table must not keep every
    signature of the batch or chunk it came from."""
    s = np.flatnonzero(sig >= 0)
    if not len(s):
        return sig
    lut = np.full(len(sigs), -1, np.int64)
    codes = sig[s]
    for k in np.flatnonzero(np.bincount(codes, minlength=len(sigs))).tolist():  # (no sort)
        lut[k] = table.setdefault(sigs[k], len(table))
    sig = sig.copy()
    sig[s] = lut[codes]
    return sig


class _JoinedFrames:
    """A joined chunk's frames (`Chunk.joined`): first the carried tail's, each as
    (the frames it lies among, its index there), made only if asked for; then the
    next chunk's own. A tail carried again refers to the frames beneath, so no chain
    of these grows along a trace."""

    __slots__ = ("refs", "rest", "n")

    def __init__(self, refs: list, rest) -> None:
        self.refs, self.rest, self.n = refs, rest, len(refs)

    def __len__(self) -> int:
        return self.n + len(self.rest)

    def __getitem__(self, i: int):
        if i < self.n:
            frames, k = self.refs[i]
            return frames[k]
        return self.rest[i - self.n]

    def ref(self, i: int) -> tuple:
        return self.refs[i] if i < self.n else (self.rest, i - self.n)


def _frame_ref(frames, i: int) -> tuple:
    return frames.ref(i) if type(frames) is _JoinedFrames else (frames, i)


class Chunk:
    """Events to ingest in order, as columns.

    `store` holds the events in the order they were read, which is the order they lie
    in memory: a list of objects (their fields are read once, in that order: the CPU's
    caches reward it; reading them in ingest order, interleaved across ranks, costs
    twice as much) or an `EventStore` (columns already, objects made when asked).
    `at[i]` is the store index of the i-th event to ingest; the columns are in ingest
    order. `sig` numbers each start's (op, group, bytes, dtype, root, reduce_op) in
    `sigs`; `err`, `ebytes`, `dev` are each end's error-or-captured flag, bytes and
    device time."""

    def __init__(self, store: Sequence, ranks: np.ndarray, at: np.ndarray | None = None) -> None:
        if type(store) is EventStore:
            cols, sigs = store.columns(), store.sigs
        else:
            cols, sigs = object_columns(store)
        m = len(store)
        if at is None:
            at = np.arange(m, dtype=np.int64)
        else:
            cols, ranks = tuple(c[at] for c in cols), ranks[at]
        self.store, self.at, self.sigs = store, at, sigs
        (self.kind, self.id, self.t, self.seq, self.sig, self.err, self.ebytes, self.dev) = cols
        self.rank = ranks

    def __len__(self) -> int:
        return len(self.at)

    @classmethod
    def from_columns(cls, store: EventStore, sigs: list, cols: Sequence[np.ndarray]) -> "Chunk":
        """A chunk made elsewhere, rebuilt from its `COLUMNS` (a reader in another
        process hands them over: `trace/readahead.py`)."""
        return _bare(cls, COLUMNS, cols, store=store, sigs=sigs)

    def event(self, i: int):
        return self.store[self.at[i]]

    def events(self, idx: np.ndarray, whole: dict | None = None) -> list:
        """The objects of events `idx` (positions in the chunk); `whole`: see
        `EventStore.objects`."""
        if type(self.store) is EventStore:
            return self.store.objects(self.at[idx], whole)
        return list(_pick(self.store, self.at[idx]))

    @classmethod
    def joined(cls, a: "Chunk", b: "Chunk") -> "Chunk":
        """`a`'s events, then `b`'s, as one chunk: the tail a trace's chunk was cut
        at (its collectives still open, `traces.ingest_chunks`) put before the next.
        Both stores are EventStores; the new one refers to `a`'s frames, and makes
        none of them (a frame read again from the trace costs a read)."""
        sa, sb = a.store, b.store
        src = sa.src[a.at]
        used, inv = unique(src, inverse=True)
        refs = [_frame_ref(sa.frames, k) for k in used.tolist()]
        n = len(refs)
        places = [np.concatenate([inv.astype(np.int64), sb.src + n])]
        places += [np.concatenate([getattr(sa, f)[a.at], getattr(sb, f)]) for f in PLACES[1:]]
        table: dict = {}  # (the tail's signatures first, then the next chunk's)
        sig = np.concatenate([_renumbered(a.sig, a.sigs, table), _renumbered(b.sig, b.sigs, table)])
        sigs = list(table)
        store = EventStore.of_places(_JoinedFrames(refs, sb.frames), sigs, places)
        cols = []
        for f in _FIELDS:
            if f == "sig":
                cols.append(sig)
            elif f == "at":
                cols.append(np.concatenate([np.arange(len(a), dtype=np.int64), b.at + len(a)]))
            else:
                cols.append(np.concatenate([getattr(a, f), getattr(b, f)]))
        return _bare(cls, _FIELDS, cols, store=store, sigs=sigs)

    def part(self, lo: int, hi: int) -> "Chunk":
        """Events lo..hi-1, sharing the store and the table."""
        c = object.__new__(Chunk)
        c.store, c.sigs = self.store, self.sigs
        for f in _FIELDS:
            setattr(c, f, getattr(self, f)[lo:hi])
        return c


_FIELDS = ("at", "kind", "id", "t", "seq", "sig", "err", "ebytes", "dev", "rank")
COLUMNS = _FIELDS + ("times",)  # what a merge's chunk holds: its fields and each event's trace time
