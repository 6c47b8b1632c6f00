"""A trace's chunk ends inside collectives: their events go in with the next chunk
(`traces.ingest_chunks`, `Chunk.joined`), so they take the batch path whole instead
of one event at a time, and the model ends exactly as without."""

import msgspec
import numpy as np
import pytest

from commviz.events import Goodbye, OpEnd, OpStart, encode_batch
from commviz.model import Model, columns, ledger, traces
from commviz.model.store import Chunk, _JoinedFrames
from commviz.trace import readahead
from commviz.trace.file import TraceWriter
from commviz.trace.stream import TraceStream, open_trace


def _ingest(path, child: bool, carry: bool, monkeypatch) -> tuple[Model, int, int]:
    """The model, how many tails were carried, how many events went one by one."""
    joined, slow = [], []
    with monkeypatch.context() as mp:
        mp.setattr(columns, "SETTLE_MIN", 2048)  # chunks of 3,000 events, cut near their ends
        mp.setattr(columns, "TAIL", 2048)
        mp.setattr(TraceStream.chunks, "__defaults__", (3000, False))  # the child's too: it is forked
        mp.setattr(readahead, "MIN_BYTES", 0 if child else 1 << 62)
        if not carry:
            mp.setattr(columns, "tail_cut", lambda c, groups=None: len(c))
        real_joined, real_apply = Chunk.joined.__func__, ledger.apply_plan
        mp.setattr(Chunk, "joined", classmethod(lambda cls, a, b: joined.append(1) or real_joined(cls, a, b)))
        mp.setattr(ledger, "apply_plan", lambda m, p: slow.append(len(p.chunk) - int(p.fast.sum())) or real_apply(m, p))
        s = open_trace(path)
        m = Model(hang_after_s=1.0, flows=False)
        chunks = readahead.chunks(s)
        assert isinstance(chunks, readahead.ChildMerge) == child
        traces.ingest_chunks(m, chunks, cut_off=s.truncated, snapshot=s.snapshot)
    return m, len(joined), sum(slow)


def _what_it_holds(m: Model) -> tuple:
    ranks = {k: (r.ops_done, r.bytes_done, sorted(r.per_op.items()), sorted(r.seqs.items()), r.seen_ids.floor,
                 r.seen_ids.runs(), list(r.windows.ended), r.last_op, r.last_start)
             for k, r in sorted(m.ranks.items())}
    return m.summary(), ranks, m.events, sorted(m.pending)


def _hung_job(path, synth, ops: int = 640) -> None:
    """bench/synth.py's job with op sizes that vary (many signatures), no goodbyes,
    and a last all_reduce, in frames of its own, that rank 5 never leaves: the last
    chunk ends inside a collective, so its tail is carried past the end (with 640
    ops, frames of it not read before are asked for after the merge has ended)."""
    w = TraceWriter(str(path))
    for r, evs in synth.frames(16, ops):
        evs = [msgspec.structs.replace(e, bytes=(4 << 20) + 4096 * (e.id % 7)) if type(e) is OpStart else e
               for e in evs if type(e) is not Goodbye]
        w.write(encode_batch(r, evs))
    for r in range(16):
        t0 = synth.host_mono0(r) + 10**12 // 2
        evs = [OpStart(id=ops, t=t0, op="all_reduce", group=synth.GROUP, seq=ops, bytes=4 << 20, dtype="float32",
                       shape=[1 << 20], reduce_op="sum")]
        if r != 5:
            evs.append(OpEnd(id=ops, t=t0 + 1000))
        w.write(encode_batch(r, evs))
    w.close()


@pytest.mark.parametrize("child", [False, True])
@pytest.mark.parametrize("job", ["clean", "hung"])
def test_a_trace_ingested_with_its_chunks_tails_carried_ends_the_same(tmp_path, synth, monkeypatch, child, job):
    p = tmp_path / "t.cvz"
    if job == "clean":
        synth.write(str(p), ranks=16, ops=600)
    else:
        _hung_job(p, synth)
    carried, joins, slow = _ingest(p, child, True, monkeypatch)
    plain, no_joins, slow_plain = _ingest(p, child, False, monkeypatch)
    assert joins > 3 and no_joins == 0
    assert _what_it_holds(carried) == _what_it_holds(plain)
    assert slow < slow_plain / 4  # the cut collectives went in bulk
    if job == "hung":
        assert ("0", 640) in carried.pending and len(carried.summary()["ops"]) == 1


def test_a_tail_carried_on_and_on_keeps_only_the_signatures_it_uses():
    from tests.helpers import op

    a = _chunk({0: op(0, 10, 20, "all_reduce", seq=0) + op(1, 30, 40, "broadcast", seq=1)})
    for k in range(2, 30):
        b = _chunk({0: op(k, 100 * k, 100 * k + 5, f"op{k}", seq=k)})
        a = Chunk.joined(a.part(len(a) - 2, len(a)), b)
    assert len(a.sigs) == 2 and [s[0] for s in a.sigs] == ["op28", "op29"]
    assert [e.op for e in a.events(np.arange(len(a))) if hasattr(e, "op")] == ["op28", "op29"]


def _chunk(events_by_rank: dict[int, list]):
    from commviz.events import encode_batch
    from commviz.model.store import EventStore, decode_frame

    frames = [decode_frame(encode_batch(r, evs)) for r, evs in events_by_rank.items()]
    store = EventStore.join(frames)
    return Chunk(store, store.rank)


def test_a_joined_chunk_holds_both_chunks_events_in_order_with_their_signatures():
    from tests.helpers import op

    a = _chunk({0: op(0, 10, 20, "all_reduce", seq=0) + op(1, 30, 40, "broadcast", seq=1)})
    b = _chunk({1: op(0, 50, 60, "all_gather", seq=0) + op(1, 70, 80, "all_reduce", seq=1)})
    tail = a.part(1, len(a))
    j = Chunk.joined(tail, b)
    want = tail.events(np.arange(len(tail))) + b.events(np.arange(len(b)))
    assert j.events(np.arange(len(j))) == want
    assert j.rank.tolist() == tail.rank.tolist() + b.rank.tolist()
    starts = np.flatnonzero(j.sig >= 0)
    assert [j.sigs[k][0] for k in j.sig[starts].tolist()] == [e.op for e in want if hasattr(e, "op")]
    # joined again, the frames refer to the stores beneath, never to an earlier join
    again = Chunk.joined(j.part(len(j) - 2, len(j)), a)
    assert again.events(np.arange(len(again))) == want[-2:] + a.events(np.arange(len(a)))
    assert all(type(f) is not _JoinedFrames for f, _ in again.store.frames.refs)
