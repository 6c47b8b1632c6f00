"""Captured Python stacks: which frame is the user's own code, and the latest stacks
per rank in bounded memory.

A person debugging a hang wants the line in *their* script that called the
collective, not the twenty frames of torch, commviz and the standard library
underneath it. The rank knows its own library directories and may send them with the
stack (`Stack.lib_dirs`); the usual layouts are also recognised by path, because the
watcher may run on another machine with other paths.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass

from commviz.events import QUIET_OP, Frame, Stack

# Stacks kept per rank (one per op the probe reported on), newest last.
STACKS_PER_RANK = 8
# Frames kept per stack: the innermost ones, where the rank is actually waiting.
MAX_FRAMES = 200
# Threads kept of a rank's latest quiet capture.
QUIET_THREADS = 8

# torch, commviz's rank-side code and the standard library, by path, wherever they
# are installed (site-packages, a source checkout, a system Python).
_INTERNAL = re.compile(
    r"""(
        [/\\](site|dist)-packages[/\\](torch|commviz)[/\\]
      | [/\\]torch[/\\](_[^/\\]*|distributed|nn|utils|autograd|cuda|optim|amp|functional\.py|overrides\.py|__init__\.py)
      | [/\\]commviz[/\\](probe|_bootstrap|transport)[/\\]
      | [/\\]commviz[/\\](run|launch|__init__)\.py$
      | [/\\]lib[/\\]python\d+(\.\d+)?[/\\](?!site-packages|dist-packages)
      | [/\\]Lib[/\\](?!site-packages)
    )""",
    re.VERBOSE,
)
# Third-party libraries (Lightning, DeepSpeed, …): better than torch's frames when the
# user's own code is not on the stack at all, worse than the user's script.
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]")

INTERNAL, LIBRARY, USER = 0, 1, 2


def frame_rank(path: str, lib_dirs: list[str] | tuple[str, ...] = ()) -> int:
    """How much a frame in `path` says about where the *user* is: USER for their own
    code, LIBRARY for a third-party package, INTERNAL for torch, commviz, the standard
    library and pseudo-files (`<frozen runpy>`, `<string>`)."""
    if not path or path.startswith("<"):
        return INTERNAL
    for d in lib_dirs:
        d = d.rstrip("/\\")
        if d and path.startswith(d) and (len(path) == len(d) or path[len(d)] in "/\\"):
            return INTERNAL
    if _INTERNAL.search(path):
        return INTERNAL
    if _LIBRARY.search(path):
        return LIBRARY
    return USER


def user_frame_index(frames: list[Frame], lib_dirs: list[str] | tuple[str, ...] = ()) -> int | None:
    """Index of the innermost frame of the user's own code (the line that led to the
    call); failing that the innermost third-party library frame; None when every
    frame is torch, commviz or the standard library."""
    best, best_rank = None, INTERNAL
    for i in range(len(frames) - 1, -1, -1):
        r = frame_rank(frames[i].file, lib_dirs)
        if r > best_rank:
            best, best_rank = i, r
            if r == USER:
                break
    return best


def short_where(frame: Frame) -> str:
    """`train.py:88`: the file's base name and line, for one-line messages."""
    name = re.split(r"[/\\]", frame.file)[-1] if frame.file else "?"
    return f"{name}:{frame.line}"


@dataclass
class StackInfo:
    """A stack as received, with its wall-clock time and the user frame worked out once."""

    op_id: int
    t_wall: int
    thread: str
    frames: list[Frame]  # outermost first
    user_index: int | None

    @property
    def user_frame(self) -> Frame | None:
        return None if self.user_index is None else self.frames[self.user_index]

    def where(self) -> str:
        f = self.user_frame
        return short_where(f) if f is not None else ""

    def to_json(self, rank: int, now: int) -> dict:
        """The diagnosis' view: the user frame first, then the whole stack innermost
        first, each frame flagged `user` or not."""
        uf = self.user_frame
        frames = []
        for i in range(len(self.frames) - 1, -1, -1):
            f = self.frames[i]
            frames.append(
                {"file": f.file, "line": f.line, "function": f.function, "text": f.text, "user": i == self.user_index}
            )
        return {
            "rank": rank,
            "op_id": self.op_id,
            "thread": self.thread,
            "age_s": round(max(0, now - self.t_wall) / 1e9, 3),
            "where": self.where(),
            "user_frame": None
            if uf is None
            else {"file": uf.file, "line": uf.line, "function": uf.function, "text": uf.text},
            "frames": frames,
        }


class StackStore:
    """The latest stacks of one rank, keyed by op id, at most STACKS_PER_RANK; and its
    threads' stacks of the latest capture taken because it started no op for a while
    (QUIET_OP), at most QUIET_THREADS."""

    __slots__ = ("_by_op", "_quiet")

    def __init__(self) -> None:
        self._by_op: collections.OrderedDict[int, StackInfo] = collections.OrderedDict()
        self._quiet: list[StackInfo] = []

    def add(self, s: Stack, t_wall: int) -> StackInfo:
        frames = list(s.frames[-MAX_FRAMES:])
        lib_dirs = [d for d in s.lib_dirs if d]
        info = StackInfo(s.op_id, t_wall, s.thread, frames, user_frame_index(frames, lib_dirs))
        if s.op_id == QUIET_OP:
            if self._quiet and self._quiet[0].t_wall != t_wall:
                self._quiet = []  # a newer capture replaces the last one whole
            if len(self._quiet) < QUIET_THREADS:
                self._quiet.append(info)
            return info
        self._by_op.pop(s.op_id, None)
        self._by_op[s.op_id] = info
        while len(self._by_op) > STACKS_PER_RANK:
            self._by_op.popitem(last=False)
        return info

    def for_op(self, op_id: int) -> StackInfo | None:
        return self._by_op.get(op_id)

    def quiet(self, since_wall: int = 0) -> list[StackInfo]:
        """The threads of the latest quiet capture taken at or after `since_wall`
        (older ones say where the rank was before its last op), the main thread first."""
        q = self._quiet
        return list(q) if q and q[0].t_wall >= since_wall else []

    def culprit(self, since_wall: int = 0) -> StackInfo | None:
        """Of the latest quiet capture, the thread that best says where the rank is:
        the first (main first) whose stack has the user's own code, else the main."""
        q = self.quiet(since_wall)
        if not q:
            return None
        for st in q:
            f = st.user_frame
            if f is not None and frame_rank(f.file) == USER:
                return st
        return q[0]

    def __len__(self) -> int:
        return len(self._by_op)
