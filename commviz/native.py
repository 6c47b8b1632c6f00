"""The compiled parts, loaded in one place, so `COMMVIZ_PURE=1` turns every one off
and `commviz doctor` can say which are in use and why the others are not.

Each is optional: setup.py builds them with `optional=True` (no compiler, no
extension) and every one has a pure-Python path doing the same work, which CI runs
too. A part whose own check declines it at run time (a layout it does not expect)
says so through `declined`.
"""

from __future__ import annotations

import importlib
import os

PARTS = {
    "commviz.probe._fastwrap": "the probe's wrapper and the sender's drain",
    "commviz._fastpack": "encoding a rank's frames and its crash ring",
    "commviz.model._fastcols": "reading frames into the model's columns",
    "commviz.transport._fastrecv": "the watcher's receive loop",
}
STATUS: dict[str, str] = {}  # part -> "loaded", or why not


def pure() -> bool:
    return os.environ.get("COMMVIZ_PURE", "") not in ("", "0")


def load(name: str):
    """The compiled module `name`, or None (and why, in STATUS)."""
    if pure():
        STATUS[name] = "off (COMMVIZ_PURE=1)"
        return None
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        STATUS[name] = f"not built ({exc}); reinstall with a C compiler: pip install -e ."
        return None
    STATUS.setdefault(name, "loaded")
    return mod


def declined(name: str, why: str) -> None:
    STATUS[name] = f"built, not used: {why}"


def report() -> dict[str, str]:
    """Every part's state, loading any not asked for yet."""
    for name in PARTS:
        if name not in STATUS:
            load(name)
    return {name: STATUS[name] for name in PARTS}
