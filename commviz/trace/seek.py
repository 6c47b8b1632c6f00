"""Seeking in a replay of any length: checkpoints of the model along the trace.

A replay holds one model, at its position. Going back, or far ahead, needs the model
at another point of the trace: reading again from the start takes minutes past a few
million events, and a trace held whole does not fit in memory. So one pass over the
whole trace runs beside the replay (`SeekIndex`: in a process of its own for a trace
on disk, so that the dashboard keeps its core; on a thread for one already in
memory). It feeds a model of its own, and every so often saves that model and where
the merge stood (`merge.ChunkMergeState`) to a temporary file. A seek restores the latest
checkpoint before its target and reads on from there. The same pass finds what the
timeline shows (the marks, where the trace's diagnoses began), the trace's exact end
and how many events it has.
"""

from __future__ import annotations

import copy
import gc
import gzip
import hashlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from commviz.events import Batch
from commviz.model.merge import ChunkMerge, ChunkMergeState, StreamSource, order_events
from commviz.model.store import END
from commviz.model.timeline import DiagnosisTicks, Tick
from commviz.trace.stream import ListFrames, first_hello_offsets, frame_counts

CHECKPOINTS = 32  # along a trace on disk: a seek then reads at most ~1/32 of it
MIN_SPACING = 100_000  # events between two checkpoints at least (fewer: reading on is quick)
CHUNK = 65_536  # events the index's merge hands on at once (checkpoints fall between chunks)


class MemoryTrace:
    """A trace already in memory (torch's files, tests), behind the face a replay reads:
    exact `start`, `end` and `total`; `cursor(state)`, the events from a checkpoint's
    place; `chunk_merge()` and `state_of`, for the index's pass."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches
        self.events = order_events(batches)
        self.start, self.end = (self.events[0][0], self.events[-1][0]) if self.events else (0, 0)
        self.total: int | None = len(self.events)
        self.path = None

    def cursor(self, state: int | None = None) -> Iterator[tuple[int, int, object]]:
        return iter(self.events[state:]) if state else iter(self.events)

    def chunk_merge(self, chunk: int | None = None) -> ChunkMerge:
        """The merge of `order_events`'s order (each rank's first Hello offset for the
        events it sent before it, too)."""
        source = StreamSource(ListFrames(self.batches), frame_counts(self.batches))
        return ChunkMerge([source], first_hello_offsets(self.batches), chunk or CHUNK)

    def state_of(self, merge: ChunkMerge, n: int) -> int:
        return n


class StreamTrace:
    """A trace on disk (`trace.stream.TraceStream`) behind the same face: `end` is an
    estimate from each rank's last frame until the index has read it all, `total`
    unknown until then."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.path = stream.path
        self.total: int | None = None
        self._first: ChunkCursor | None = ChunkCursor(self.chunk_merge())  # the replay's first cursor
        first = self._first.peek()
        self.start = first[0] if first is not None else 0
        end = stream.end_estimate()
        self.end = max(self.start, end) if end is not None else self.start

    @classmethod
    def known(cls, stream, start: int, end: int) -> StreamTrace:
        """The trace another process opened, its first pass and span handed over."""
        t = cls.__new__(cls)
        t.stream, t.path, t.total, t._first, t.start, t.end = stream, stream.path, None, None, start, end
        return t

    def cursor(self, state: ChunkMergeState | None = None) -> ChunkCursor:
        if state is None and self._first is not None:
            first, self._first = self._first, None
            return first
        return ChunkCursor(self.chunk_merge(state))

    def chunk_merge(self, state: ChunkMergeState | None = None, chunk: int | None = None) -> ChunkMerge:
        return self.stream.chunk_merge(state, chunk or CHUNK)

    def state_of(self, merge: ChunkMerge, n: int) -> ChunkMergeState:
        return merge.state()


