"""Reading a trace of any length in bounded memory: two passes over the frames,
neither of which keeps them.

The first pass reads only each frame's header (its rank) and the hellos, so it is
cheap: it finds every frame the file can give, each rank's clock offset and how
many frames each rank has — which is what `model.clock.order_stream` needs to hand
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

from commviz.events import Batch, FrameError, Hello, decode_batch
from commviz.model.clock import StreamSource, offset_ns, order_stream, order_stream_chunks
from commviz.trace import sources
from commviz.trace.file import MAGIC, RING_SUFFIX, SUFFIX, Loaded, TraceError, add_ring, iter_frames

PROGRESS_EVERY = 16 << 20  # bytes decoded between two progress calls
HELLO_TAG = b"\xa5hello"  # msgpack for the tag "hello": a frame holding one is decoded in the first pass


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

    def __init__(self, path: str | os.PathLike, progress: Callable[[int, int], None] | None = None,
                 rank_map: dict[str, int] | None = None) -> None:
        self.path = Path(path)
        self.rank_map = rank_map  # torch's files whose names end in no rank (`sources.open_trace`)
        self.info = Loaded()  # problems, bad_frames, truncated, files
        self.progress = progress  # (bytes decoded, bytes in all files), called now and then
        self._files: list[str] = []
        self._counts: list[dict[int, int]] = []
        self._memory: list[list[Batch]] = []  # inputs that are not .cvz files, read whole
        self.first_offset: dict[int, int] = {}
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
            for f in files:
                self._scan_file(str(f))
            rings = Loaded()
            for f in sorted(p.glob(f"*{RING_SUFFIX}")):
                add_ring(f, rings)
            self._take_whole(rings)
        elif _is_cvz(p):
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
            for b in loaded.batches:
                for ev in b.events:
                    if isinstance(ev, Hello):
                        self.first_offset.setdefault(b.rank, offset_ns(ev))

    def _scan_file(self, path: str) -> None:
        counts: dict[int, int] = {}
        self.info.files.append(path)
        for _, payload in iter_frames(path, self.info):
            rank = frame_rank(payload)
            if rank is None:
                continue  # the decoding pass counts and names it
            counts[rank] = counts.get(rank, 0) + 1
            if rank not in self.first_offset and HELLO_TAG in payload:
                try:
                    batch = decode_batch(payload)
                except FrameError:
                    continue
                for ev in batch.events:
                    if isinstance(ev, Hello):
                        self.first_offset.setdefault(rank, offset_ns(ev))
                        break
        self._files.append(path)
        self._counts.append(counts)
        self.total_bytes += os.path.getsize(path)

    def _decode(self, path: str) -> Iterator[tuple[int, Batch | None]]:
        scratch = Loaded()  # the first pass already noted cut-offs and bad lengths
        next_note = PROGRESS_EVERY
        for off, payload in iter_frames(path, scratch):
            self.bytes_done += len(payload) + 4
            if self.bytes_done >= next_note and self.progress is not None:
                self.progress(self.bytes_done, self.total_bytes)
                next_note = self.bytes_done + PROGRESS_EVERY
            try:
                yield 0, decode_batch(payload)
            except FrameError as exc:
                self.info.bad_frames += 1
                self.info.problems.append(f"{path}: offset {off}: {exc}")
                rank = frame_rank(payload)
                if rank is not None:
                    yield rank, None
        self.bytes_done += 8  # the header

    def events(self) -> Iterator[tuple[int, int, object]]:
        """(trace wall ns, rank, event) in the one order (`model.clock`)."""
        return order_stream(self._sources(), self.first_offset)

    def chunks(self) -> Iterator:
        """The same order as `events`, as `model.columns.Chunk`s for `Model.ingest_chunks`."""
        return order_stream_chunks(self._sources(), self.first_offset)

    def _sources(self) -> list[StreamSource]:
        self.bytes_done = 0
        sources = [StreamSource(_with_rank(self._decode(f)), c) for f, c in zip(self._files, self._counts)]
        for batches in self._memory:
            counts: dict[int, int] = {}
            for b in batches:
                counts[b.rank] = counts.get(b.rank, 0) + 1
            sources.append(StreamSource(((b.rank, b) for b in batches), counts))
        return sources


def _with_rank(frames: Iterator[tuple[int, Batch | None]]) -> Iterator[tuple[int, Batch | None]]:
    for rank, batch in frames:
        yield (batch.rank, batch) if batch is not None else (rank, None)


def _is_cvz(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def open_trace(path: str | os.PathLike, progress: Callable[[int, int], None] | None = None,
               rank_map: dict[str, int] | None = None) -> TraceStream:
    return TraceStream(path, progress, rank_map)
