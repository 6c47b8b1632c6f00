"""A trace read and merged in a child process while this one ingests.

Reading, decoding and merging a trace's frames (`TraceStream.chunks`) costs about
what ingesting them does, and both are Python bound to one core: on two cores a
summary takes half as long again as it must. So a forked child runs the merge and
hands each chunk over, and this process only ingests.

What crosses is small by design. A chunk's columns (about a hundred bytes an event)
go through shared memory, a few slots the child fills and this process copies out
and frees at once; nothing else of the events does. The frames behind them, which
the model asks of only for the few events it takes one by one (hellos, p2p, an
instance cut by a chunk's edge), are named by file and offset and read again from
the file when asked (`_Frames`): handing the frames over themselves, pickled
through a pipe, moved 783 MiB for a 2.56M-event trace and made the summary slower
than one process (docs/PERFORMANCE.md).

Where fork is missing, the trace is small, it is not a commviz file, or
COMMVIZ_READAHEAD=0, the merge runs in this process as before (`chunks` decides).
It forks: a caller must hold no other thread (`commviz summary` holds none).
"""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import signal
import sys
import traceback
from typing import Iterator, NamedTuple

import numpy as np

from commviz.errors import CommvizError
from commviz.events import decode_batch
from commviz.model.merge import Timed
from commviz.model.store import COLUMNS, PLACES, ColFrame, Chunk, EventStore

SLOTS = 3
SLOT_BYTES = 16 << 20  # a chunk of 65,536 events takes 7 MB; a bigger one goes through the pipe
MIN_BYTES = 16 << 20  # a smaller trace is read in well under a second: no process for it
ENV_OFF = "COMMVIZ_READAHEAD"  # "0": merge in this process


class TraceChanged(CommvizError):
    """A file read again for an event's object is not what the child read."""


def chunks(stream) -> Iterator[Chunk]:
    """`stream.chunks()`, merged in a child process where that pays."""
    if not worth_a_child(stream):
        return stream.chunks()
    return ChildMerge(stream)


def worth_a_child(stream) -> bool:
    return (hasattr(os, "fork") and os.environ.get(ENV_OFF, "1") != "0" and bool(stream.files)
            and stream.total_bytes >= MIN_BYTES)


class _Frames(dict):
    """A chunk's `EventStore.frames` on this side: each frame made when first asked
    for, its payload read again from where it lies (file, offset, length), or as the
    child pickled it (a frame that was not read from a file). A dict that makes what
    it misses, so a frame asked for again costs a lookup in C, not a call."""

    def __init__(self, fds: list[int], names: list[str], where: tuple) -> None:
        self._fds, self._names = fds, names
        self._file, self._at, self._n, self._count, self._objs, other = where
        super().__init__(other)

    def __len__(self) -> int:  # the frames there are, made or not
        return len(self._file)

    def __missing__(self, k: int):
        n = int(self._n[k])
        payload = os.pread(self._fds[int(self._file[k])], n, int(self._at[k]) + 4)  # past its length
        if len(payload) != n:
            raise TraceChanged(f"{self._names[int(self._file[k])]}: shorter than when it was read "
                               f"(the frame at offset {int(self._at[k])} is cut); was it rewritten? Run again")
        count = int(self._count[k])
        if count < 0:  # the merge had decoded it: its events are its objects
            f = _Decoded(decode_batch(payload).events)
        else:
            f = ColFrame(payload, 0, -1, b"", (), self._objs.get(k), 0, count)
        self[k] = f
        return f


class _Decoded(NamedTuple):
    """A frame the merge decoded whole (`merge.Timed`), decoded again here."""

    events: list