class ChunkCursor:
    """A merge's chunks as (time, rank, event), one at a time (a replay plays them
    so), or as whole chunks where a seek can take them whole (`take_chunks`)."""

    def __init__(self, merge: ChunkMerge) -> None:
        self._chunks = iter(merge)
        self._c = None
        self._evs: list | None = None
        self._k = self._n = 0

    def __iter__(self) -> ChunkCursor:
        return self

    def __next__(self) -> tuple[int, int, object]:
        if self._k >= self._n:
            self._load()
        k = self._k
        self._k = k + 1
        if self._evs is None:  # the chunk's objects, made when the replay first plays one of its events
            self._evs = self._c.events(np.arange(self._n))
        return self._times[k], self._ranks[k], self._evs[k]

    def _load(self) -> None:
        c = next(self._chunks)  # StopIteration: the end
        self._c, self._k, self._n = c, 0, len(c)
        self._times, self._ranks, self._evs = c.times.tolist(), c.rank.tolist(), None

    def peek(self) -> tuple[int, int, object] | None:
        """The next event, left to come; None at the end."""
        try:
            item = next(self)
        except StopIteration:
            return None
        self.unread()
        return item

    def unread(self) -> None:
        """Give back the event `next` handed on last."""
        self._k -= 1

    def take_chunks(self, t_max: int, n_left: int | None) -> Iterator:
        """The events still to come, as `store.Chunk`s with their `times`, as long as
        a chunk lies whole at or before `t_max` and within `n_left` events."""
        while True:
            if self._k >= self._n:
                try:
                    self._load()
                except StopIteration:
                    return
            left = self._n - self._k
            if self._times[-1] > t_max or (n_left is not None and left > n_left):
                return
            part = self._c.part(self._k, self._n) if self._k else self._c
            part.times = self._c.times[self._k:]
            self._k = self._n
            if n_left is not None:
                n_left -= left
            yield part


def bytes_read(merge: ChunkMerge) -> int:
    return sum(s.frames.bytes_read for s in merge.sources)


def last_op(chunk, n: int, before: int) -> int:
    """The index of the newest OpStart/OpEnd once `chunk` follows `n` events (`before`
    if it holds none): what a step back undoes first."""
    ops = np.flatnonzero(chunk.kind <= END)
    return n + int(ops[-1]) if len(ops) else before


@dataclass(frozen=True)
class Checkpoint:
    n: int  # events applied
    t: int  # the time of the last of them: a seek to any time at or after it may start here
    last_op: int  # index of the newest OpStart/OpEnd among them (-1: none)
    file: str
    digest: bytes  # SHA-256 of the file as the index wrote it: `load` reads nothing else


