"""The crash ring: a small memory-mapped file per rank holding its most recent op
starts, written on the caller's thread.

On gloo a shape or dtype mismatch aborts a rank (SIGABRT from C++) within
milliseconds of the call, before the sender thread's next flush; no Python handler
or atexit runs then. Pages of a shared file mapping outlive the process, so the
watcher (same host) and `commviz summary` read the ring of a rank that died and
recover the ops it started — the fatal one included — and those it finished.

Layout: a 64-byte header (magic, version, rank, pid, slots, slot size), then `slots`
fixed slots. Slot i holds op id ≡ i (mod slots):
    [0:8]  end time (monotonic ns, 0 while in flight)
    [8]    state: 0 empty, 1 started, 2 ended, 3 failed (ended with an error; the
           message is not kept: it is recovered as FAILED_IN_RING)
    [10:12] payload length      [16:24] op id
    [24:]  payload: the msgpack of the op's start, as on the wire
The payload is written before the header fields that point at it, and a reader
keeps a slot only if the decoded start carries the slot's op id, so a slot caught
mid-write by death is skipped rather than misread.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import msgspec

from commviz import native
from commviz.events import S_SHAPE, OpEnd, OpStart

_fastpack = native.load("commviz._fastpack")  # optional (commviz/native.py)

MAGIC = b"CVZR"
VERSION = 2  # 2: state 3, an op that failed
HEADER = struct.Struct("<4sHHiiII")
HEADER_SIZE = 64
SLOTS = 1024  # a power of two
SLOT_SIZE = 256
SLOT_HEAD = struct.Struct("<qBxHxxxxq")  # end_t, state, len, op_id
END_HEAD = struct.Struct("<qB")  # end_t, state
PAYLOAD_MAX = SLOT_SIZE - SLOT_HEAD.size
SUFFIX = ".ring"

_start_decoder = msgspec.msgpack.Decoder(OpStart)
# The error of a failed op recovered from a ring (its slot keeps no message). Without
# it a failed op read back from the ring of a rank that did not exit cleanly looked
# finished: its end was stamped like a success.
FAILED_IN_RING = "failed (the crash ring keeps no message)"


class RingError(ValueError):
    pass


class RingWriter:
    """Rank side. `start(op_id, record)` and `end(op_id, t)` run on the caller's
    thread: an encode and two memory writes, no system call. They are C's where it
    is built (no Python per op), else closures over the mapping; the hot path calls
    them, and this module is the one definition of the slot layout they write."""

    def __init__(self, path: str, rank: int) -> None:
        import mmap

        self.path = path
        size = HEADER_SIZE + SLOTS * SLOT_SIZE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        HEADER.pack_into(self._m, 0, MAGIC, VERSION, 0, rank, os.getpid(), SLOTS, SLOT_SIZE)
        self.start, self.end, self._release = slot_writers(self._m)

    def close(self, delete: bool) -> None:
        """A clean exit leaves nothing to recover: the ring is removed."""
        self._release()
        self._m.close()
        if delete:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def slot_writers(m, fast: bool = True):
    """(start, end, release) over the writable buffer `m`: C's (commviz/_fastpack.c)
    where it is built and writes this layout, else Python's. `release` lets `m` go
    (C holds its buffer); the writers do nothing after it."""
    py_start, py_end = _slot_writers(m, msgspec.msgpack.Encoder().encode)
    if fast and _fastpack is not None and (_fastpack.SLOT_HEAD, _fastpack.END_HEAD) == (SLOT_HEAD.format, END_HEAD.format):
        w = _fastpack.SlotWriter(m, HEADER_SIZE, SLOTS, SLOT_SIZE, S_SHAPE, py_start)
        return w.start, w.end, w.release
    return py_start, py_end, _nothing


def _nothing() -> None:
    pass


def _slot_writers(m, encode):
    head, pack_head, pack_end = SLOT_HEAD.size, SLOT_HEAD.pack_into, END_HEAD.pack_into
    mask, pmax = SLOTS - 1, PAYLOAD_MAX

    def start(op_id: int, record: tuple) -> None:
        payload = encode(record)
        if len(payload) > pmax:  # a huge shape: keep the rest of the start
            payload = encode((*record[:S_SHAPE], (), *record[S_SHAPE + 1 :]))
        n = len(payload)
        off = HEADER_SIZE + (op_id & mask) * SLOT_SIZE
        try:
            if n > pmax:
                # Still too big: the slot must not keep the op it held 1,024 ops ago,
                # or this op's end would mark that stale start as ended. An empty
                # payload under this op id is skipped by the reader.
                pack_head(m, off, 0, 0, 0, op_id)
            else:
                m[off + head : off + head + n] = payload
                pack_head(m, off, 0, 1, n, op_id)
        except ValueError:  # closed: the probe shut down while this call began on another thread
            pass

    def end(op_id: int, t: int, failed: bool = False) -> None:
        try:
            pack_end(m, HEADER_SIZE + (op_id & mask) * SLOT_SIZE, t, 3 if failed else 2)
        except ValueError:  # closed: the probe shut down while this op ran on another thread
            pass

    return start, end


def read_ring(path: str | os.PathLike) -> tuple[int, int, list]:
    """(rank, pid, events): starts of every op in the ring, and ends of those that
    finished, in op-id order."""
    data = Path(path).read_bytes()
    if len(data) < HEADER_SIZE:
        raise RingError(f"{path}: too short to be a commviz ring")
    magic, version, _, rank, pid, slots, slot_size = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise RingError(f"{path}: not a commviz ring (starts with {magic!r})")
    if version > VERSION:
        raise RingError(f"{path}: ring format {version} is newer than this commviz reads; upgrade commviz")
    if slot_size < SLOT_HEAD.size or len(data) < HEADER_SIZE + slots * slot_size:
        raise RingError(f"{path}: ring of {slots} slots of {slot_size} bytes is cut short")
    found = []
    for i in range(slots):
        off = HEADER_SIZE + i * slot_size
        end_t, state, n, op_id = SLOT_HEAD.unpack_from(data, off)
        if state not in (1, 2, 3) or n > slot_size - SLOT_HEAD.size:
            continue
        try:
            start = _start_decoder.decode(data[off + SLOT_HEAD.size : off + SLOT_HEAD.size + n])
        except msgspec.DecodeError:
            continue
        if start.id != op_id:
            continue  # caught mid-write
        end = None
        if state >= 2 and end_t:
            end = OpEnd(op_id, end_t, FAILED_IN_RING) if state == 3 else OpEnd(op_id, end_t)
        found.append((op_id, start, end))
    events = []
    for _, start, end in sorted(found, key=lambda x: x[0]):
        events.append(start)
        if end is not None:
            events.append(end)
    return rank, pid, events
