"""The crash ring keeps the last 1,024 op starts and their ends, whatever a start
holds: a rank that aborts leaves its fatal op readable and no op with another's end."""

from commviz.events import OpEnd, OpStart, end_record, start_record
from commviz.trace.ring import SLOTS, RingWriter, read_ring

HUGE_SHAPE = [0] + [70000] * 59  # 60 dimensions: ~300 B of msgpack, more than a slot holds


def write_ops(path, n, shape_of=lambda i: [16], reduce_of=lambda i: "SUM", ended=lambda i: True):
    w = RingWriter(str(path), rank=3)
    for i in range(n):
        w.start(i, start_record(i, 1_000 + i, "all_reduce", "0", i, 64, "float32", shape_of(i), reduce_op=reduce_of(i)))
        if ended(i):
            w.end(i, 500_000 + i)
    return w


def by_id(events):
    starts = {e.id: e for e in events if isinstance(e, OpStart)}
    ends = {e.id: e for e in events if isinstance(e, OpEnd)}
    return starts, ends


def test_after_wrapping_reads_back_exactly_the_last_1024_with_their_ends(tmp_path):
    big = 1_050
    w = write_ops(tmp_path / "r.ring", 1_100, shape_of=lambda i: HUGE_SHAPE if i == big else [16])
    rank, _, events = read_ring(w.path)
    starts, ends = by_id(events)
    assert rank == 3
    assert sorted(starts) == list(range(1_100 - SLOTS, 1_100))
    assert {i: e.t for i, e in ends.items()} == {i: 500_000 + i for i in range(1_100 - SLOTS, 1_100)}
    # the huge start is kept without its shape; the op that slot held before is gone
    assert starts[big].shape == [] and starts[big].seq == big and starts[big].t == 1_000 + big
    assert big - SLOTS not in starts
    w.close(delete=True)


def test_the_fatal_op_with_a_huge_shape_is_recovered_in_flight(tmp_path):
    last = 1_099
    w = write_ops(tmp_path / "r.ring", 1_100, shape_of=lambda i: HUGE_SHAPE if i == last else [16],
                  ended=lambda i: i != last)
    starts, ends = by_id(read_ring(w.path)[2])
    assert last in starts and last not in ends
    assert last - SLOTS not in starts
    w.close(delete=True)


def test_a_start_too_big_even_without_its_shape_leaves_no_stale_op_behind(tmp_path):
    odd = 1_070
    w = write_ops(tmp_path / "r.ring", 1_100, reduce_of=lambda i: "X" * 300 if i == odd else "SUM")
    starts, ends = by_id(read_ring(w.path)[2])
    assert odd not in starts and odd - SLOTS not in starts and odd - SLOTS not in ends
    assert len(starts) == SLOTS - 1
    w.close(delete=True)


def test_records_built_for_the_queue_decode_as_the_events():
    import msgspec

    rec = start_record(7, 10, "send", "g", 2, 64, "float32", [16], peer=1, batched=True)
    s = msgspec.msgpack.decode(msgspec.msgpack.encode(rec), type=OpStart)
    assert (s.id, s.t, s.op, s.group, s.seq, s.bytes, s.shape, s.peer, s.batched) == (7, 10, "send", "g", 2, 64, [16], 1, True)
    e = msgspec.msgpack.decode(msgspec.msgpack.encode(end_record(7, 12, "", 8, 1)), type=OpEnd)
    assert (e.id, e.t, e.bytes, e.peer) == (7, 12, 8, 1)


def test_an_op_that_failed_is_read_back_as_failed_not_as_finished(tmp_path):
    """A rank that does not exit cleanly after an op failed (a peer died: torchrun
    kills the rest) leaves that op in its ring: it must not read back as a success."""
    from commviz.trace.ring import FAILED_IN_RING

    w = write_ops(tmp_path / "r.ring", 3, ended=lambda i: i < 2)
    w.end(2, 900_000, failed=True)
    starts, ends = by_id(read_ring(w.path)[2])
    assert sorted(starts) == [0, 1, 2]
    assert [ends[i].error for i in (0, 1)] == ["", ""]
    assert ends[2].error == FAILED_IN_RING and ends[2].t == 900_000
    w.close(delete=True)
