"""Reading a trace for a command: the one loader (`commviz.trace.sources.open_trace`:
a commviz trace, or torch's own files recognised by content), its refusal as a
CommvizError, what it could not read or cannot tell said on stderr by viewers."""

from __future__ import annotations

import sys
import time

from commviz.errors import CommvizError


RANK_MAP_HELP = ("torch's dumps whose file names end in no rank: which rank wrote FILE "
                 "(repeatable, or comma-separated)")


def add_path_arguments(p, optional: bool = False) -> None:
    p.add_argument("path", metavar="FILE_OR_DIR", **({"nargs": "?"} if optional else {}))
    p.add_argument("--rank-map", action="append", metavar="FILE=RANK", help=RANK_MAP_HELP)


def load_trace(path, note: bool = True, rank_map: list[str] | None = None):
    """A trace file or dir. A file that is no trace at all is an error; what could not
    be read, and what torch's files cannot tell, is a note on stderr (`note`) and the
    load goes on."""
    from commviz.trace.sources import open_trace
    from commviz.trace.torchfiles import parse_rank_map

    return _opened(lambda p: open_trace(p, parse_rank_map(rank_map)), path, note)


def _opened(opener, path, note: bool):
    """`opener(path)`, its refusal as a CommvizError, its problems and notes as lines
    on stderr (`note`)."""
    from commviz.trace.file import TraceError

    try:
        got = opener(path)
    except (TraceError, OSError, ValueError) as exc:
        raise CommvizError(str(exc)) from exc
    if note:
        for p in got.problems + got.notes:
            print(f"commviz: note: {p}", file=sys.stderr)
    return got


# Files smaller than this load in about a second: no progress lines for them.
PROGRESS_FROM_BYTES = 32 << 20
PROGRESS_EVERY_S = 1.0


class Progress:
    """`commviz: reading FILE: 45% (48 of 106 MiB)` on stderr, at most once a second,
    for a trace big enough to take a while (`scanning` in the first pass, which reads
    only each frame's head)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._last = time.monotonic()

    def __call__(self, done: int, total: int, what: str = "reading") -> None:
        now = time.monotonic()
        if total < PROGRESS_FROM_BYTES or now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        print(f"commviz: {what} {self.name}: {100 * done // max(total, 1)}% "
              f"({done >> 20} of {total >> 20} MiB)", file=sys.stderr, flush=True)


def open_stream(path, note: bool = True, rank_map: list[str] | None = None):
    """A trace file or dir opened for reading in bounded memory (`trace.stream`):
    the first pass has run, `events()` streams (torch's files are read whole). Errors
    and notes as `load_trace`."""
    from commviz.trace.stream import open_trace
    from commviz.trace.torchfiles import parse_rank_map

    ranks = parse_rank_map(rank_map)
    return _opened(lambda p: open_trace(p, progress=Progress(str(p)), rank_map=ranks), path, note)
