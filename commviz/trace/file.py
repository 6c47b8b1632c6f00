"""Trace file format: an 8-byte header (magic, format version), then frames of a
4-byte little-endian length and the same msgpack `Batch` bytes that travel on the
wire. A file cut off mid-write (the job was killed) loads up to its last whole frame.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from commviz.events import Batch, FrameError, decode_batch
from commviz.trace.ring import SUFFIX as RING_SUFFIX

MAGIC = b"CVZT"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sHH")  # magic, format version, reserved
LEN = struct.Struct("<I")
MAX_FRAME = 16 * 1024 * 1024  # bigger than any batch the probe writes; guards allocation
SUFFIX = ".cvz"
HELLO_TAG = b"\xa5hello"  # msgpack for the tag "hello": a first pass decodes a frame holding one


class TraceError(ValueError):
    """The file is not a commviz trace at all (bad magic, newer format)."""


def header_bytes() -> bytes:
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0)


def frame_bytes(payload: bytes) -> bytes:
    return LEN.pack(len(payload)) + payload


class TraceWriter:
    """Append-only writer. Each frame is written whole and handed to the OS, so a
    killed process leaves every frame it wrote readable."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._f = open(self.path, "wb", buffering=0)
        self._f.write(header_bytes())

    def write(self, payload: bytes) -> None:
        self._f.write(frame_bytes(payload))

    def close(self) -> None:
        self._f.close()


