"""The wire schema: round trips, and clear errors for anything else."""

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commviz.events import (
    SCHEMA_VERSION,
    Batch,
    FrameError,
    Goodbye,
    GroupDef,
    OpEnd,
    OpStart,
    decode_batch,
    encode_batch,
)
from tests.helpers import hello


def test_round_trip_keeps_every_field():
    evs = [
        hello(0),
        GroupDef("0", [0, 1], "gloo", "default_pg"),
        OpStart(1, 100, "send", "0", 0, 4096, "float32", [1024], peer=1, is_async=True),
        OpEnd(1, 200, error="RuntimeError: boom", bytes=8, peer=1),
        Goodbye(300, dropped=2),
    ]
    b = decode_batch(encode_batch(3, evs))
    assert b.rank == 3 and b.schema == 1  # nothing newer in it: a schema-1 reader reads it
    assert b.events == evs


def test_a_stop_marker_is_stamped_with_the_schema_that_has_it():
    from commviz.events import STOPPED_SINCE, Stopped

    st = Stopped(500, "commviz record", "hang", 20.0)
    b = decode_batch(encode_batch(2, [st], schema=STOPPED_SINCE))
    assert b.schema == 2 and b.events == [st]
    assert st.text() == "stopped by commviz record after 20 s (hang)"
    assert Stopped(1, "commviz record", "Ctrl-C").text() == "stopped by commviz record (Ctrl-C)"


def test_an_unknown_kind_from_a_newer_writer_says_to_upgrade():
    """What an older reader cannot decode, a newer schema number explains."""
    future = msgspec.msgpack.encode([SCHEMA_VERSION + 1, 0, [["teleport", 1, 2]]])
    with pytest.raises(FrameError, match=f"event schema {SCHEMA_VERSION + 1}.*upgrade commviz"):
        decode_batch(future)
    same = msgspec.msgpack.encode([SCHEMA_VERSION, 0, [["teleport", 1, 2]]])
    with pytest.raises(FrameError, match="undecodable frame"):
        decode_batch(same)


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x00", b"garbage that is not msgpack", msgspec.msgpack.encode({"a": 1}), msgspec.msgpack.encode([1, 2])],
)
def test_garbage_is_a_frame_error(payload):
    with pytest.raises(FrameError, match="undecodable frame"):
        decode_batch(payload)


def test_wrong_field_type_is_rejected():
    bad = msgspec.msgpack.encode([SCHEMA_VERSION, 0, [["start", "not-an-int", 1, "x", "0", 0, 0]]])
    with pytest.raises(FrameError, match="Expected `int`"):
        decode_batch(bad)


def test_newer_schema_says_to_upgrade():
    newer = msgspec.msgpack.encode(Batch(SCHEMA_VERSION + 1, 0, []))
    with pytest.raises(FrameError, match="upgrade commviz"):
        decode_batch(newer)


def test_negative_rank_is_rejected():
    with pytest.raises(FrameError, match="negative rank"):
        decode_batch(encode_batch(-1, []))


def test_stack_events_round_trip():
    from commviz.events import Frame, Stack

    st = Stack(5, 3, "MainThread", [Frame("/home/me/train.py", 88, "step", "dist.all_reduce(t)")],
               ["/venv/lib/python3.11/site-packages/torch"])
    b = decode_batch(encode_batch(0, [st, Stack(6, 4)]))
    assert b.events == [st, Stack(6, 4, "", [], [])]


def test_frames_from_an_older_writer_still_load():
    """Fields are only ever appended with defaults: a frame written before
    `batched/bucket/params` (OpStart) and `ring` (Hello) existed decodes with defaults."""
    old_start = ["start", 1, 100, "all_reduce", "0", 0, 4096, "float32", [1024], -1, -1, False, "SUM"]
    h = hello(0)
    old_hello = ["hello", *[getattr(h, f) for f in h.__struct_fields__[:12]]]
    b = decode_batch(msgspec.msgpack.encode([1, 0, [old_hello, old_start]]))
    hh, s = b.events
    assert hh.ring == "" and hh.cuda_uuid is None
    assert (s.batched, s.bucket, s.params) == (False, -1, 0)


def test_host_topology_is_a_schema_2_kind_and_a_schema_1_frame_still_decodes():
    """i17's additions: the HostTopology kind (schema 2) and OpEnd's CUDA fields
    (appended with defaults, so a frame from an older writer reads as host-timed ops)."""
    from commviz.events import BASE_SCHEMA, HOST_TOPOLOGY_SINCE, HostTopology, OpEnd

    assert HOST_TOPOLOGY_SINCE == 2 > BASE_SCHEMA
    ht = HostTopology(5, "node0", {"gpus": [{"index": 0}]})
    b = decode_batch(encode_batch(1, [ht], schema=HOST_TOPOLOGY_SINCE))
    assert b.schema == 2 and b.events == [ht]
    old = msgspec.msgpack.encode([1, 0, [["end", 7, 100, "", -1, -1]]])  # an older writer's OpEnd
    (end,) = decode_batch(old).events
    assert (end.id, end.device_ns, end.enqueue_ns, end.captured) == (7, -1, -1, False)
    cuda_end = OpEnd(8, 200, device_ns=1500, enqueue_ns=30, captured=True)
    assert decode_batch(encode_batch(0, [cuda_end])).events == [cuda_end]


