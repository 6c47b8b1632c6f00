"""The first pass over a trace file, its loop in C (`file.scan_heads`) or in Python
(`file.scan_frames`): the same frames, ranks, hellos and notes, whatever the bytes."""

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commviz import native
from commviz.events import encode_batch
from commviz.trace import stream
from commviz.trace.file import HELLO_TAG, MAX_FRAME, Loaded, frame_bytes, header_bytes, scan_frames, scan_heads
from commviz.trace.stream import frame_rank_at, open_trace
from tests.helpers import group, hello, op

heads = getattr(native.load("commviz.model._fastcols"), "heads", None)


def by_python(path):
    out = Loaded()
    got = [(off, n, frame_rank_at(b, p, n), b.find(HELLO_TAG, p, p + n) >= 0)
           for off, n, b, p in scan_frames(str(path), out)]
    return got, out.problems, out.truncated, out.bad_frames


def by_c(path, block_size=1 << 20):
    out = Loaded()
    got = []
    for base, block, rows in scan_heads(str(path), out, heads, block_size):
        for at, n, rank, hi in rows.tolist():
            p = at + 4
            got.append((base + at, n, rank if rank >= 0 else frame_rank_at(block, p, n), bool(hi)))
    return got, out.problems, out.truncated, out.bad_frames


def frames_of(ranks):
    return [frame_bytes(encode_batch(r, [hello(r), group()] if k == 0 else op(k, k, k + 1)))
            for k, r in enumerate(ranks)]


@pytest.mark.native
@pytest.mark.parametrize("tail", [b"", b"\x07\x00", struct.pack("<I", 50) + b"short",
                                  struct.pack("<I", MAX_FRAME + 1) + b"x" * 8])
@pytest.mark.parametrize("block_size", [16, 100, 1 << 20])
def test_c_finds_what_python_finds(tmp_path, tail, block_size):
    # ranks past the one-byte and two-byte forms (Python asks msgspec for those),
    # hellos, and each way a file can end badly: stray bytes, a cut frame, a length
    # that cannot be right; blocks smaller than a frame
    p = tmp_path / "t.cvz"
    p.write_bytes(header_bytes() + b"".join(frames_of([0, 1, 200, 300, 70000, 1, 0])) + tail)
    want = by_python(p)
    assert by_c(p, block_size) == want
    assert [r for _, _, r, _ in want[0]] == [0, 1, 200, 300, 70000, 1, 0] and want[0][0][3]


@pytest.mark.native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(st.one_of(st.binary(max_size=40), st.sampled_from([HELLO_TAG, b"\x93\x01\xcd\xff\xff",
                                                                        b"\x93\x01\xcc\x05", b"\xa5hell"])),
                     max_size=12),
       lengths=st.booleans())
def test_any_bytes_give_the_same_frames_and_notes(tmp_path, body, lengths):
    p = tmp_path / "t.cvz"
    if lengths:  # well-framed payloads of any bytes
        data = b"".join(struct.pack("<I", len(b)) + b for b in body)
    else:  # anything at all after the header
        data = b"".join(body)
    p.write_bytes(header_bytes() + data)
    assert by_c(p, 24) == by_python(p)


def test_the_first_pass_learns_the_same_with_or_without_c(tmp_path, synth, monkeypatch):
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=8, ops=300)
    p.write_bytes(p.read_bytes() + b"".join(frames_of([3, 70000])) + b"\x01\x02")
    a = open_trace(p)
    monkeypatch.setattr(stream, "_heads", None)
    b = open_trace(p)
    assert (a.ranks, a.first_offset, a.problems, a.truncated, a.end_estimate()) == \
           (b.ranks, b.first_offset, b.problems, b.truncated, b.end_estimate())
    assert list(a.events()) == list(b.events())
