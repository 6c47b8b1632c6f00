"""Trace files: what was written loads back; broken files load what they can and
say exactly where they broke."""

import struct

import pytest

from commviz.events import encode_batch
from commviz.trace.file import MAX_FRAME, TraceError, TraceWriter, frame_bytes, header_bytes, load
from tests.helpers import group, hello, op


def write(path, batches):
    w = TraceWriter(path)
    for rank, evs in batches:
        w.write(encode_batch(rank, evs))
    w.close()


def test_round_trip(tmp_path):
    p = tmp_path / "t.cvz"
    write(p, [(0, [hello(0), group()]), (0, op(0, 0, 10)), (1, [hello(1)])])
    loaded = load(p)
    assert [b.rank for b in loaded.batches] == [0, 0, 1]
    assert loaded.problems == [] and not loaded.truncated


def test_cut_off_trace_loads_up_to_the_last_whole_frame(tmp_path):
    p = tmp_path / "t.cvz"
    write(p, [(0, [hello(0)]), (0, op(0, 0, 10)), (0, op(1, 20, 30))])
    data = p.read_bytes()
    p.write_bytes(data[:-5])  # the writer was killed mid-frame
    loaded = load(p)
    assert len(loaded.batches) == 2 and loaded.truncated
    [msg] = loaded.problems
    assert "truncated at offset" in msg and "only" in msg and str(p) in msg


def test_stray_bytes_after_last_frame(tmp_path):
    p = tmp_path / "t.cvz"
    write(p, [(0, [hello(0)])])
    p.write_bytes(p.read_bytes() + b"\x01\x02")
    loaded = load(p)
    assert len(loaded.batches) == 1 and loaded.truncated


def test_garbage_frame_is_counted_and_skipped_with_its_offset(tmp_path):
    p = tmp_path / "t.cvz"
    good = encode_batch(0, [hello(0)])
    bad_off = len(header_bytes()) + 4 + len(good)
    p.write_bytes(header_bytes() + frame_bytes(good) + frame_bytes(b"\xc1garbage") + frame_bytes(good))
    loaded = load(p)
    assert len(loaded.batches) == 2 and loaded.bad_frames == 1
    assert f"offset {bad_off}: undecodable frame" in loaded.problems[0]


def test_huge_length_prefix_stops_without_allocating(tmp_path):
    p = tmp_path / "t.cvz"
    p.write_bytes(header_bytes() + struct.pack("<I", MAX_FRAME + 1) + b"x" * 10)
    loaded = load(p)
    assert loaded.batches == [] and "exceeds" in loaded.problems[0]


def test_not_a_trace(tmp_path):
    p = tmp_path / "t.cvz"
    p.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(TraceError, match="not a commviz trace"):
        load(p)


def test_newer_format_says_to_upgrade(tmp_path):
    p = tmp_path / "t.cvz"
    p.write_bytes(struct.pack("<4sHH", b"CVZT", 99, 0))
    with pytest.raises(TraceError, match="upgrade commviz"):
        load(p)


def test_directory_of_rank_traces(tmp_path):
    write(tmp_path / "rank-0.cvz", [(0, [hello(0)])])
    write(tmp_path / "rank-1.cvz", [(1, [hello(1)])])
    loaded = load(tmp_path)
    assert sorted(b.rank for b in loaded.batches) == [0, 1] and len(loaded.files) == 2


def test_empty_directory_and_missing_path(tmp_path):
    with pytest.raises(TraceError, match="no .cvz files"):
        load(tmp_path)
    with pytest.raises(TraceError, match="no such file"):
        load(tmp_path / "nope.cvz")