def test_an_older_reader_ignores_the_cuda_fields_of_an_op_end():
    class OldOpEnd(msgspec.Struct, tag="end", array_like=True, omit_defaults=True):  # schema 1's
        id: int
        t: int
        error: str = ""
        bytes: int = -1
        peer: int = -1

    from commviz.events import OpEnd

    got = msgspec.msgpack.decode(msgspec.msgpack.encode(OpEnd(8, 200, bytes=4, device_ns=1500)), type=OldOpEnd)
    assert (got.id, got.t, got.bytes) == (8, 200, 4)


record_value = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=300),
                         st.lists(st.integers(0, 2**40), max_size=70).map(tuple),
                         st.lists(st.integers(-5, 2**33), max_size=20))


@settings(max_examples=300, deadline=None)
@pytest.mark.native
@given(st.lists(st.one_of(st.lists(record_value, max_size=20), st.lists(record_value, max_size=20).map(tuple)),
                max_size=40),
       st.integers(0, 2**20), st.integers(1, 3))
def test_frames_are_the_bytes_msgspec_writes_whatever_the_records_hold(records, rank, schema):
    """The probe's frames are packed in C where it is built (commviz/_fastpack.c):
    every record of plain values, at every msgpack size class, is written as msgspec
    writes it, so a reader (and a trace file) cannot tell which wrote it."""
    from commviz import events

    evs = [*records, hello(rank), GroupDef("0", [0, 1], "gloo"), OpEnd(3, 4, error="e" * 40)]
    assert events._encode_batch is not events._msgspec_batch, "commviz/_fastpack.c was not built (pip install -e .)"
    assert encode_batch(rank, evs, schema) == events._msgspec_batch(schema, rank, evs)


def folded_op(values):
    """A folded op's record (events.py) with these start values and the last as its
    end's time."""
    from commviz.events import FOLDED, START_LEN

    return [FOLDED, *values[: START_LEN - 1], values[-1]]


an_int = st.integers(-(2**63), 2**64 - 1)
# [id, 11 more start values, the end's time]
folded_ops = st.tuples(an_int, st.lists(record_value, min_size=11, max_size=11), an_int).map(
    lambda v: folded_op([v[0], *v[1], v[2]]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.lists(record_value, max_size=20), folded_ops), max_size=40),
       st.integers(0, 2**20), st.integers(2, 9))
@pytest.mark.native
def test_a_folded_op_is_written_as_its_start_and_end_and_counted_twice(records, rank, most):
    """A blocking op's end folded into its start (probe/_fastwrap.c) is, on the wire,
    the two events msgspec would write for the start and its end; it counts as two
    events, and frames are cut to at most `most` events without parting the two."""
    from commviz import events

    assert events.FOLDS, "commviz/_fastpack.c was not built, or does not write folded ops as msgspec would"
    assert encode_batch(rank, records) == events._msgspec_batch(1, rank, events.unfold(records))
    n = len(events.unfold(records))
    assert events.events_in(records) == n
    ends = events.cuts(records, most)
    assert ends == sorted(ends) and (ends[-1] == len(records) if records else ends == [])
    lo = 0
    for hi in ends:
        assert 0 < events.events_in(records[lo:hi]) <= most
        lo = hi


@pytest.mark.native
def test_a_folded_op_too_big_for_a_frame_loses_its_start_alone():
    """A start over the wire's frame limit (a huge shape) is lost and counted, as
    before folding; its end still goes."""
    from commviz import events

    huge = folded_op([7, 0, "all_reduce", "0", 3, 4, "float32", tuple(range(60_000)), -1, -1, False, "", 9])
    got = list(events.encode_frames(0, [huge]))
    assert [n for _, n in got] == [1, 1] and got[0][0] is None
    assert decode_batch(got[1][0]).events[0] == OpEnd(7, 9)


@pytest.mark.native
def test_a_record_like_a_folded_op_but_not_one_is_written_as_it_is():
    """Only FOLDED, compared by identity, marks a folded op: a 14-item list ending in
    an int, or one whose first item is a string of its repr, is a record like any
    other."""
    from commviz import events

    like = [["start", *range(12), 5], [str(events.FOLDED), *range(12), 5]]
    assert events.events_in(like) == 2
    assert encode_batch(0, like) == events._msgspec_batch(1, 0, like)
    # a folded op whose end's time is not an int: msgspec writes the unfolded pair
    odd = [folded_op([*range(12), True])]
    assert encode_batch(0, odd) == events._msgspec_batch(1, 0, events.unfold(odd))


def test_a_record_the_packer_does_not_take_is_encoded_by_msgspec_and_its_errors_kept():
    from commviz import events

    odd = [("start", 1, 2.5, "x"), ("end", 2**64, 0)]  # a float, an int past 64 bits (msgspec: an error)
    assert encode_batch(0, odd[:1]) == events._msgspec_batch(1, 0, odd[:1])
    with pytest.raises(OverflowError):
        events._msgspec_batch(1, 0, odd)
    with pytest.raises(OverflowError):
        encode_batch(0, odd)


def test_a_frame_head_the_packer_does_not_take_is_msgspecs_to_encode():
    from commviz import events

    evs = [("end", 1, 2, "", -1, -1)]
    assert encode_batch(True, evs) == events._msgspec_batch(1, True, evs)  # a bool rank, as msgspec writes it
    with pytest.raises(OverflowError):
        encode_batch(0, evs, 2**64)
