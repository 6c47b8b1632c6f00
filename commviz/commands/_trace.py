"""Reading a trace for a command: the one loader (`commviz.trace.sources.open_trace`:
a commviz trace, or torch's own files recognised by content), its refusal as a
CommvizError, what it could not read or cannot tell said on stderr by viewers."""

from __future__ import annotations

import sys

from commviz.errors import CommvizError


RANK_MAP_HELP = ("torch's dumps whose file names end in no rank: which rank wrote FILE "
                 "(repeatable, or comma-separated)")


def add_path_arguments(p) -> None:
    p.add_argument("path", metavar="FILE_OR_DIR")
    p.add_argument("--rank-map", action="append", metavar="FILE=RANK", help=RANK_MAP_HELP)


def load_trace(path, note: bool = True, rank_map: list[str] | None = None):
    """A trace file or dir. A file that is no trace at all is an error; what could not
    be read, and what torch's files cannot tell, is a note on stderr (`note`) and the
    load goes on."""
    from commviz.trace.file import TraceError
    from commviz.trace.sources import open_trace
    from commviz.trace.torchfiles import parse_rank_map

    try:
        loaded = open_trace(path, parse_rank_map(rank_map))
    except (TraceError, OSError, ValueError) as exc:
        raise CommvizError(str(exc)) from exc
    if note:
        for p in loaded.problems + loaded.notes:
            print(f"commviz: note: {p}", file=sys.stderr)
    return loaded
