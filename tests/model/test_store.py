"""Frames read straight into columns (model/_fastcols.c's `frame`, model/store.py)
must read what msgspec reads: the same events, the same columns, the same refusals."""

from __future__ import annotations

import random
import struct

import msgspec
import numpy as np
import pytest

from commviz.events import (Counters, FrameError, GroupDef, Hello, Mark, OpEnd, OpStart, Sample,
                            decode_batch, encode_batch)
from commviz.model import store
from commviz.model.store import ColFrame, EventStore, decode_frame, object_columns

BIG = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**31, 2**32, 2**62, -1, -32, -33, -128, -129, -2**31 - 1, -2**63]


def _event(rng: random.Random):
    i = lambda: rng.choice(BIG) if rng.random() < 0.3 else rng.randrange(0, 10**6)  # noqa: E731
    k = rng.random()
    if k < 0.4:
        return OpStart(i(), i(), rng.choice(["all_reduce", "send", "broadcast", "ü"]), rng.choice(["0", "1", "dp"]),
                       i(), i(), rng.choice(["", "float32"]), rng.choice([[], [2, 3], [-1]]), peer=rng.choice([-1, 3]),
                       root=rng.choice([-1, 0]), is_async=rng.random() < 0.5, reduce_op=rng.choice(["", "SUM"]),
                       batched=rng.random() < 0.1, bucket=rng.choice([-1, 2]), params=rng.choice([0, 9]))
    if k < 0.8:
        return OpEnd(i(), i(), error=rng.choice([""] * 9 + ["boom"]), bytes=rng.choice([-1, 7, 2**40]),
                     peer=rng.choice([-1, 1]), device_ns=rng.choice([-1, 0, 12345]), enqueue_ns=rng.choice([-1, 5]),
                     captured=rng.random() < 0.1)
    return rng.choice([Counters(i(), 1), Sample(i(), {"cpu": 0.5}), Mark(i(), "m"), GroupDef("g", [0, 1], "gloo"),
                       Hello(0, 0, 2, "h", 1, "gloo", "cpu", "2", "0", "j", 1, 2)])


def _same(frame, want: list) -> None:
    """`frame` (decode_frame's) holds `want`, as objects and as the columns the batch
    path would read from them."""
    s = EventStore.join([frame])
    assert s.objects(np.arange(len(s))) == want
    (cols, sigs) = object_columns(want)
    for a, b in zip(s.columns(), cols):
        assert a.dtype == b.dtype and a.tolist() == b.tolist()
    assert [s.sigs[k] if k >= 0 else None for k in s.sig.tolist()] == [sigs[k] if k >= 0 else None
                                                                     for k in cols[4].tolist()]


@pytest.mark.native
def test_random_frames_read_as_msgspec_reads_them():
    assert store._frame is not None  # (tests/conftest.py: skipped where not built, failed in CI)
    rng = random.Random(1)
    columnar = 0
    for _ in range(400):
        evs = [_event(rng) for _ in range(rng.randrange(0, 40))]
        payload = encode_batch(rng.randrange(0, 5000), evs)
        f = decode_frame(payload)
        want = decode_batch(payload).events
        columnar += type(f) is ColFrame
        _same(f, want)
        assert f.events == want
    assert columnar > 100  # most frames are read in C (an error string or a huge int declines one)


def test_a_damaged_frame_is_refused_exactly_when_msgspec_refuses_it():
    rng = random.Random(2)
    for _ in range(1500):
        evs = [_event(rng) for _ in range(rng.randrange(1, 8))]
        b = bytearray(encode_batch(3, evs))
        for _ in range(rng.randrange(1, 4)):
            if rng.random() < 0.2 and len(b) > 1:
                del b[rng.randrange(1, len(b)):]
            elif b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        payload = bytes(b)
        try:
            want = decode_batch(payload)
        except FrameError as exc:
            with pytest.raises(FrameError) as got:
                decode_frame(payload)
            assert str(got.value) == str(exc)
            continue
        _same(decode_frame(payload), want.events)


def _mp_int(v: int, wide: bool) -> bytes:
    if not wide:
        return struct.pack(">B", v) if 0 <= v < 128 else struct.pack(">Bq", 0xD3, v)
    return struct.pack(">Bq", 0xD3, v) if v < 0 else struct.pack(">BQ", 0xCF, v)


def _mp_str(s: str, wide: bool) -> bytes:
    b = s.encode()
    return (struct.pack(">BI", 0xDB, len(b)) if wide else struct.pack(">BB", 0xD9, len(b))) + b


@pytest.mark.native
def test_any_width_a_writer_picks_reads_the_same():
    """Another msgpack writer may spend more bytes on an int, a string or an array than
    msgspec does: the values are what count."""
    for wide in (False, True):
        start = (b"\xdc" + struct.pack(">H", 8) + _mp_str("start", wide) + _mp_int(4, wide) + _mp_int(90, wide)
                 + _mp_str("all_reduce", wide) + _mp_str("0", wide) + _mp_int(2, wide) + _mp_int(64, wide)
                 + _mp_str("f32", wide))
        end = b"\xdd" + struct.pack(">I", 4) + _mp_str("end", wide) + _mp_int(4, wide) + _mp_int(95, wide) + b"\xa0"
        payload = b"\x93" + _mp_int(1, wide) + _mp_int(6, wide) + b"\x92" + start + end
        want = decode_batch(payload).events
        assert want == [OpStart(4, 90, "all_reduce", "0", 2, 64, "f32"), OpEnd(4, 95)]
        f = decode_frame(payload)
        assert type(f) is ColFrame
        _same(f, want)


def test_a_carried_tail_keeps_only_the_frames_and_signatures_it_uses():
    frames = [decode_frame(encode_batch(r, [OpStart(k, k, "all_reduce", "0", k, 8 * r), OpEnd(k, k + 1)]))
              for r in range(4) for k in range(3)]
    s = EventStore.join(frames)
    assert len(s.frames) == 12 and len(s.sigs) == 4
    tail = s[-5:]
    again = EventStore.join([tail, frames[0]])
    assert len(again.frames) == 4 and len(again.sigs) == 2
    want = [ev for f in frames[-3:] for ev in f.events][-5:] + frames[0].events
    assert again.objects(np.arange(len(again))) == want
    assert again.rank.tolist() == [3] * 5 + [0, 0]


@pytest.mark.parametrize("where", ["start t", "end device_ns", "group member", "shape"])
def test_an_int_past_int64_is_a_bad_frame_not_a_failed_batch(where):
    """msgpack carries ints up to 2**64 - 1; the model's columns hold int64. Such a
    frame is refused when it is decoded (and counted as bad), where it used to be
    taken and then fail the whole batch it was drained with."""
    big = 2**63 + 5
    ev = {"start t": ["start", 1, big, "all_reduce", "0", 0, 8],
          "end device_ns": ["end", 1, 5, "", -1, -1, big],
          "group member": ["group", "0", [0, big], "gloo"],
          "shape": ["start", 1, 2, "all_reduce", "0", 0, 8, "f32", [big]]}[where]
    payload = msgspec.msgpack.encode([1, 0, [ev]])
    for decode in (decode_batch, decode_frame):
        with pytest.raises(FrameError, match="9223372036854775807"):
            decode(payload)
