"""Hostile or broken input never crashes the decoder or the trace reader: every
failure is a counted, named error, and nothing allocates what a length prefix claims."""

import struct

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commviz.events import SCHEMA_VERSION, FrameError, decode_batch, encode_batch
from commviz.model import Model
from commviz.trace.file import MAX_FRAME, TraceError, frame_bytes, header_bytes, read_trace
from commviz.trace.ring import RingError, read_ring
from tests.helpers import group, hello, op

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# msgpack values of every shape, for "valid msgpack, wrong schema"
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@SETTINGS
@given(st.binary(max_size=512))
def test_random_bytes_are_a_frame_error_or_a_valid_batch(data):
    try:
        b = decode_batch(data)
    except FrameError as exc:
        assert str(exc)
        return
    assert b.schema <= SCHEMA_VERSION and b.rank >= 0


@SETTINGS
@given(values)
def test_valid_msgpack_with_wrong_types_is_rejected_cleanly(v):
    for payload in (msgspec.msgpack.encode(v), msgspec.msgpack.encode([SCHEMA_VERSION, 0, [v]])):
        try:
            decode_batch(payload)
        except FrameError:
            pass


@SETTINGS
@given(st.integers(0, 200), st.binary(max_size=8))
def test_truncated_and_corrupted_frames_of_a_real_batch(cut, noise):
    good = encode_batch(1, [hello(1), group(), *op(0, 10, 20), *op(1, 30, 40, seq=1)])
    for data in (good[:cut], good[:cut] + noise + good[cut:]):
        try:
            b = decode_batch(data)
        except FrameError:
            continue
        m = Model()  # whatever decodes must be safe to feed the model
        for ev in b.events:
            m.ingest(b.rank, ev)
        m.summary()
        m.diagnoses()


@SETTINGS
@given(st.lists(st.binary(max_size=64), max_size=8), st.binary(max_size=64), st.integers(0, 2**32 - 1))
def test_trace_files_with_garbage_load_what_they_can(tmp_path, frames, tail, huge):
    p = tmp_path / "t.cvz"
    good = encode_batch(0, [hello(0)])
    body = header_bytes() + frame_bytes(good) + b"".join(frame_bytes(f) for f in frames)
    body += struct.pack("<I", huge) + tail  # a length prefix that may claim up to 4 GiB
    p.write_bytes(body)
    loaded = read_trace(p)
    assert loaded.batches and loaded.batches[0].rank == 0
    assert len(loaded.batches) + loaded.bad_frames <= len(body) // 4  # each frame costs its 4-byte prefix
    assert loaded.bad_frames <= len(loaded.problems)  # every bad frame is said, with its offset
    for problem in loaded.problems:
        assert str(p) in problem and "offset" in problem
    if huge > MAX_FRAME:
        assert any("exceeds" in x for x in loaded.problems)


@SETTINGS
@given(st.binary(max_size=128))
def test_trace_headers_of_random_bytes(tmp_path, data):
    p = tmp_path / "t.cvz"
    p.write_bytes(data)
    try:
        read_trace(p)
    except TraceError as exc:
        assert str(p) in str(exc)


@SETTINGS
@given(st.binary(max_size=2048))
def test_crash_rings_of_random_bytes(tmp_path, data):
    p = tmp_path / "r.ring"
    p.write_bytes(b"CVZR" + data)
    try:
        read_ring(p)
    except RingError as exc:
        assert str(p) in str(exc)
