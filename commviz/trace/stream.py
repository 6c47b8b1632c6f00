"""Reading a trace of any length in bounded memory: two passes over the frames,
neither of which keeps them.

The first pass reads only each frame's header (its rank) and the hellos, so it is
cheap: it finds every frame the file can give, each rank's clock offset and how
many frames each rank has — which is what `model.merge.order_stream` needs to hand
the events on in the one order of `order_events` while holding only the frames
that run ahead of the slowest rank. The second pass decodes and feeds.

Anything that is not a commviz trace (torch's own files, through `sources.open_trace`) is
read whole, as before, and fed through the same merge.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import msgspec
import numpy as np

from commviz.events import Batch, FrameError, Hello, decode_batch
from commviz.model.merge import (CHUNK, ChunkMerge, ChunkMergeState, StreamSource, offset_ns, order_events,
                                 order_stream, order_stream_chunks)
from commviz.model.store import ColFrame, decode_frame
from commviz.trace import sources
from commviz import native
from commviz.trace.file import (HELLO_TAG, MAGIC, RING_SUFFIX, SUFFIX, Loaded, TraceError, add_ring, iter_frames,
                                SCAN_BLOCK, scan_frames, scan_heads)

READ_BLOCK = 1 << 20  # bytes the decoding pass reads at once (a seek reads on from anywhere)
PROGRESS_EVERY = 16 << 20  # bytes decoded between two progress calls


_heads = getattr(native.load("commviz.model._fastcols"), "heads", None)  # the first pass's loop in C


class _Head(msgspec.Struct, array_like=True):
    schema: int
    rank: int
    events: msgspec.Raw


_head = msgspec.msgpack.Decoder(_Head)


def frame_rank(payload: bytes) -> int | None:
    """The rank a frame names, without decoding its events; None if it names none."""
    try:
        rank = _head.decode(payload).rank
    except msgspec.DecodeError:
        return None
    return rank if rank >= 0 else None


class TraceStream:
    """A trace opened for streaming. `problems`, `bad_frames` and `truncated` hold
    what the first pass found and grow with what the decoding pass finds; `events()`
    can be iterated more than once (each time a fresh pass over the files)."""

    def __init__(self, path: str | os.PathLike, progress: Callable[[int, int, str], None] | None = None,
                 rank_map: dict[str, int] | None = None) -> None:
        self.path = Path(path)
        self.rank_map = rank_map  # torch's files whose names end in no rank (`sources.open_trace`)
        self.info = Loaded()  # problems, bad_frames, truncated, files
        # (bytes done, bytes in all files, what: "scanning" in the first pass, else
        # "reading"), called now and then
        self.progress = progress
        self._scan_total = 0
        self._files: list[str] = []
        self._ends: list[int] = []  # each file's offset after its last whole frame, at the first pass
        self._counts: list[dict[int, int]] = []
        self._memory: list[list[Batch]] = []  # inputs that are not .cvz files, read whole
        self.first_offset: dict[int, int] = {}
        # rank -> (file, offset, clock offset then) of its last frame in each file: the
        # trace's end, read before the trace is (`end_estimate`)
        self._last_frames: dict[int, list[tuple[str, int, int | None]]] = {}
        self._noted: set[tuple[str, int]] = set()  # frames that did not decode, noted once over all passes
        self.total_bytes = 0
        self.bytes_done = 0
        self._scan()

    # the `Loaded` face, for commands that print problems
    @property
    def problems(self) -> list[str]:
        return self.info.problems

    @property
    def truncated(self) -> bool:
        return self.info.truncated

    @property
    def notes(self) -> list[str]:
        return self.info.notes

    @property
    def snapshot(self) -> bool:
        return self.info.snapshot

    @property
    def ranks(self) -> set[int]:
        return {r for c in self._counts for r in c} | {b.rank for m in self._memory for b in m}

    def _scan(self) -> None:
        p = self.path
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
        if p.is_dir():
            files = sorted(p.glob(f"*{SUFFIX}"))
            if not files:  # torch's own files, or a clear error
                self._take_whole(sources.open_trace(p, self.rank_map))
                return
            self._scan_total = sum(os.path.getsize(f) for f in files)
            for f in files:
                self._scan_file(str(f))
            rings = Loaded()
            for f in sorted(p.glob(f"*{RING_SUFFIX}")):
                add_ring(f, rings)
            self._take_whole(rings)
        elif _is_cvz(p):
            self._scan_total = os.path.getsize(p)
            self._scan_file(str(p))
        else:
            self._take_whole(sources.open_trace(p, self.rank_map))  # a foreign format: its importer reads it whole

    def _take_whole(self, loaded: Loaded) -> None:
        self.info.problems += loaded.problems
        self.info.files += loaded.files
        self.info.bad_frames += loaded.bad_frames
        self.info.truncated = self.info.truncated or loaded.truncated
        self.info.notes += loaded.notes
        self.info.snapshot = self.info.snapshot or loaded.snapshot
        if loaded.batches:
            self._memory.append(loaded.batches)
            for rank, off in first_hello_offsets(loaded.batches).items():
                self.first_offset.setdefault(rank, off)

    def _scan_file(self, path: str) -> None:
        self.info.files.append(path)
        scan = _FirstPass(self, path)
        if _heads is not None:
            for base, block, rows in scan_heads(path, self.info, _heads, min(SCAN_BLOCK, PROGRESS_EVERY)):
                scan.frames(base, block, rows)
        else:
            for off, n, block, p in scan_frames(path, self.info):
                scan.frame(off, n, block, p)
        for rank, (off, clock) in scan.last.items():
            self._last_frames.setdefault(rank, []).append((path, off, clock))
        self._files.append(path)
        self._ends.append(scan.end)
        self._counts.append(scan.counts)
        self.total_bytes += os.path.getsize(path)

    def end_estimate(self) -> int | None:
        """The trace time of its last event, from each rank's last frame alone (a rank
        whose clock ran back can end later: `order_stream` clamps it); None for no
        timed event."""
        end = None
        for rank, frames in self._last_frames.items():
            for path, off, clock in frames:
                scratch = Loaded()
                for _, payload in iter_frames(path, scratch, start=off):
                    try:
                        batch = decode_batch(payload)
                    except FrameError:
                        break
                    for ev in batch.events:
                        if type(ev) is Hello:
                            clock = offset_ns(ev)
                            t = ev.wall_ns
                        else:
                            raw = getattr(ev, "t", None)
                            if raw is None:
                                continue
                            t = raw + (clock if clock is not None else self.first_offset.get(rank, 0))
                        if end is None or t > end:
                            end = t
                    break
        for batches in self._memory:
            for t, _, _ in order_events(batches)[-1:]:
                end = t if end is None or t > end else end
        return end

    def _decode(self, path: str, stop: int, start: int = 0, reader: FileFrames | None = None,
                count: bool = True, decode: Callable[[bytes], Batch] = decode_batch,
                mark: int = -1) -> Iterator[tuple[int, Batch | None]]:
        """The frames of `path` from offset `start` to `stop` (where the first pass
        ended), decoded, each with its rank (a frame that did not decode: None, with
        the rank its head names). `count`: this pass adds to `bytes_done` and calls `progress`
        (a replay's many passes do not). `mark` >= 0: each ColFrame notes it as its
        file's index, and its offset, so another process can read it again."""
        scratch = Loaded()  # the first pass already noted cut-offs and bad lengths
        next_note = PROGRESS_EVERY
        for off, n, block, p in scan_frames(path, scratch, start, stop, READ_BLOCK):
            payload = block[p:p + n]
            if reader is not None:
                reader.position = off + len(payload) + 4
                reader.bytes_read += len(payload) + 4
            if count:
                self.bytes_done += len(payload) + 4
                if self.bytes_done >= next_note and self.progress is not None:
                    self.progress(self.bytes_done, self.total_bytes, "reading")
                    next_note = self.bytes_done + PROGRESS_EVERY
            try:
                got = decode(payload)
            except FrameError as exc:
                if (path, off) not in self._noted:
                    self._noted.add((path, off))
                    self.info.bad_frames += 1
                    self.info.problems.append(f"{path}: offset {off}: {exc}")
                rank = frame_rank_at(payload, 0, len(payload))  # as the first pass counted it
                if rank is not None:
                    yield rank, None
                continue
            if mark >= 0 and type(got) is ColFrame:
                got.file, got.at = mark, off
            yield got.rank, got
        if count:
            self.bytes_done += 8  # the header

    def events(self) -> Iterator[tuple[int, int, object]]:
        """(trace wall ns, rank, event) in the one order (`model.merge`)."""
        return order_stream(self._sources(), self.first_offset)

    def chunk_merge(self, state: ChunkMergeState | None = None, chunk: int = CHUNK) -> ChunkMerge:
        """`chunks` as a merge whose `state()` can be taken between two chunks and handed
        back here to go on from there (a replay's seek checkpoints): from the start, or
        from `state`. It adds nothing to `bytes_done`; its inputs' `bytes_read` say how
        far it has read."""
        if state is None:
            return ChunkMerge(self._sources(count=False, columns=True), self.first_offset, chunk)
        return ChunkMerge.resume(state, self._frames(state.positions, count=False, columns=True))

    def chunks(self, chunk: int = CHUNK, mark: bool = False) -> Iterator:
        """The same order as `events`, as `model.store.Chunk`s for `traces.ingest_chunks`,
        sorted `chunk` events at a time. `mark`: each frame read into columns knows
        where it lies (`files`, `ColFrame.at`), for `trace.readahead`."""
        return order_stream_chunks(self._sources(columns=True, mark=mark), self.first_offset, chunk)

    @property
    def files(self) -> list[str]:
        """The trace's commviz files, in the order `ColFrame.file` numbers them."""
        return list(self._files)

    def _frames(self, positions: list | None = None, count: bool = True, columns: bool = False,
                mark: bool = False) -> list:
        """`columns`: frames read into columns where they can be (`store.decode_frame`),
        for a merge that hands on `Chunk`s."""
        positions = positions or [None] * (len(self._files) + len(self._memory))
        frames: list = [FileFrames(self, f, stop, pos or 0, count, decode_frame if columns else decode_batch,
                                   k if mark else -1)
                        for k, (f, stop, pos) in enumerate(zip(self._files, self._ends, positions))]
        for batches, pos in zip(self._memory, positions[len(self._files):]):
            frames.append(ListFrames(batches, pos or 0))
        return frames

    def _sources(self, count: bool = True, columns: bool = False, mark: bool = False) -> list[StreamSource]:
        if count:
            self.bytes_done = 0
        counts = self._counts + [frame_counts(batches) for batches in self._memory]
        return [StreamSource(f, c) for f, c in zip(self._frames(count=count, columns=columns, mark=mark), counts)]


class _FirstPass:
    """What the first pass learns of one file: how many frames each rank has, where
    its last one lies and the clock offset then, each rank's first clock offset (into
    the stream's `first_offset`), and where the last whole frame ends."""

    def __init__(self, stream: TraceStream, path: str) -> None:
        self.stream = stream
        self.counts: dict[int, int] = {}
        self.last: dict[int, tuple[int, int | None]] = {}
        self.newest: dict[int, int] = {}
        self.end = 0
        self.base = stream.total_bytes  # the files scanned before this one, for progress
        self.next_note = PROGRESS_EVERY

    def frame(self, off: int, n: int, block: bytes, p: int) -> None:
        self.end = off + 4 + n
        self._progress()
        rank = frame_rank_at(block, p, n)
        if rank is None:
            return  # the decoding pass counts and names it
        self.counts[rank] = self.counts.get(rank, 0) + 1
        if block.find(HELLO_TAG, p, p + n) >= 0:
            self._hello(rank, block[p:p + n])
        self.last[rank] = (off, self.newest.get(rank))

    def frames(self, base: int, block: bytes, rows: np.ndarray) -> None:
        """`frame` for each row of `file.scan_heads` (a rank's hellos lie in its own
        frames, so its clock offset at its last frame is its newest once they are read)."""
        at, n, rank = rows[:, 0], rows[:, 1], rows[:, 2].copy()
        for k in np.flatnonzero(rank < 0).tolist():
            r = frame_rank(block[at[k] + 4:at[k] + 4 + n[k]])
            rank[k] = -1 if r is None else r
        ok = rank >= 0
        for k in np.flatnonzero(ok & (rows[:, 3] != 0)).tolist():
            self._hello(int(rank[k]), block[at[k] + 4:at[k] + 4 + n[k]])
        ranks, counts = np.unique(rank[ok], return_counts=True)
        get = self.counts.get
        for r, c in zip(ranks.tolist(), counts.tolist()):
            self.counts[r] = get(r, 0) + c
        kept = np.flatnonzero(ok)[::-1]  # each rank's last frame: its first, read backwards
        ranks, first = np.unique(rank[kept], return_index=True)
        for r, a in zip(ranks.tolist(), (base + at[kept[first]]).tolist()):
            self.last[r] = (a, self.newest.get(r))
        self.end = base + int(at[-1] + 4 + n[-1])
        self._progress()

    def _hello(self, rank: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except FrameError:
            return
        for ev in batch.events:
            if isinstance(ev, Hello):
                self.stream.first_offset.setdefault(rank, offset_ns(ev))
                self.newest[rank] = offset_ns(ev)

    def _progress(self) -> None:
        if self.end >= self.next_note and self.stream.progress is not None:
            self.stream.progress(self.base + self.end, self.stream._scan_total, "scanning")
            self.next_note = self.end + PROGRESS_EVERY


def frame_counts(batches: list[Batch]) -> dict[int, int]:
    """rank -> how many of `batches` are its (what `merge.StreamSource` is told)."""
    counts: dict[int, int] = {}
    for b in batches:
        counts[b.rank] = counts.get(b.rank, 0) + 1
    return counts


def first_hello_offsets(batches: list[Batch]) -> dict[int, int]:
    """rank -> the clock offset of its first Hello in `batches` (`order_events` gives
    it to the events a rank sent before that Hello too)."""
    first: dict[int, int] = {}
    for b in batches:
        if b.rank not in first:
            for ev in b.events:
                if type(ev) is Hello:
                    first[b.rank] = offset_ns(ev)
                    break
    return first


class FileFrames:
    """One file's (rank, batch or None) frames, read from offset `start`; `position`
    is the offset of the next frame to read, for a merge's state."""

    def __init__(self, stream: TraceStream, path: str, stop: int, start: int = 0, count: bool = True,
                 decode: Callable[[bytes], Batch] = decode_batch, mark: int = -1) -> None:
        self.position = start
        self.bytes_read = 0
        self._it = stream._decode(path, stop, start, self, count, decode, mark)

    def __iter__(self) -> FileFrames:
        return self

    def __next__(self) -> tuple[int, Batch | None]:
        return next(self._it)


class ListFrames:
    """Batches in memory (torch's files, crash rings) as frames, from index `start`."""

    def __init__(self, batches: list[Batch], start: int = 0) -> None:
        self.batches, self.position, self.bytes_read = batches, start, 0

    def __iter__(self) -> ListFrames:
        return self

    def __next__(self) -> tuple[int, Batch]:
        if self.position >= len(self.batches):
            raise StopIteration
        b = self.batches[self.position]
        self.position += 1
        return b.rank, b


def frame_rank_at(buf: bytes, p: int, n: int) -> int | None:
    """The rank the frame `buf[p:p+n]` names, without decoding its events; None if it
    names none. Both passes read it so: a frame the first pass counts for a rank is one
    the decoding pass hands on for that rank, decoded or not (else the merge would wait
    for that rank's frame to the end of the trace)."""
    if n >= 5 and buf[p] == 0x93 and buf[p + 1] <= 0x7F:  # [schema, rank, [...]], small ints: no msgspec
        b = buf[p + 2]
        if b <= 0x7F:
            return b
        if b == 0xCC:
            return buf[p + 3]
        if b == 0xCD:
            return (buf[p + 3] << 8) | buf[p + 4]
    return frame_rank(buf[p:p + n])


def _is_cvz(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def open_trace(path: str | os.PathLike, progress: Callable[[int, int, str], None] | None = None,
               rank_map: dict[str, int] | None = None) -> TraceStream:
    return TraceStream(path, progress, rank_map)
