"""The compiled parts, loaded in one place, so `COMMVIZ_PURE=1` turns every one off
and `commviz doctor` can say which are in use and why the others are not.

Each is optional: setup.py builds them with `optional=True` (no compiler, no
extension) and every one has a pure-Python path doing the same work, which CI runs
too. A part whose own check declines it at run time (a layout it does not expect)
says so through `declined`.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os

PARTS = {
    "commviz.probe._fastwrap": "the probe's wrapper and the sender's drain",
    "commviz._fastpack": "encoding a rank's frames and its crash ring",
    "commviz.model._fastcols": "reading frames into the model's columns",
    "commviz.transport._fastrecv": "the watcher's receive loop",
}
# Compiled libraries that are not Python modules: found by path, not imported.
LIBRARIES = {
    "commviz.probe._ncclprof": "NCCL's profiler plugin: what NCCL itself runs (loaded by NCCL, read via ctypes)",
}
STATUS: dict[str, str] = {}  # part -> "loaded" (a library: "built"), or why not


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


def library(name: str) -> str | None:
    """The built library `name` (one of LIBRARIES) by its path, or None (and why, in STATUS)."""
    if pure():
        STATUS[name] = "off (COMMVIZ_PURE=1)"
        return None
    pkg, _, base = name.rpartition(".")
    spec = importlib.util.find_spec(pkg)
    here = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    found = sorted(glob.glob(os.path.join(here, base + "*.so"))) if here else []
    if not found:
        STATUS[name] = "not built; reinstall with a C compiler: pip install -e ."
        return None
    STATUS.setdefault(name, "built")
    return found[0]


def report() -> dict[str, str]:
    """Every part's state, loading any not asked for yet."""
    for name in PARTS:
        if name not in STATUS:
            load(name)
    for name in LIBRARIES:
        if name not in STATUS:
            library(name)
    return {name: STATUS[name] for name in (*PARTS, *LIBRARIES)}
