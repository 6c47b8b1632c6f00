"""Instrument a process as soon as it imports torch.distributed, without touching
the user's script. Used by the start-up hook and by `python -m commviz.run`.

The hook is transparent.when_imported's, the one commviz patches every module with:
it waits for the import, never makes it, and never takes itself off `sys.meta_path`
while the import system walks the list (which would skip the finder after it)."""

from __future__ import annotations

import sys

from commviz.probe import transparent

_TARGET = "torch.distributed"
_armed = False


def _instrument(module) -> None:
    from commviz import instrument

    instrument()


def _off(exc: Exception) -> None:  # never stop the user's program from starting
    sys.stderr.write(f"commviz: auto-instrumentation is off: {type(exc).__name__}: {exc}\n")


def arm() -> None:
    global _armed
    if not _armed:
        _armed = True
        transparent.when_imported(_TARGET, _instrument, _off)