@dataclass
class IndexState:
    """What the pass has found so far; read by the replay on other threads (each field
    is swapped or appended whole)."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    fraction: float = 0.0  # of the trace read
    marks: list[Tick] = field(default_factory=list)
    diagnoses: list[Tick] | None = None  # once the pass is over
    total: int | None = None
    end: int | None = None
    error: str = ""


def spacing() -> tuple[int, int, int]:
    """(MIN_SPACING, CHECKPOINTS, CHUNK) as they are here, for a pass in another process."""
    return MIN_SPACING, CHECKPOINTS, CHUNK


class Orphaned(Exception):
    """The replay the index was for is gone."""


def index_pass(trace, template: bytes, cut_off: bool, save_dir: str, send: Callable[[tuple], None],
               total_bytes: int = 0, space: tuple[int, int, int] | None = None,
               alive: Callable[[], bool] | None = None) -> None:
    """One pass over `trace` in chunks (`merge.ChunkMerge`, `Model.ingest`: the
    speed of `commviz summary`), a model unpickled from `template` fed every event:
    ("checkpoint", Checkpoint, fraction, new marks) now and then, ("done", total, end,
    new marks, diagnosis ticks) at the end."""
    least, count, size = space or spacing()
    model = pickle.loads(template)
    seen = DiagnosisTicks(model)
    merge = trace.chunk_merge(chunk=size)
    every = least if total_bytes else max(least, (trace.total or 0) // count)
    step_bytes = total_bytes // count if total_bytes else 0
    next_bytes = step_bytes
    n, newest_op, last_t, since, sent_marks = 0, -1, trace.start, 0, 0
    for chunk in merge:
        if alive is not None and not alive():
            raise Orphaned
        model.ingest(chunk)
        seen.saw_chunk(chunk)
        newest_op = last_op(chunk, n, newest_op)
        n += len(chunk)
        since += len(chunk)
        last_t = int(chunk.times[-1])
        if since >= every and (not step_bytes or bytes_read(merge) >= next_bytes):
            path = os.path.join(save_dir, f"{n}.ckpt")
            ck = Checkpoint(n, last_t, newest_op, path, save(path, model, trace.state_of(merge, n)))
            since = 0
            next_bytes = bytes_read(merge) + step_bytes
            frac = bytes_read(merge) / total_bytes if total_bytes else n / max(trace.total or n, 1)
            send(("checkpoint", ck, min(frac, 1.0), seen.marks[sent_marks:]))
            sent_marks = len(seen.marks)
    diagnoses = seen.ticks(cut_off, last_t) if n else []
    send(("done", n, last_t, seen.marks[sent_marks:], diagnoses))


def save(path: str, model, state) -> bytes:
    """Pickled and compressed as it is written: no copy of it whole in memory. Returns
    the file's SHA-256, which travels to the replay with the checkpoint (`load`)."""
    tmp = path + ".part"
    with open(tmp, "wb") as raw:
        digesting = _Digesting(raw)
        with gzip.GzipFile(fileobj=digesting, mode="wb", compresslevel=1) as f:
            pickle.dump((model, state), f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    return digesting.sha.digest()


class _Digesting:
    """A file being written that hashes what goes into it."""

    def __init__(self, f) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def write(self, b) -> int:
        self.sha.update(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


class CheckpointChanged(ValueError):
    """A checkpoint's file is not the one the index wrote."""


def load(ck: Checkpoint):
    """(model, cursor state) saved at `ck`. A pickle can run code, and these hold the
    model's own classes (REDUCE and NEWOBJ in every one), so no opcode screen could
    tell them from a hostile one; instead the file must be byte for byte the one this
    replay's index wrote: its SHA-256 came with the checkpoint over the index's own
    pipe (or thread), and anything else in the file's place — whoever put it there,
    in a folder `mkdtemp` made for this user alone — is refused before a byte of it
    is unpickled."""
    with open(ck.file, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).digest() != ck.digest:
        raise CheckpointChanged(f"{ck.file} is not the file the index wrote; not loaded")
    with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as f:
        return pickle.load(f)


class SeekIndex:
    """Runs `index_pass` beside a replay and keeps what it found in `state`; `done` is
    set when it is over (or failed: `state.error`). Its files go with it."""

    def __init__(self, trace, template: bytes, cut_off: bool, process: bool | None = None) -> None:
        self.state = IndexState()
        self.done = threading.Event()
        self.dir = tempfile.mkdtemp(prefix="commviz-seek-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self._proc = None
        if process is None:
            process = isinstance(trace, StreamTrace)
        if process:
            self._start_process(trace, template, cut_off)
        else:
            threading.Thread(target=self._run_here, args=(trace, template, cut_off), name="commviz-seek-index",
                             daemon=True).start()

    def close(self) -> None:
        self._finalizer()

    def best(self, n_max: int | None = None, t_max: int | None = None) -> Checkpoint | None:
        """The latest checkpoint with at most `n_max` events, all at or before `t_max`."""
        best = None
        for ck in list(self.state.checkpoints):
            if (n_max is None or ck.n <= n_max) and (t_max is None or ck.t <= t_max):
                best = ck
        return best

    # ------------------------------------------------------------ the pass

    def _run_here(self, trace, template: bytes, cut_off: bool) -> None:
        try:
            total_bytes = trace.stream.total_bytes if isinstance(trace, StreamTrace) else 0
            index_pass(trace, template, cut_off, self.dir, self._take, total_bytes, spacing())
        except Exception as exc:  # the replay goes on without: a seek reads from the start
            self.state.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def _start_process(self, trace, template: bytes, cut_off: bool) -> None:
        # A plain child (`python -m commviz.trace.seek`), not multiprocessing's spawn,
        # which runs the parent's __main__ again in the child (a user's script without
        # a main guard would start a second replay). Its own session: a Ctrl-C in the
        # dashboard's terminal is not its to take. It gets this process's first pass
        # (files, frame counts, where each ended), so that it reads the very frames
        # the replay reads, even of files still growing.
        stream = copy.copy(trace.stream)
        stream.progress = None
        self._log = os.path.join(self.dir, "index.log")
        try:
            with open(self._log, "wb") as log:
                self._proc = subprocess.Popen([sys.executable, "-m", "commviz.trace.seek"], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        except OSError as exc:
            self.state.error = f"the index process did not start ({exc})"
            self.done.set()
            return
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _cleanup, self._proc, self.dir)
        try:
            pickle.dump((stream, trace.start, trace.end, template, cut_off, self.dir, spacing()), self._proc.stdin)
            self._proc.stdin.close()
        except OSError as exc:
            self.state.error = f"the index process did not start ({exc})"
            self.done.set()
            return
        threading.Thread(target=self._listen, args=(self._proc.stdout,), name="commviz-seek-listen",
                         daemon=True).start()

    def _listen(self, pipe) -> None:
        try:
            while not self.done.is_set():
                msg = pickle.load(pipe)
                if msg[0] == "failed":
                    self.state.error = msg[1]
                    break
                self._take(msg)
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            if not self.done.is_set():
                self.state.error = f"the index process ended early ({type(exc).__name__}{_last_line(self._log)})"
        finally:
            self.done.set()
            pipe.close()

    def _take(self, msg: tuple) -> None:
        s = self.state
        if msg[0] == "checkpoint":
            _, ck, frac, marks = msg
            s.checkpoints.append(ck)
            s.fraction = frac
            if marks:
                s.marks = s.marks + marks
        elif msg[0] == "done":
            _, total, end, marks, diagnoses = msg
            if marks:
                s.marks = s.marks + marks
            s.total, s.end, s.fraction = total, end, 1.0
            s.diagnoses = diagnoses
            self.done.set()


def _cleanup(proc, folder: str) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    shutil.rmtree(folder, True)


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1]}" if lines else ""


def _child() -> None:
    """The index process: the pass over the trace the replay opened, its findings
    pickled up its stdout (nothing else goes there). A replay that died (killed, its
    terminal closed) leaves no checkpoints behind: the pass stops at the next chunk
    once this process has another parent, or at its next message, and removes them."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print cannot break the pipe's pickles
    parent = os.getppid()

    def send(msg: tuple) -> None:
        pickle.dump(msg, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()

    save_dir = None
    try:
        stream, start, end, template, cut_off, save_dir, space = pickle.load(sys.stdin.buffer)
        gc.disable()  # millions of short-lived acyclic objects: as `traces.ingest_chunks`
        index_pass(StreamTrace.known(stream, start, end), template, cut_off, save_dir, send, stream.total_bytes,
                   space, alive=lambda: os.getppid() == parent)
    except (BrokenPipeError, Orphaned):
        if save_dir is not None:
            shutil.rmtree(save_dir, True)
    except Exception as exc:
        try:
            send(("failed", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass


if __name__ == "__main__":  # run as `python -m`: its types pickled under their import name, not __main__'s
    from commviz.trace import seek

    seek._child()
