"""Which reader a path needs, by content: a commviz trace (or a COMMVIZ_TRACE_DIR of
them), else torch's own files (flight-recorder dumps, profiler traces). The one entry
point for every command that opens a trace (summary, replay, export)."""

from __future__ import annotations

import os
from pathlib import Path

from commviz.trace.file import MAGIC, SUFFIX, Loaded, TraceError, load, read_trace
from commviz.trace.torchfiles import TorchFileError, load_torch


def open_trace(path: str | os.PathLike, rank_map: dict[str, int] | None = None) -> Loaded:
    """Everything readable at `path`; TraceError when nothing is (the message says why).
    `rank_map` places torch's files whose names end in no rank (file name -> rank)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if p.is_dir():
        if any(p.glob(f"*{SUFFIX}")):
            return load(p)
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        if not files:
            raise TraceError(f"{p}: empty (expected rank-<R>{SUFFIX} from COMMVIZ_TRACE_DIR, "
                             "or torch's flight-recorder dumps / profiler traces)")
        try:
            return load_torch(files, rank_map)
        except TorchFileError as exc:
            raise TraceError(f"{p}: no {SUFFIX} files and none of torch's files here: {exc}") from None
    with open(p, "rb") as f:
        head = f.read(len(MAGIC))
    if head == MAGIC or p.suffix == SUFFIX:  # ours, or meant to be: its own reader says what is wrong
        return read_trace(p)
    try:
        return load_torch([p], rank_map)
    except TorchFileError as exc:
        raise TraceError(str(exc)) from None
