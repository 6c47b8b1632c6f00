"""The batch path (`Model.ingest`, `model/columns.py`) leaves exactly the state
the per-event path leaves, on traces full of what makes it fall back: drops, resends,
errors, desyncs, p2p, unknown groups, a restart, device times, stragglers."""

from __future__ import annotations

import array
import collections
import dataclasses
import enum
import random

import msgspec
import numpy as np
import pytest

from commviz.events import Counters, Goodbye, GroupDef, Hello, Mark, OpEnd, OpStart, Sample, encode_batch
from commviz.model import Model, audit, columns, ledger, store
from commviz.model import plan as plan_mod
from commviz.model import flows as flows_mod
from commviz.model.seen import SeenIds
from commviz.model.track import Instance
from tests.helpers import group, hello, op


def _trace(seed: int, ranks: int = 6, steps: int = 400, wall0: int = 10**18) -> list[tuple[int, object]]:
    """(rank, event) in arrival order: ranks flush in frames of a few steps each, out of step."""
    rng = random.Random(seed)
    world = list(range(ranks))
    evens = [r for r in world if r % 2 == 0]
    mono = [10**12 * (1 + r // 3) for r in world]
    per_rank: list[list] = [[Hello(r, r, ranks, f"h{r // 3}", 100 + r, "gloo", "cpu", "2", "0", "job",
                                   mono[r], wall0), GroupDef("0", world, "gloo"), GroupDef("e", evens, "gloo")]
                            for r in world]
    ids = [0] * ranks
    seqs = {("0", r): 0 for r in world} | {("e", r): 0 for r in evens}
    p2p = {}
    late = rng.randrange(ranks)
    t = 0
    for step in range(steps):
        t += rng.randrange(50_000, 200_000)
        noisy = 3.0 if step % 150 < 8 else 0.01  # spells of trouble, clean runs between
        kind = rng.random()
        gid = "e" if kind < 0.15 else "0"
        members = evens if gid == "e" else world
        if kind > 1 - 0.07 * min(noisy, 1.0) - 0.01:  # a send/recv pair between two ranks
            a, b = rng.sample(world, 2)
            k = p2p.get((a, b), 0)
            p2p[(a, b)] = k + 1
            for r, op, peer in ((a, "send", b), (b, "recv", a)):
                s = OpStart(ids[r], mono[r] + t, op, "0", k, 256, "float32", [64], peer=peer)
                per_rank[r] += [s, OpEnd(ids[r], mono[r] + t + rng.randrange(1000, 9000))]
                ids[r] += 1
            continue
        name = rng.choice(["all_reduce", "all_reduce", "broadcast", "all_to_all", "reduce_scatter_tensor"])
        nbytes = rng.choice([4096, 1 << 20])
        for r in members:
            seq = seqs[(gid, r)]
            seqs[(gid, r)] += 1
            arrive = t + rng.randrange(1000, 20_000) + (rng.randrange(50_000, 90_000) if r == late else 0)
            b = nbytes
            dtype = "float32"
            if rng.random() < 0.01 * noisy:
                b = nbytes * 2  # a desync
            if rng.random() < 0.005 * noisy:
                dtype = "bfloat16"
            s = OpStart(ids[r], mono[r] + arrive, name, gid, -1 if rng.random() < 0.01 * noisy else seq, b, dtype, [b // 4],
                        root=0 if name == "broadcast" else -1, reduce_op="sum" if name == "all_reduce" else "")
            end_t = mono[r] + t + 100_000 + rng.randrange(0, 3000)
            err = "RuntimeError: peer gone" if rng.random() < 0.004 * noisy else ""
            dev = rng.randrange(10_000, 90_000) if rng.random() < 0.3 else -1
            captured = dev < 0 and rng.random() < 0.01 * noisy  # captured into a CUDA graph: untimed
            first = dev >= 0 and rng.random() < 0.02 * noisy  # first on its communicator: untimed
            e = OpEnd(ids[r], end_t, error=err, bytes=b * 2 if rng.random() < 0.01 * noisy else -1, device_ns=dev,
                      captured=captured, first=first)
            ids[r] += 1
            roll = rng.random()
            roll /= noisy
            if roll < 0.01:
                per_rank[r].append(e)  # its start was dropped: an orphan end
            elif roll < 0.02:
                per_rank[r].append(s)  # its end was dropped: left in flight
            elif roll < 0.03:
                per_rank[r] += [s, s, e]  # resent after a reconnect
            else:
                per_rank[r] += [s, e]
        r = rng.randrange(ranks)
        if rng.random() < 0.05:
            per_rank[r].append(Counters(mono[r] + t, dropped=rng.randrange(3)))
        if rng.random() < 0.02:
            per_rank[r].append(Sample(mono[r] + t, {"cpu": rng.random()}))
        if rng.random() < 0.01:
            per_rank[r].append(Mark(mono[r] + t, f"step {step}"))
        if step == steps // 2:  # a rank reconnects (same pid) and says hello again
            per_rank[r].append(Hello(r, r, ranks, f"h{r // 3}", 100 + r, "gloo", "cpu", "2", "0", "job",
                                     mono[r] + t, wall0 + t))
        if step == steps // 3:
            per_rank[r].append(GroupDef("x", [r], "gloo"))  # a group of one, late
    for r in world:
        if r != late:
            per_rank[r].append(Goodbye(mono[r] + t + 10**9))
    # arrival order: each rank flushes its events in frames of a few, a frame arrives a
    # little after its newest event (a rank's frames stay in order)
    frames = []
    for r in world:
        evs, i = per_rank[r], 0
        arrive = 0
        while i < len(evs):
            n = rng.randrange(1, 16)
            newest = max((getattr(ev, "t", 0) - mono[r] for ev in evs[i:i + n]), default=0)
            arrive = max(arrive, newest + rng.randrange(0, 400_000))
            frames.append((arrive, r, evs[i:i + n]))
            i += n
    frames.sort(key=lambda f: (f[0], f[1]))
    out = [(r, ev) for _, r, evs in frames for ev in evs]
    return out


def _plain(x):
    """`x` as plain, comparable data, every field of every object it holds: a field a
    later change adds is compared without anyone listing it."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (msgspec.Struct, str, bytes, int, float, bool, type(None), enum.Enum)):
        return x
    if dataclasses.is_dataclass(x):
        return type(x).__name__, {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return [(_plain(k), _plain(v)) for k, v in x.items()]  # in order: the order is read
    if isinstance(x, (list, tuple, collections.deque, array.array)):
        return [_plain(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted(map(repr, x))
    if isinstance(x, random.Random):
        return x.getstate()
    if isinstance(x, np.random.Generator):
        return x.bit_generator.state
    slots = [s for k in type(x).__mro__ for s in getattr(k, "__slots__", ())]
    attrs = vars(x) if hasattr(x, "__dict__") else {s: getattr(x, s) for s in slots if hasattr(x, s)}
    assert attrs or callable(x), f"_plain cannot compare a {type(x).__name__}"
    name = type(x).__name__
    return name, {k: _plain(v) for k, v in attrs.items() if (name, k) not in CACHES}


# Fields of the model's parts that hold nothing a reader sees, and why.
CACHES = {("Traffic", "_index"): "members' indices by the id() of their list: a lookup cache"}


def _unordered(d: dict) -> list:
    """A table the batch path fills in another order; nothing reads its order."""
    return sorted((k, _plain(v)) for k, v in d.items())


# How the harness compares each field of the model and of a rank's state: by `_plain`
# unless said here; the fields left out, and why. A field on neither side fails
# `test_the_harness_compares_every_field_or_says_why_not`.
PENDING_FIELDS = {"op", "group", "seq", "bytes", "durations", "errors", "ended", "starts", "failed", "last_arrival"}
MODEL_AS = {
    "stats": _unordered,
    "pending": lambda d: ([(k, _plain(v.op), v.bytes, _unordered(v.durations), v.errors, sorted(v.ended),
                            sorted((r, f.start, f.t_wall) for r, f in v.starts.items()), _unordered(v.failed),
                            v.last_arrival) for k, v in d.items()]),  # in order: the eviction's
    "ranks": lambda d: sorted((k, _rank_state(r)) for k, r in d.items()),
    "tracker": lambda t: (sorted(_plain(t.pairs)), t.evicted_instances, t.evicted_pairs),  # (its pending is `pending`)
    "desync_history": lambda d: [(k, v.message) for k, v in d.items()],
}
MODEL_LEFT_OUT = {
    "thresholds": "what the caller made the model with",
    "keep_ops": "what the caller made the model with",
    "flows": "what the caller made the model with",
    "on_op": "what the caller made the model with (a hook)",
    "on_mark": "what the caller made the model with (a hook)",
}
RANK_AS = {
    "per_op": _unordered, "per_group": _unordered, "seqs": _unordered, "sample": _unordered,
    "inflight": lambda d: [(k, f.start, f.t_wall) for k, f in d.items()],
    "seen_ids": lambda s: (s.floor, s.top, s.runs()),
    # what it holds, oldest first, not where in its ring or under which group code
    "windows": lambda w: (list(w.ended), w.dropped_before, w.maxlen),
}
RANK_LEFT_OUT: dict[str, str] = {}


def _rank_state(r) -> dict:
    return {f.name: RANK_AS.get(f.name, _plain)(getattr(r, f.name))
            for f in dataclasses.fields(r) if f.name not in RANK_LEFT_OUT}


def _state(m: Model) -> dict:
    """Everything the model holds that a view, a diagnosis or a later event can read:
    every field, and the answers read from them."""
    m.traffic.throughput.flush()  # (what it adds up between reads goes in when one reads)
    out = {k: MODEL_AS.get(k, _plain)(v) for k, v in vars(m).items() if k not in MODEL_LEFT_OUT}
    flows = m.traffic.flows
    out.update({
        "flow_rates": flows.rates(m.last_t),
        "throughput": [m.traffic.throughput.series(m.last_t, 40, rank) for rank in (None, 0, 1)],
        "throughput_rings": _rings(m.traffic.throughput),
        "summary": m.summary(), "rows": m.rank_rows(m.last_t),
    })
    return out


def test_the_harness_compares_every_field_or_says_why_not():
    """A field added to the model or a rank's state is compared by `_state`, in its own
    way or by `_plain`, unless it is put among those left out, with the reason."""
    m = Model()
    m.ingest(0, hello(0, 2))
    assert set(MODEL_AS) <= set(vars(m)) and set(MODEL_LEFT_OUT) <= set(vars(m))
    names = {f.name for f in dataclasses.fields(m.ranks[0])}
    assert set(RANK_AS) <= names and set(RANK_LEFT_OUT) <= names
    assert not set(MODEL_AS) & set(MODEL_LEFT_OUT) and not set(RANK_AS) & set(RANK_LEFT_OUT)
    # (an open instance is compared field by field, by hand: these must be all of its fields)
    assert PENDING_FIELDS == {f.name for f in dataclasses.fields(Instance)}
    state = _state(m)
    assert set(vars(m)) - set(MODEL_LEFT_OUT) <= set(state)
    assert set(state["ranks"][0][1]) == names - set(RANK_LEFT_OUT)


def _rings(tp) -> list:
    """Every bucket the throughput holds, totals and per rank."""
    tp.flush()
    rings = [("all", tp.total)] + sorted(tp.ranks.items())
    return [(k, list(r.stamp), list(r.tx), list(r.rx), list(r.ops)) for k, r in rings]


def _feed_in_batches(m: Model, trace: list, rng: random.Random) -> None:
    i = 0
    while i < len(trace):
        n = rng.choice([1, 7, 300, 900, 2500, 6000])
        part = trace[i:i + n]
        m.ingest([r for r, _ in part], [ev for _, ev in part])
        i += n


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    """Batches small enough that a short trace exercises the splits and the edges."""
    monkeypatch.setattr(columns, "MIN_BATCH", 64)
    monkeypatch.setattr(columns, "MAX_BATCH", 2048)
    monkeypatch.setattr(flows_mod, "RUN_MIN", 2)  # flows' runs in columns too
    # and a window of recent ops short enough to overflow (the audit's is 8,192)
    monkeypatch.setattr(ledger, "WINDOWS", 16)
    monkeypatch.setattr(audit.Windows.__init__, "__defaults__", (16,))


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("flows", [False, True, "fine"])
def test_batches_leave_the_state_one_event_at_a_time_leaves(seed, flows, monkeypatch):
    if flows == "fine":
        # Buckets of 50 µs, rings long enough for the whole trace: a transfer (~100 µs
        # here) is spread over several, so where it starts — its collective's last
        # member's arrival before its end, which in arrival order often comes after
        # other members' ends — shows in the throughput rings.
        monkeypatch.setattr(flows_mod.FlowModel.__init__, "__defaults__", (50_000,))
        monkeypatch.setattr(flows_mod.Throughput.__init__, "__defaults__", (50_000, 4096, 4096))
    trace = _trace(seed)
    one, many = Model(flows=bool(flows)), Model(flows=bool(flows))
    for r, ev in trace:
        one.ingest(r, ev)
    taken = _spy_fast(monkeypatch)
    _feed_in_batches(many, trace, random.Random(seed))
    assert sum(taken) > 0  # the fast path ran (and its effects are in the state compared)
    assert _state(many) == _state(one)
    one.end_of_trace()
    many.end_of_trace()
    assert many.summary() == one.summary()


def _spy_fast(monkeypatch) -> list[int]:
    """How many events each batch took the fast path for."""
    taken: list[int] = []
    real = ledger.apply_plan

    def spy(model, plan):
        taken.append(int(plan.fast.sum()))
        return real(model, plan)

    monkeypatch.setattr(ledger, "apply_plan", spy)
    return taken


def test_the_batch_path_takes_most_events_of_a_clean_run(monkeypatch):
    """Not a timing: the fast path must actually be taken, or the batch path is only
    the slow path with extra steps."""
    taken = _spy_fast(monkeypatch)
    m = Model()
    ranks, events = [], []
    for r in range(4):
        ranks += [r, r]
        events += [Hello(r, r, 4, "h", 1 + r, "gloo", "cpu", "2", "0", "j", 0, 10**18), GroupDef("0", [0, 1, 2, 3], "gloo")]
    for i in range(1000):
        for r in range(4):
            ranks += [r, r]
            events += [OpStart(i, 1000 * i + r, "all_reduce", "0", i, 64), OpEnd(i, 1000 * i + 900)]
    m.ingest(ranks, events)
    assert sum(taken) > 0.95 * 8000
    assert m.summary()["ops"][0]["count"] == 1000
    assert m.ranks[3].ops_done == 1000 and m.ranks[3].seen_ids.floor == 999


def test_shedding_in_batches_counts_what_it_sheds():
    """While shedding the batch path counts a holed collective at once, where one
    event at a time holds it open (model/retired.py): `pending` and the sweeps may
    differ, what shedding keeps exact may not."""
    trace = _trace(3)
    one, many = Model(), Model()
    one.shed = many.shed = True
    for r, ev in trace:
        one.ingest(r, ev)
    _feed_in_batches(many, trace, random.Random(3))
    assert _counts(many) == _counts(one)
    assert many.shed_ops > 0 and one.shed_ops > 0


@pytest.mark.native
def test_columns_read_in_c_are_the_columns_read_in_python():
    """model/_fastcols.c reads a batch's fields by slot; it must read what the Python
    reader does, and decline (leaving it to Python) what it cannot hold."""
    assert store._fastcols is not None  # (tests/conftest.py: skipped where not built, failed in CI)
    evs = [ev for _, ev in _trace(3)]
    evs += [OpStart(7, 8, "send", "0", 0, 16, peer=1), OpEnd(7, 9, error="boom", bytes=3, device_ns=5),
            Counters(1, dropped=2), Sample(1, {"cpu": 0.5}), Mark(1, "m"), Goodbye(5)]
    for s in (evs, tuple(evs)):
        got, want = store._read_c(s), store._read(s)
        for a, b in zip(got[:6], want[:6]):
            assert a.dtype == b.dtype and a.tolist() == b.tolist()
        assert got[6:] == want[6:]
    bad = evs[:10] + [OpStart(1, 2**70, "all_reduce", "0", 1, 4)]  # no int64 holds its time
    assert store._read_c(bad) is None
    with pytest.raises(OverflowError):
        store._read(bad)


def test_a_slow_end_keeps_its_group_among_fast_ends_of_another(monkeypatch):
    """A rank's window entry keeps its group when its end goes the slow way and no
    start of the batch names that group, among fast ops of several signatures that
    share one group."""
    head = []
    for r in range(2):
        head += [(r, Hello(r, r, 2, "h", 1 + r, "gloo", "cpu", "2", "0", "j", 0, 10**18)),
                 (r, GroupDef("0", [0, 1], "gloo")), (r, GroupDef("x", [0, 1], "gloo"))]
    first = head + [(0, OpStart(0, 10, "all_reduce", "x", 0, 64))]
    second = []
    for i in range(1, 200):
        for r in range(2):
            op_id = i - r  # rank 0's id 0 is the op of group x
            second += [(r, OpStart(op_id, 1000 * i + r, "all_reduce", "0", i - 1, 64 << (i % 2))),
                       (r, OpEnd(op_id, 1000 * i + 900))]
    second.insert(len(second) - 6, (0, OpEnd(0, 20)))  # among the newest, so it stays in the window
    one, many = Model(), Model()
    for r, ev in first + second:
        one.ingest(r, ev)
    taken = _spy_fast(monkeypatch)
    for part in (first, second):
        many.ingest([r for r, _ in part], [ev for _, ev in part])
    assert sum(taken) > 700  # the fast path ran
    assert _state(many) == _state(one)
    assert ("x", 10, 20) in many.ranks[0].windows.ended


def _frames_of(part: list) -> list:
    """`part` ((rank, event) in order) as the watcher gets it: each run of one rank's
    events a frame, read into columns (`store.decode_frame`)."""
    out, i = [], 0
    while i < len(part):
        j = i
        while j < len(part) and part[j][0] == part[i][0]:
            j += 1
        out.append(store.decode_frame(encode_batch(part[i][0], [ev for _, ev in part[i:j]])))
        i = j
    return out


@pytest.mark.parametrize("seed", range(6))
def test_batches_of_frames_read_into_columns_leave_the_same_state(seed, monkeypatch):
    """The watcher's way: frames read straight into columns, joined into an EventStore,
    each event's object made only where the per-event path takes it."""
    trace = _trace(seed)
    one, many = Model(), Model()
    for r, ev in trace:
        one.ingest(r, ev)
    taken = _spy_fast(monkeypatch)
    rng, i = random.Random(seed), 0
    while i < len(trace):
        n = rng.choice([1, 7, 300, 900, 2500, 6000])
        s = store.EventStore.join(_frames_of(trace[i:i + n]))
        many.ingest(s.rank, s)
        i += n
    assert sum(taken) > 0
    assert _state(many) == _state(one)


def _lossy_run(ranks: int, steps: int, per_frame: int, lose: float, seed: int) -> list[tuple[int, object]]:
    """A clean ring of all_reduce whose ranks flush `per_frame` steps a frame, a share
    `lose` of the frames lost on the way (a client's queue full)."""
    rng = random.Random(seed)
    out = []
    for r in range(ranks):
        out += [(r, Hello(r, r, ranks, "h", 1 + r, "gloo", "cpu", "2", "0", "j", 0, 10**18)),
                (r, GroupDef("0", list(range(ranks)), "gloo"))]
    for lo in range(0, steps, per_frame):
        for r in range(ranks):
            frame = []
            for i in range(lo, min(steps, lo + per_frame)):
                frame += [OpStart(i, 1000 * i + r, "all_reduce", "0", i, 64), OpEnd(i, 1000 * i + 900)]
            if rng.random() >= lose:
                out += [(r, ev) for ev in frame]
    return out


def _one_and_many(monkeypatch, trace: list, one: Model | None = None, many: Model | None = None) -> tuple:
    """`trace` into `one` an event at a time and into `many` in one `ingest`,
    which must leave the same state; (one, many, events each batch took fast)."""
    one, many = one or Model(), many or Model()
    for r, ev in trace:
        one.ingest(r, ev)
    taken = _spy_fast(monkeypatch)
    many.ingest([r for r, _ in trace], [ev for _, ev in trace])
    assert _state(many) == _state(one)
    return one, many, taken


def test_op_ids_further_apart_than_the_seen_window_go_the_per_event_way(monkeypatch):
    """One event at a time, a start far above the rest makes the ids SPAN below it
    count as seen, so an older start after it is a duplicate: the batch must agree."""
    monkeypatch.setattr(SeenIds, "SPAN", 1000)
    trace = [(r, ev) for r in range(2) for ev in (hello(r), group())]
    for i in range(300):
        trace += [(r, ev) for r in range(2) for ev in op(i, 1000 * i + r, 1000 * i + 500, seq=i)]
    trace += [(0, ev) for ev in op(5000, 400_000, 400_500, seq=300)]  # far above: the window moves
    trace += [(0, ev) for ev in op(300, 401_000, 401_500, seq=301)]  # now below it: a duplicate
    one, many, _ = _one_and_many(monkeypatch, trace)
    assert one.duplicates == many.duplicates == 1


def test_a_rank_whose_ids_rise_further_than_the_seen_window_goes_fast_uncut(monkeypatch):
    """Behind a flood a batch holds a few of each rank's frames from far apart, its ids
    spanning more than SeenIds.SPAN. Ids that only rise never meet a duplicate one
    event at a time, so the rank goes fast however far they span: the batch is not
    cut (five cuts a batch, each planning the rest again, took a third of a flooded
    watcher's model at 64 ranks) and leaves the state one event at a time leaves."""
    monkeypatch.setattr(SeenIds, "SPAN", 1000)
    cuts = []
    real = plan_mod._span_cut
    monkeypatch.setattr(plan_mod, "_span_cut", lambda x, r: cuts.append(real(x, r)) or cuts[-1])
    trace = _lossy_run(ranks=4, steps=3000, per_frame=20, lose=0.0, seed=5)
    trace = [(r, ev) for r, ev in trace if not isinstance(ev, (OpStart, OpEnd)) or ev.id % 100 < 20]  # frames lost
    _, many, taken = _one_and_many(monkeypatch, trace)
    assert cuts and not any(c is not None for c in cuts)
    assert sum(taken) > 0.9 * len(trace)


def _jumpy_run(seed: int, ranks: int = 4, steps: int = 6000, per_frame: int = 20) -> list[tuple[int, object]]:
    """A ring of all_reduce whose ranks each lose runs of frames (their ids jump past
    the seen window), hold a frame back and send it after later ones (their ids go
    down, near or far), or send one twice at once."""
    rng = random.Random(seed)
    out = _lossy_run(ranks=ranks, steps=0, per_frame=per_frame, lose=0.0, seed=seed)  # hellos, the group
    held: list[tuple[int, list]] = []  # (due at step, frame)
    lost = dict.fromkeys(range(ranks), 0)
    for k, lo in enumerate(range(0, steps, per_frame)):
        for r in range(ranks):
            frame = [(r, ev) for i in range(lo, lo + per_frame)
                     for ev in (OpStart(i, 1000 * i + r, "all_reduce", "0", i, 64), OpEnd(i, 1000 * i + 900))]
            if lost[r]:
                lost[r] -= 1
            elif rng.random() < 0.04:
                lost[r] = rng.randrange(10, 120)
            elif (x := rng.random()) < 0.03:
                held.append((k + rng.choice([1, 3, 60, 100]), frame))
            else:
                out += frame * (2 if x > 0.98 else 1)
        for h in [h for h in held if h[0] <= k]:
            out += h[1]
            held.remove(h)
    return out + [ev for _, frame in held for ev in frame]


@pytest.mark.parametrize("seed", [11, 25, 35])
@pytest.mark.parametrize("shed", [False, True])
def test_ids_that_jump_far_and_go_down_leave_the_same_state(seed, shed, monkeypatch):
    """Whichever ranks the batch path takes fast (ids rising however far), bounds
    (ids going down) or cuts, it must count the same duplicates and leave the same
    state as one event at a time (while shedding: each rank's counts, bytes, seqs and
    seen ids; which collectives are counted yet, and which still held open for a
    member, differs between the two ways while shedding, by design). The seeds are
    ones where taking a rank fast although its ids went down past the window
    miscounts."""
    monkeypatch.setattr(SeenIds, "SPAN", 1000)
    trace = _jumpy_run(seed)
    rng = random.Random(seed)
    one, many = Model(), Model()
    many.shed = one.shed = shed
    for r, ev in trace:
        one.ingest(r, ev)
    taken = _spy_fast(monkeypatch)
    i = 0
    while i < len(trace):
        n = rng.choice([300, 900, 2500, 9000])
        part = trace[i:i + n]
        many.ingest([r for r, _ in part], [ev for _, ev in part])
        i += n
    assert one.duplicates > 0
    assert many.duplicates == one.duplicates
    assert sum(taken) > 0.2 * len(trace)
    if shed:
        assert _counts(many)["ranks"] == _counts(one)["ranks"]
    else:
        assert _state(many) == _state(one)


def test_in_one_batch_a_rank_whose_ids_fall_far_is_cut_and_one_whose_ids_rise_far_goes_fast(monkeypatch):
    """Rank 0 sends a frame from far back (a late one, its ids going down past the
    window) while rank 1's ids rise past the window: the one cut is rank 0's, just
    before the late frame, and everything before it goes fast. (After it the late ops
    are duplicates, which go one at a time, and with them rank 0's next step.)"""
    monkeypatch.setattr(SeenIds, "SPAN", 1000)
    cuts = []
    real = plan_mod._span_cut
    monkeypatch.setattr(plan_mod, "_span_cut", lambda x, r: cuts.append(real(x, r)) or cuts[-1])
    trace = _lossy_run(ranks=2, steps=0, per_frame=20, lose=0.0, seed=0)

    def frame(rank: int, first_id: int, first_seq: int) -> list:
        return [(rank, ev) for j in range(20) for ev in (
            OpStart(first_id + j, 1000 * (first_seq + j) + rank, "all_reduce", "0", first_seq + j, 64),
            OpEnd(first_id + j, 1000 * (first_seq + j) + 900))]

    for step in range(4):
        trace += frame(0, 5000 + 20 * step, 20 * step) + frame(1, 3000 * step, 20 * step)
        if step == 2:  # ids 2,000..2,019, never sent before, below rank 0's 5,059 by more than the window
            trace += frame(0, 2000, 1000)
    one, many, taken = _one_and_many(monkeypatch, trace)
    assert one.duplicates == many.duplicates == 20
    assert len([c for c in cuts if c is not None]) == 1  # rank 1's far rises cut nothing
    assert sum(taken) == 3 * 2 * 20 * 2  # every start and end of the first three steps


def test_a_rank_whose_ids_go_down_further_than_the_seen_window_is_taken_and_the_batch_ends(monkeypatch):
    """Two processes claiming one rank (an old one's late frames among a restarted
    one's): its ids go down by more than the window. The cut must still shorten the
    batch (it once cut at 0 and planned the same batch forever)."""
    monkeypatch.setattr(SeenIds, "SPAN", 1000)
    trace = [(r, ev) for r in range(2) for ev in (hello(r), group())]
    for i in range(5000, 5300):
        trace += [(r, ev) for r in range(2) for ev in op(i, 1000 * i + r, 1000 * i + 500, seq=i - 5000)]
    trace += [(0, ev) for ev in op(3, 6_000_000, 6_000_500, seq=300)]
    _one_and_many(monkeypatch, trace)


def test_a_rank_far_from_itself_at_every_start_is_not_planned_once_a_start(monkeypatch):
    """Ids SPAN apart at every start, going down: each cut would take one op. Planning
    again the rest after each was quadratic in the batch (16,000 events took 6 s): a
    batch makes at most MAX_SPAN_CUTS."""
    monkeypatch.setattr(SeenIds, "SPAN", 1000)
    cuts = []
    real = plan_mod._span_cut

    def spy(x, r):
        cut = real(x, r)
        if cut is not None:
            cuts.append(cut)
        return cut

    monkeypatch.setattr(plan_mod, "_span_cut", spy)
    trace = [(r, ev) for r in range(2) for ev in (hello(r), group())]
    for i in range(2000):
        trace += [(r, ev) for r in range(2) for ev in op(1000 * (2000 - i), 1000 * i + r, 1000 * i + 500, seq=i)]
    _one_and_many(monkeypatch, trace)
    batches = -(-(len(trace) - 4) // columns.MAX_BATCH)
    assert len(cuts) == batches * columns.MAX_SPAN_CUTS  # each one plans the rest again


def test_a_lost_frame_costs_only_its_own_instances_the_fast_path(monkeypatch):
    """A gap in a rank's op ids (its frame lost) used to send every op of that rank in
    the batch, and so every collective it belongs to, the per-event way."""
    trace = _lossy_run(ranks=4, steps=2000, per_frame=20, lose=0.0, seed=0)
    lost = [(r, ev) for r, ev in trace if not (r == 2 and isinstance(ev, (OpStart, OpEnd)) and 500 <= ev.id < 520)]
    _, many, taken = _one_and_many(monkeypatch, lost)
    assert sum(taken) > 0.9 * len(lost)
    seen = many.ranks[2].seen_ids
    assert seen.floor == 499 and seen.runs() == [(520, 1999)] and seen.top == 1999


@pytest.mark.parametrize("per_frame,lose,seed,every", [(10, 0.03, 4, 4096), (50, 0.01, 0, 4096),
                                                       (50, 0.03, 4, 4096), (100, 0.0, 1, 4096),
                                                       (10, 0.03, 4, 256), (50, 0.03, 4, 512)])
def test_stale_instances_piling_up_are_swept_where_the_per_event_path_sweeps(per_frame, lose, seed, every, monkeypatch):
    """Frames lost at a steady rate leave instances that never complete; the per-event
    path sweeps them at its checks (every `SWEEP_EVERY` events) once too many are open,
    counting the collectives in progress too (a rank's frame opens as many as it holds
    steps). The batch path must neither run across that sweep nor skip it, and must
    stay in bulk around it: a flood of lost frames is when it is needed most (it used
    to go one event at a time until the sweep had run, and fell to a tenth)."""

    monkeypatch.setattr(ledger, "SWEEP_FIRST", 64)
    monkeypatch.setattr(ledger, "SWEEP_EVERY", every)
    trace = _lossy_run(ranks=4, steps=3000, per_frame=per_frame, lose=lose, seed=seed)
    one = Model()
    for r, ev in trace:
        one.ingest(r, ev)
    assert one.sweeps >= 1
    taken = _spy_fast(monkeypatch)
    whole, parts = Model(), Model()
    whole.ingest([r for r, _ in trace], [ev for _, ev in trace])
    _feed_in_batches(parts, trace, random.Random(5))
    for many in (whole, parts):
        assert _state(many) == _state(one) and many.sweeps == one.sweeps
    # (what stays slow: the lost frames' orphan ends, and instances a batch's edge cut)
    # (one `ingest` of these traces took 0-75 % in bulk when a sweep sent the
    # batch one event at a time, 92-99 % now; a check every 512 events cuts frames of
    # 50 steps often: 74 % of both models' events here)
    assert sum(taken) >= (0.8 if every >= 4096 else 0.7) * 2 * len(trace)


def test_an_instance_a_member_never_entered_goes_in_bulk_and_stays_open(monkeypatch):
    """A collective whose members present all entered and left, a member's start lost:
    the per-event path leaves it open (until a sweep retires it); so must the batch
    path, without going one event at a time."""
    trace = _lossy_run(ranks=4, steps=400, per_frame=20, lose=0.0, seed=0)
    lost = [(r, ev) for r, ev in trace if not (r == 1 and isinstance(ev, OpStart) and 100 <= ev.id < 120)]
    opened = []
    real = ledger.Openings.open
    monkeypatch.setattr(ledger.Openings, "open", lambda self, i: (opened.append(i), real(self, i)))
    _, many, taken = _one_and_many(monkeypatch, lost)
    # the 20 left open, and instances a batch's edge cut (opened here, completed by the next)
    assert len(opened) >= 20 and sorted(k[1] for k in many.pending) == list(range(100, 120))
    assert sum(taken) > 0.95 * (len(lost) - 20)  # all but rank 1's orphan ends


def test_an_end_that_enters_a_collective_evicted_while_it_was_inside_keeps_that_collective_slow(monkeypatch):
    """A rank inside (g, 0) when `pending` evicted it leaves it in the next batch: its
    end enters (g, 0) again, and the other members' start and end there must join
    that instance, as one at a time, not be opened afresh beside it."""

    monkeypatch.setattr(ledger, "SWEEP_FIRST", 2)
    monkeypatch.setattr(ledger, "SWEEP_EVERY", 1)
    monkeypatch.setattr(ledger, "MAX_PENDING", 2)
    pre = [(r, GroupDef("g", [0, 1, 2], "gloo")) for r in range(3)] + [(1, Counters(1)), (2, Counters(1))]
    pre += [(0, OpStart(0, 10, "all_reduce", "g", 0, 64))]  # rank 0 enters seq 0 and stays inside
    for s in range(1, 6):  # rank 0 alone in seqs 1..5: the others' frames lost
        pre += [(0, OpStart(s, 10 + s, "all_reduce", "g", s, 64)), (0, OpEnd(s, 11 + s))]
    batch = [(0, OpEnd(0, 100))]
    for r in (1, 2):
        batch += [(r, OpStart(0, 101, "all_reduce", "g", 0, 64)), (r, OpEnd(0, 102))]
    ids = {0: 6, 1: 1, 2: 1}
    for s in range(6, 120):
        batch += [(r, OpStart(ids[r], 200 + s, "all_reduce", "g", s, 64)) for r in range(3)]
        batch += [(r, OpEnd(ids[r], 201 + s)) for r in range(3)]
        for r in range(3):
            ids[r] += 1
    one, many = Model(), Model()
    for m in (one, many):
        for r, ev in pre:
            m.ingest(r, ev)
        m.sweep_at = 100
    assert ("g", 0) not in many.pending and many.tracker.evicted_instances
    _, _, taken = _one_and_many(monkeypatch, batch, one, many)
    assert sum(taken) > 0.9 * len(batch)


@pytest.mark.parametrize("nbytes,wall", [(-1, 10**18), (64, 0)])
def test_an_instance_left_open_keeps_bytes_and_arrival_from_zero(nbytes, wall, monkeypatch):
    """`Tracker` keeps an instance's bytes and latest arrival from 0 up: a start of -1
    bytes, or a clock before the epoch, leaves them at 0."""
    trace = []
    for r in range(4):
        trace += [(r, Hello(r, r, 4, "h", 1 + r, "gloo", "cpu", "2", "0", "j", 10**15, wall)),
                  (r, GroupDef("0", [0, 1, 2, 3], "gloo"))]
    for i in range(200):
        trace += [(r, OpStart(i, 10**12 + 1000 * i + r, "all_reduce", "0", i, nbytes))
                  for r in range(4) if not (r == 1 and i == 50)]  # rank 1's start of seq 50 lost
        trace += [(r, OpEnd(i, 10**12 + 1000 * i + 900)) for r in range(4)]
    _, many, _ = _one_and_many(monkeypatch, trace)
    assert many.pending[("0", 50)].bytes >= 0 and many.pending[("0", 50)].last_arrival >= 0


def _counts(m: Model) -> dict:
    """What shedding keeps exact: every rank's counts, bytes, seqs and seen ids, and
    each (op, group)'s collectives counted (the summary's op table)."""
    ranks = {rank: (r.ops_done, r.bytes_done, sorted(r.per_op.items()), sorted(r.per_group.items()),
                    sorted(r.seqs.items()), r.seen_ids.floor, r.seen_ids.runs())
             for rank, r in sorted(m.ranks.items())}
    return {"ranks": ranks, "ops": [(o["op"], o["group"], o["count"], o["bytes"]) for o in m.summary()["ops"]]}


@pytest.mark.parametrize("lose,seed", [(0.05, 0), (0.3, 1), (0.6, 2)])
def test_shedding_a_lossy_run_counts_each_collective_once_in_bulk(lose, seed, monkeypatch):
    """Behind a flood nearly every collective arrives holed. While shedding, the batch
    path counts such an instance where its last member present leaves, instead of
    holding it open for a member that never comes (what made the watcher fall to a
    tenth of its rate); the counts are those one event at a time gives, and those of
    the trace itself."""
    trace = _lossy_run(ranks=4, steps=3000, per_frame=20, lose=lose, seed=seed)
    one, whole, parts = Model(), Model(), Model()
    for m in (one, whole, parts):
        m.shed = True
    for r, ev in trace:
        one.ingest(r, ev)
    taken = _spy_fast(monkeypatch)
    whole.ingest([r for r, _ in trace], [ev for _, ev in trace])
    _feed_in_batches(parts, trace, random.Random(seed))
    ended = {ev.id for _, ev in trace if isinstance(ev, OpEnd)}  # seq == id in this run
    for m in (whole, parts):
        assert _counts(m) == _counts(one)
        assert m.summary()["ops"][0]["count"] == len(ended)
        assert len(m.pending) < 50  # only instances a batch's edge cut stay open
    assert sum(taken) > 0.9 * 2 * len(trace)


def test_a_late_member_of_an_instance_counted_while_shedding_counts_for_its_rank_only(monkeypatch):
    """Rank 2's frame comes a batch late: the instances ranks 0 and 1 left were counted
    already; rank 2's ops count for rank 2, and no instance is counted twice or left
    open for it — one event at a time or in batches, during the spell or after it."""
    monkeypatch.setattr(columns, "MIN_BATCH", 8)
    hello = [(r, ev) for r in range(3) for ev in (Hello(r, r, 3, "h", 1 + r, "gloo", "cpu", "2", "0", "j", 0, 10**18),
                                                   GroupDef("0", [0, 1, 2], "gloo"))]

    def ops(r: int, lo: int, hi: int) -> list:
        return [(r, ev) for i in range(lo, hi)
                for ev in (OpStart(i, 1000 * i + r, "all_reduce", "0", i, 64), OpEnd(i, 1000 * i + 900))]

    early = ops(0, 0, 50) + ops(1, 0, 50)
    late = ops(2, 0, 50)
    for spell_ends in (False, True):
        one, many = Model(), Model()
        for m in (one, many):
            m.ingest([r for r, _ in hello], [ev for _, ev in hello])
            m.shed = True
        for r, ev in early:
            one.ingest(r, ev)
        many.ingest([r for r, _ in early], [ev for _, ev in early])
        assert many.summary()["ops"][0]["count"] == 50 and not many.pending
        for m in (one, many):
            m.shed = not spell_ends
        for r, ev in late:
            one.ingest(r, ev)
        many.ingest([r for r, _ in late], [ev for _, ev in late])
        for m in (one, many):
            assert m.summary()["ops"][0]["count"] == 50 and not m.pending
            assert m.ranks[2].ops_done == 50 and m.ranks[2].bytes_done == 50 * 64 and m.ranks[2].seqs["0"] == 49
        assert _counts(many) == _counts(one)


def test_while_shedding_instances_held_open_one_event_at_a_time_do_not_keep_batches_slow(monkeypatch):
    """Instances the per-event path left open, nobody inside (ranks 0 and 1 came, 2 and
    3 not yet), made every batch holding their other members go one event at a time,
    each leaving more open: behind producers that lose most frames, the watcher fell
    to ~85k events/s. While shedding, a batch first counts those instances, as it
    counts a holed one of its own; the late members then count for their ranks only."""
    monkeypatch.setattr(columns, "MIN_BATCH", 8)
    hello = [(r, ev) for r in range(4) for ev in (Hello(r, r, 4, "h", 1 + r, "gloo", "cpu", "2", "0", "j", 0, 10**18),
                                                   GroupDef("0", [0, 1, 2, 3], "gloo"))]

    def ops(r: int, lo: int, hi: int) -> list:
        return [(r, ev) for i in range(lo, hi)
                for ev in (OpStart(i, 1000 * i + r, "all_reduce", "0", i, 64), OpEnd(i, 1000 * i + 900))]

    early, late = ops(0, 0, 200) + ops(1, 0, 200), ops(2, 0, 200) + ops(3, 0, 200)
    one, many = Model(), Model()
    for m in (one, many):
        m.ingest([r for r, _ in hello], [ev for _, ev in hello])
        m.shed = True
        for r, ev in early:  # a batch that went one event at a time
            m.ingest(r, ev)
        assert len(m.pending) == 200
    for r, ev in late:
        one.ingest(r, ev)
    taken = _spy_fast(monkeypatch)
    many.ingest([r for r, _ in late], [ev for _, ev in late])
    assert sum(taken) == len(late)
    for m in (one, many):
        assert m.summary()["ops"][0]["count"] == 200 and not m.pending
    assert _counts(many) == _counts(one)


def test_outside_a_spell_nothing_is_counted_early(monkeypatch):
    """Without shedding, a holed instance stays open as before (a late member completes
    it with its timing): the counting-early rule belongs to the spell only."""
    trace = _lossy_run(ranks=4, steps=600, per_frame=20, lose=0.2, seed=3)
    one, many, _ = _one_and_many(monkeypatch, trace)
    assert not many.retired and len(many.pending) == len(one.pending) > 0


def test_while_shedding_a_hang_in_a_batch_is_still_found(monkeypatch):
    """Starts with no end in the batch open instances as before: three ranks inside a
    collective the fourth never came to is a hang, shedding or not."""
    monkeypatch.setattr(columns, "MIN_BATCH", 8)
    trace = _lossy_run(ranks=4, steps=200, per_frame=20, lose=0.2, seed=7)
    trace += [(r, OpStart(200, 10**9, "all_reduce", "0", 200, 64)) for r in (0, 1, 2)]
    m = Model(hang_after_s=1.0)
    m.shed = True
    m.ingest([r for r, _ in trace], [ev for _, ev in trace])
    [d] = m.findings(now=10**18 + 5 * 10**9 + 10**9).diagnoses
    assert d.kind.value == "hang" and d.missing_ranks == [3] and d.seq == 200


def test_a_spell_begins_above_the_instances_still_open():
    """When shedding begins, the counted keys start below the lowest instance still
    open (a late member may complete it) and what every member has reached."""
    m = Model()
    for r in range(3):
        m.ingest(r, Hello(r, r, 3, "h", 1 + r, "gloo", "cpu", "2", "0", "j", 0, 10**18))
        m.ingest(r, GroupDef("0", [0, 1, 2], "gloo"))
    for i in range(10):
        for r in range(3):
            if i == 6 and r == 2:
                continue  # rank 2's frame of step 6 is late: (0, 6) stays open
            m.ingest(r, OpStart(i, 1000 * i, "all_reduce", "0", i, 64))
            m.ingest(r, OpEnd(i, 1000 * i + 10))
    assert list(m.pending) == [("0", 6)]
    m.shed = True
    assert m.retired["0"].floor == 5 and not m.counted("0", 6)
    m.ingest(2, OpStart(6, 6000, "all_reduce", "0", 6, 64))
    m.ingest(2, OpEnd(6, 6010))
    assert not m.pending and m.summary()["ops"][0]["count"] == 10


def test_while_shedding_flows_and_ops_are_estimated_from_a_sample():
    """Shedding used to drop flows whole, so the flow view, the links and the
    sparklines went dark exactly when the job was busiest. While it sheds, about one
    end in `SHED_FLOW_SAMPLE` is drawn, weighing that many: each link's bytes and each
    rank's ops come out near the exact figures, and every link of the ring shows."""
    trace = _lossy_run(ranks=16, steps=4000, per_frame=50, lose=0.0, seed=3)
    exact, sampled = Model(), Model()
    sampled.shed = True
    for m in (exact, sampled):
        m.ingest([r for r, _ in trace], [ev for _, ev in trace])
        m.traffic.flush_sample()  # as a snapshot does before it reads
        m.traffic.throughput.flush()
    for r in range(16):
        want = exact.traffic.flows.total(r, (r + 1) % 16)[1]
        got = sampled.traffic.flows.total(r, (r + 1) % 16)[1]
        assert want > 0 and abs(got - want) < 0.25 * want, (r, got, want)
    total = [sum(m.traffic.flows.total(r, (r + 1) % 16)[1] for r in range(16)) for m in (exact, sampled)]
    assert abs(total[1] - total[0]) < 0.05 * total[0]
    ops = [sum(m.traffic.throughput.total.ops) for m in (exact, sampled)]
    assert ops[0] == 16 * 4000 and abs(ops[1] - ops[0]) < 0.05 * ops[0]
    assert _counts(sampled) == _counts(exact)  # what shedding keeps exact, it keeps


def test_while_shedding_a_broadcast_is_estimated_as_its_own_pattern():
    """An end outside the ring patterns goes as `op_end` would, weighing the sample's
    share: the root's edges carry about what they carry exactly."""
    ranks, steps = 8, 3000
    trace = [(r, ev) for r in range(ranks) for ev in (hello(r, world=ranks, pid=1 + r), group("0", range(ranks)))]
    for i in range(steps):
        for r in range(ranks):
            trace += [(r, OpStart(i, 1000 * i + r, "broadcast", "0", i, 64, root=0)), (r, OpEnd(i, 1000 * i + 900))]
    exact, sampled = Model(), Model()
    sampled.shed = True
    for m in (exact, sampled):
        m.ingest([r for r, _ in trace], [ev for _, ev in trace])
        m.traffic.flush_sample()
    for dst in range(1, ranks):
        want, got = exact.traffic.flows.total(0, dst)[1], sampled.traffic.flows.total(0, dst)[1]
        assert want > 0 and abs(got - want) < 0.3 * want, (dst, got, want)