@dataclass
class Loaded:
    batches: list[Batch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each, naming file and offset
    bad_frames: int = 0
    truncated: bool = False
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the files cannot tell (torch's own files)
    snapshot: bool = False  # a dump taken while the job ran: a rank without a goodbye is not dead


def read_trace(path: str | os.PathLike, into: Loaded | None = None) -> Loaded:
    """Read one trace file. Frames that fail to decode are counted and skipped; a
    length that cannot be right, or a cut-off tail, ends the read with a note."""
    out = into if into is not None else Loaded()
    path = str(path)
    out.files.append(path)
    for off, payload in iter_frames(path, out):
        try:
            out.batches.append(decode_batch(payload))
        except FrameError as exc:
            out.bad_frames += 1
            out.problems.append(f"{path}: offset {off}: {exc}")
    return out


def _check_header(path: str, head: bytes) -> None:
    if len(head) < HEADER.size:
        raise TraceError(f"{path}: {len(head)} bytes, too short to be a commviz trace")
    magic, version, _ = HEADER.unpack_from(head, 0)
    if magic != MAGIC:
        raise TraceError(f"{path}: not a commviz trace (starts with {magic!r}, expected {MAGIC!r})")
    if version > FORMAT_VERSION:
        raise TraceError(
            f"{path}: trace format {version} is newer than this commviz reads ({FORMAT_VERSION}); "
            "upgrade commviz (pip install -U commviz)"
        )


def iter_frames(path: str, out: Loaded, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(offset, payload) of each whole frame, read a frame at a time so memory holds
    one frame whatever the file's length. A length that cannot be right, or a
    cut-off tail, ends the read with a note in `out` (the header is checked first).
    `start` resumes at a frame offset a previous pass returned; `stop` ends the read
    where a first pass ended (a file still being written has grown since)."""
    with open(path, "rb") as f:
        _check_header(path, f.read(HEADER.size))
        size = os.fstat(f.fileno()).st_size
        if stop is not None:
            size = min(size, stop)
        off = max(start, HEADER.size)
        f.seek(off)
        read = f.read
        while off < size:
            head = read(LEN.size)
            if len(head) < LEN.size:
                _stray(out, path, off, len(head))
                return
            (n,) = LEN.unpack(head)
            if n > MAX_FRAME:
                _too_long(out, path, off, n)
                return
            payload = read(n)
            if len(payload) < n:
                _cut(out, path, off, n, len(payload))
                return
            yield off, payload
            off += LEN.size + n


SCAN_BLOCK = 8 << 20  # bytes a first pass reads at once


def scan_frames(path: str, out: Loaded, start: int = 0, stop: int | None = None,
                block_size: int = SCAN_BLOCK) -> Iterator[tuple[int, int, bytes, int]]:
    """(offset, payload length, a block of the file, where the payload starts in it)
    of each whole frame, as `iter_frames` finds them (`start`, `stop` as there) and
    with the same notes, for a pass that reads a few bytes of each frame, or copies
    the payload out itself: the file is read in blocks, not twice a frame (nor mapped:
    mapped pages of a big file would count in the process's resident memory)."""
    with open(path, "rb") as f:
        _check_header(path, f.read(HEADER.size))
        size = os.fstat(f.fileno()).st_size
        if stop is not None:
            size = min(size, stop)
        unpack = LEN.unpack_from
        off = max(start, HEADER.size)
        f.seek(off)
        block, base = b"", off
        while off < size:
            rel = off - base
            if rel + LEN.size > len(block):
                block, base, rel = block[rel:] + f.read(min(block_size, size - off)), off, 0
                if LEN.size > len(block):
                    _stray(out, path, off, len(block))
                    return
            (n,) = unpack(block, rel)
            if n > MAX_FRAME:
                _too_long(out, path, off, n)
                return
            if rel + LEN.size + n > len(block):
                block, base, rel = block[rel:] + f.read(min(max(block_size, LEN.size + n), size - off)), off, 0
                if LEN.size + n > len(block):
                    _cut(out, path, off, n, len(block) - LEN.size)
                    return
            yield off, n, block, rel + LEN.size
            off += LEN.size + n


def scan_heads(path: str, out: Loaded, heads: Callable,
               block_size: int = SCAN_BLOCK) -> Iterator[tuple[int, bytes, np.ndarray]]:
    """`scan_frames` a block at a time, for a first pass whose loop is in C
    (`model/_fastcols.c`'s `heads`): (the block's offset in the file, the block, a
    row per whole frame in it: its offset in the block, its payload's length, its
    rank or -1, 1 if it holds `HELLO_TAG`). The same frames, and the same notes: at a
    length that cannot be right, or a cut-off tail, `scan_frames` takes over to say so."""
    with open(path, "rb") as f:
        _check_header(path, f.read(HEADER.size))
        size = os.fstat(f.fileno()).st_size
        block, base, rel = b"", HEADER.size, 0
        while True:
            rows, stop, too_long = heads(block, rel, size - base, MAX_FRAME, HELLO_TAG)
            if rows:
                yield base, block, np.frombuffer(rows, np.int64).reshape(-1, 4)
            off, left = base + stop, len(block) - stop
            if too_long or off >= size:
                break
            need = LEN.size + LEN.unpack_from(block, stop)[0] - left if left >= LEN.size else 0
            more = f.read(min(max(block_size, need), size - base - len(block)))
            if not more:
                break
            block, base, rel = block[stop:] + more, off, 0
    if off < size:
        for at, n, blk, p in scan_frames(path, out, start=off):  # (whole frames: none, but to be sure)
            yield at - (p - LEN.size), blk, np.array([[p - LEN.size, n, -1, int(blk.find(HELLO_TAG, p, p + n) >= 0)]])


def _stray(out: Loaded, path: str, off: int, k: int) -> None:
    out.truncated = True
    out.problems.append(f"{path}: truncated at offset {off}: {k} stray bytes after the last whole frame")


def _too_long(out: Loaded, path: str, off: int, n: int) -> None:
    out.bad_frames += 1
    out.problems.append(
        f"{path}: offset {off}: frame length {n} exceeds the {MAX_FRAME}-byte limit; "
        "the rest of the file is unreadable"
    )


def _cut(out: Loaded, path: str, off: int, n: int, have: int) -> None:
    out.truncated = True
    out.problems.append(
        f"{path}: truncated at offset {off}: frame of {n} bytes, only {have} present "
        "(the writer was probably killed); loaded everything before it"
    )


def load(path: str | os.PathLike) -> Loaded:
    """One trace file, or a directory of per-rank traces (COMMVIZ_TRACE_DIR)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob(f"*{SUFFIX}"))
        if not files:
            raise TraceError(f"{p}: no {SUFFIX} files (expected rank-<R>{SUFFIX} from COMMVIZ_TRACE_DIR)")
        out = Loaded()
        for f in files:
            read_trace(f, out)
        for f in sorted(p.glob(f"*{RING_SUFFIX}")):
            add_ring(f, out)
        return out
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    return read_trace(p)


def add_ring(path: str | os.PathLike, out: Loaded) -> None:
    """A crash ring left by a rank that did not exit cleanly: its last op starts
    (and ends) join the trace; the model drops what it already has by op id."""
    from commviz.events import Batch, SCHEMA_VERSION
    from commviz.trace.ring import RingError, read_ring

    try:
        rank, pid, events = read_ring(path)
    except (RingError, OSError) as exc:
        out.problems.append(str(exc))
        return
    out.files.append(str(path))
    if events:
        out.batches.append(Batch(SCHEMA_VERSION, rank, events))
        out.problems.append(f"{path}: rank {rank} (pid {pid}) did not exit cleanly; recovered {len(events)} events from its crash ring")
