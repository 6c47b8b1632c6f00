"""Reading a trace for a command: the one loader (`commviz.trace.file.load`), its
refusal as a CommvizError, what it could not read said on stderr by viewers."""

from __future__ import annotations

import sys

from commviz.errors import CommvizError


def load_trace(path, note: bool = True):
    """A trace file or dir. A file that is no trace at all is an error; what could not
    be read is a note on stderr (`note`) and the load goes on."""
    from commviz.trace.file import TraceError, load

    try:
        loaded = load(path)
    except (TraceError, OSError) as exc:
        raise CommvizError(str(exc)) from exc
    if note:
        for p in loaded.problems:
            print(f"commviz: note: {p}", file=sys.stderr)
    return loaded