class ChildMerge:
    """Iterating it hands on the chunks the child merges; the stream's `info`
    (problems, bad frames) takes what the child's reading found once it ends."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.pid = None
        self._fds: list[int] | None = []
        self._mem = None
        pipes: list[int] = []
        try:
            for f in stream.files:
                self._fds.append(os.open(f, os.O_RDONLY))
            self._mem = mmap.mmap(-1, SLOTS * SLOT_BYTES)  # anonymous and shared: the child sees it
            data_r, data_w = os.pipe()
            pipes += (data_r, data_w)
            free_r, free_w = os.pipe()
            pipes += (free_r, free_w)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
        except BaseException:
            for fd in pipes:
                os.close(fd)
            _release(self._fds, self._mem)
            raise
        if pid == 0:  # the child: merge, hand over, never return into the caller's code
            code = 1
            try:
                os.close(data_r)
                os.close(free_w)
                code = _child(stream, self._mem, os.fdopen(data_w, "wb"), os.fdopen(free_r, "rb", buffering=0))
            finally:
                os._exit(code)
        os.close(data_w)
        os.close(free_r)
        self.pid = pid
        self._data = os.fdopen(data_r, "rb")
        self._free = os.fdopen(free_w, "wb", buffering=0)
        self._done = False
        try:
            self._free.write(bytes(range(SLOTS)))
        except BrokenPipeError:
            pass  # the child failed (or finished) first: what it said waits in the data pipe

    def __iter__(self) -> Iterator[Chunk]:
        ended = False
        try:
            while True:
                try:
                    # (an anonymous pipe from the child this process forked: nothing else
                    # can write into it. What it carries is this process's own objects,
                    # numpy columns among them, whose pickles need REDUCE as a hostile
                    # one would: an opcode screen could not tell them apart. The trace
                    # file itself is never unpickled.)
                    kind, body = pickle.load(self._data)
                except (EOFError, pickle.UnpicklingError):  # gone, or gone mid-message
                    raise CommvizError(f"the process reading the trace ended without a word ({self._status()}); "
                                       "run again, or with COMMVIZ_READAHEAD=0 to read it in one process") from None
                if kind == "chunk":
                    yield self._chunk(body)
                elif kind == "end":
                    self._end(body)
                    ended = True
                    return
                else:
                    raise body[0] if isinstance(body[0], Exception) else RuntimeError(body[1])
        finally:
            # At the end the files stay open: the model may still ask for frames of
            # the last chunk's tail (`traces.ingest_chunks` carries it past the end).
            self.close(files=not ended)

    def _chunk(self, body: tuple) -> Chunk:
        slot, arrays, sigs, frames = body
        if slot is not None:
            arrays = _take(self._mem, arrays)
            try:
                self._free.write(bytes([slot]))
            except BrokenPipeError:
                pass  # the child has handed over its last chunk and gone
        k = len(COLUMNS)
        store = EventStore.of_places(_Frames(self._fds, self.stream.files, frames), sigs, arrays[k:])
        return Chunk.from_columns(store, sigs, arrays[:k])

    def _end(self, info) -> None:
        mine = self.stream.info
        mine.problems[:] = info.problems
        mine.bad_frames, mine.truncated, mine.notes = info.bad_frames, info.truncated, info.notes
        self._done = True

    def _status(self) -> str:
        """How the child ended, reaped (it has closed its end of the pipe)."""
        pid, self.pid = self.pid, None
        try:
            _, st = os.waitpid(pid, 0)
        except ChildProcessError:
            return "gone"
        if os.WIFSIGNALED(st):
            return f"killed by signal {os.WTERMSIG(st)}"
        return f"exit status {os.waitstatus_to_exitcode(st)}"

    def close(self, files: bool = True) -> None:
        """The child reaped, the pipes and the slots closed, and, with `files`, the
        trace's files: call it once the model is done with the chunks."""
        if self.pid is not None:
            if not self._done:
                try:
                    os.kill(self.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            os.waitpid(self.pid, 0)
            self.pid = None
        if self._mem is not None:
            for f in (self._data, self._free):
                f.close()
            self._mem.close()
            self._mem = None
        if files and self._fds is not None:
            _release(self._fds, None)
            self._fds = None

    def __del__(self) -> None:  # a caller that never closed: its files, at least, go
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "ChildMerge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _release(fds: list[int], mem: mmap.mmap | None) -> None:
    """The files and the slots, closed; a store still holding the list reads nothing
    through a number the system may give another file (-1: EBADF)."""
    for fd in fds:
        os.close(fd)
    fds[:] = [-1] * len(fds)
    if mem is not None:
        mem.close()


def _child(stream, mem: mmap.mmap, out, free) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends us
    # As `traces.ingest_chunks` does around the merge in one process: decoding and merging
    # make millions of short-lived acyclic objects, which the cyclic collector would walk.
    gc.disable()
    try:
        for chunk in stream.chunks(mark=True):
            arrays = [getattr(chunk, n) for n in COLUMNS] + [getattr(chunk.store, n) for n in PLACES]
            slot = None
            if sum(a.nbytes for a in arrays) <= SLOT_BYTES:
                got = free.read(1)
                if not got:
                    return 0  # the parent is gone
                slot = got[0]
                arrays = _put(mem, slot, arrays)
            pickle.dump(("chunk", (slot, arrays, chunk.sigs, _where(chunk.store.frames))), out, protocol=5)
            out.flush()
        pickle.dump(("end", stream.info), out, protocol=5)
        out.flush()
        return 0
    except BrokenPipeError:
        return 0
    except BaseException as exc:  # said to the parent, which raises it
        try:
            pickle.dumps(exc)
        except Exception:
            exc = None
        try:
            pickle.dump(("error", (exc, traceback.format_exc())), out, protocol=5)
            out.flush()
        except OSError:
            pass
        return 1


def _where(frames: list) -> tuple:
    """A store's frames as (file, offset, length, events) columns, and the objects
    that are not in its columns (`ColFrame.objs`); a frame that was not read from a
    file (torch's files and crash rings, read whole) goes as itself. (Nearly always
    every frame is a ColFrame read from a file: then in columns at once.)"""
    m = len(frames)
    if all(map(ColFrame.__instancecheck__, frames)):
        cols = np.array(list(map(_place, frames)), np.int64).reshape(m, 5)
        if (cols[:, 0] >= 0).all():
            objs = {k: frames[k].objs for k in np.flatnonzero(cols[:, 4]).tolist()}
            return cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3], objs, {}
    file, at, n, count = np.zeros(m, np.int32), np.zeros(m, np.int64), np.zeros(m, np.int32), np.zeros(m, np.int32)
    objs, other = {}, {}
    for k, f in enumerate(frames):
        if type(f) is ColFrame and f.file >= 0:
            file[k], at[k], n[k], count[k] = f.file, f.at, len(f.payload), f.count
            if f.objs is not None:
                objs[k] = f.objs
        elif type(f) is Timed and f.file >= 0:
            file[k], at[k], n[k], count[k] = f.file, f.at, f.size, -1
        else:
            other[k] = f
    return file, at, n, count, objs, other


def _place(f: ColFrame) -> tuple:
    """A ColFrame's file, offset, length, event count and whether it holds objects."""
    return f.file, f.at, len(f.payload), f.count, f.objs is not None


def _put(mem: mmap.mmap, slot: int, arrays: list) -> list:
    """Copies `arrays` into `slot`; what to read them back with."""
    pos = slot * SLOT_BYTES
    layout = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        mem[pos:pos + a.nbytes] = a.data.cast("B") if a.nbytes else b""
        layout.append((a.dtype.str, len(a), pos))
        pos += a.nbytes
    return layout


def _take(mem: mmap.mmap, layout: list) -> list:
    """The arrays `_put` wrote, copied out (the slot is reused at once)."""
    return [np.frombuffer(mem, np.dtype(dt), n, pos).copy() for dt, n, pos in layout]
