"""The crash ring's C slot writers write what the Python ones write, byte for byte,
for every start the hot path can give them, and are the ones a built install uses."""

import msgspec
import pytest
import torch

from commviz.events import start_record
from commviz.trace import ring
from commviz.trace.ring import HEADER_SIZE, SLOT_SIZE, SLOTS, RingWriter, read_ring, slot_writers

SIZE = HEADER_SIZE + SLOTS * SLOT_SIZE
INT_EDGES = [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1,
             -1, -32, -33, -128, -129, -32_768, -32_769, -(2**31), -(2**31) - 1, -(2**63)]
STRINGS = ["", "a" * 31, "b" * 32, "c" * 255, "d" * 256, "é" * 20, "组" * 40, "SUM"]


def starts():
    """Starts as the hot path builds them (start_record, and the C wrapper's own
    tuples with a torch.Size), over every msgpack size class a field can fall in."""
    for i, v in enumerate(INT_EDGES):
        yield i, start_record(i, v, "all_reduce", "0", v, v, "float32", [v], peer=v if v < 2**63 else -1)
    for i, s in enumerate(STRINGS):
        yield 100 + i, start_record(100 + i, 5, s, s, 1, 64, s, [2, 3], reduce_op=s)
    yield 200, ("start", 200, 9, "all_reduce", "0", 3, 1024, "float32", torch.Size([256]), -1, -1, False, "SUM")
    yield 201, ("start", 201, 9, "send", "0", 3, 4, "int8", torch.Size([]), 1, -1, True, "")
    yield 202, start_record(202, 9, "all_reduce", "0", 1, 8, "float32", list(range(20)))  # array16 shape
    yield 203, start_record(203, 9, "all_reduce", "0", 1, 8, "float32", [0] + [70_000] * 59)  # too big: no shape
    yield 204, start_record(204, 9, "all_reduce", "0", 1, 8, "float32", [1], reduce_op="X" * 300)  # too big at all
    yield 204 + SLOTS, start_record(204 + SLOTS, 9, "barrier", "0", 2, 0, "", [])  # the same slot again
    yield 205, [*start_record(205, 9, "all_reduce", "0", 1, 8, "float32", (4, 4))]  # a queued list
    for op_id in (2**16 + 3, 2**33 + 5, 2**62 + 7):  # op ids past every small size class
        yield op_id, start_record(op_id, 9, "all_reduce", "0", 1, 8, "float32", [2])


@pytest.mark.native
def test_a_built_install_writes_the_ring_in_c():
    """CI installs as the README says, which builds it: a silent fallback to the
    Python writers (a ring's op then costs microseconds more) fails here."""
    assert ring._fastpack is not None, "commviz/_fastpack.c was not built (pip install -e .)"
    start, end, release = slot_writers(bytearray(SIZE))
    assert type(start).__name__ == "builtin_function_or_method"
    release()


def test_every_start_and_end_is_written_as_the_python_writer_writes_it():
    fast, slow = bytearray(SIZE), bytearray(SIZE)
    c_start, c_end, release = slot_writers(fast)
    p_start, p_end, _ = slot_writers(slow, fast=False)
    n = 0
    for op_id, rec in starts():
        c_start(op_id, rec)
        p_start(op_id, rec)
        assert fast == slow, f"start {op_id}: {rec}"
        if op_id % 3:
            c_end(op_id, 10_000 + op_id, op_id % 2 == 0)
            p_end(op_id, 10_000 + op_id, op_id % 2 == 0)
            assert fast == slow
        n += 1
    c_end(7, 123)
    p_end(7, 123)
    assert fast == slow
    release()
    assert n > 30


@pytest.mark.native
def test_a_value_the_packer_does_not_take_goes_to_msgspec_whole():
    fast, slow = bytearray(SIZE), bytearray(SIZE)
    c_start, _, release = slot_writers(fast)
    p_start, _, _ = slot_writers(slow, fast=False)
    odd = start_record(3, 9, "all_reduce", "0", 1, 8, "float32", [1])
    odd = odd[:9] + (1.5,) + odd[10:]  # a float where an int goes
    too_big = start_record(4, 9, "all_reduce", "0", 2**70, 8, "float32", [1])  # msgspec: an error
    c_start(3, odd)
    p_start(3, odd)
    assert fast == slow
    with pytest.raises(OverflowError):
        p_start(4, too_big)
    with pytest.raises(OverflowError):
        c_start(4, too_big)  # the same error, from the same writer
    assert c_start.__self__.handed == 2 and c_start.__self__.packed == 0
    release()


def test_a_ring_read_back_holds_what_the_c_writer_was_given(tmp_path):
    w = RingWriter(str(tmp_path / "r.ring"), rank=2)
    recs = dict(starts())
    for op_id, rec in recs.items():
        w.start(op_id, rec)
    w.end(200, 77)
    _, _, events = read_ring(w.path)
    got = {e.id: e for e in events if type(e).__name__ == "OpStart"}
    assert got[200].shape == [256] and got[200].dtype == "float32" and got[200].bytes == 1024
    assert got[203].shape == [] and 204 not in got and 204 + SLOTS in got
    assert [e.t for e in events if type(e).__name__ == "OpEnd"] == [77]
    expect = msgspec.msgpack.decode(msgspec.msgpack.encode(recs[105]), type=type(got[105]))
    assert got[105] == expect
    w.close(delete=True)


@pytest.mark.native
def test_after_release_the_writers_do_nothing_and_the_mapping_closes(tmp_path):
    w = RingWriter(str(tmp_path / "r.ring"), rank=0)
    start, end = w.start, w.end
    w.close(delete=False)  # releases the C writer's buffer first: mmap.close would refuse otherwise
    start(1, start_record(1, 5, "all_reduce", "0", 1, 8, "float32", [2]))  # an op that began as it closed
    end(1, 6)
    assert read_ring(w.path)[2] == []


@pytest.mark.native
def test_an_argument_whose_reading_closes_the_ring_writes_nothing():
    """Reading an op id that is not an int runs its __index__; if that closes the
    ring, the writers must not then write into a mapping that is gone."""
    buf = bytearray(SIZE)
    start, end, release = slot_writers(buf)

    class Closing:
        def __index__(self):
            release()
            return 5

    start(Closing(), start_record(5, 9, "all_reduce", "0", 1, 8, "float32", [2]))
    end(Closing(), 10)
    assert buf == bytearray(SIZE)
