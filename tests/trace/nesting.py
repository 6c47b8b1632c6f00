"""What Perfetto and chrome://tracing require of slices, checked on an exported doc:
complete ("X") slices on one track (pid, tid) nest — each one ends before the one it
starts inside of ends — and async begin/end ("b"/"e") pairs match by (pid, cat, id),
innermost first. Times compared in whole ns, as the viewers convert them."""

from __future__ import annotations

from commviz.events import Batch
from commviz.model import Model, traces
from commviz.trace import perfetto


def to_chrome_trace(batches: list[Batch]) -> dict:
    """As `commviz export` does it: the whole trace through the model, then out."""
    m = Model(keep_ops=True)
    traces.ingest_trace(m, batches)
    return perfetto.to_chrome_trace(m)


def _ns(us: float) -> int:
    return round(us * 1000)


def nesting_errors(doc: dict) -> list[str]:
    errors: list[str] = []
    tracks: dict[tuple, list[dict]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e.get("tid", 0)), []).append(e)
    for track, slices in tracks.items():
        slices.sort(key=lambda e: (_ns(e["ts"]), -_ns(e["dur"])))
        open_: list[dict] = []  # enclosing slices, innermost last
        for e in slices:
            t0, t1 = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
            while open_ and _ns(open_[-1]["ts"]) + _ns(open_[-1]["dur"]) <= t0:
                open_.pop()
            if open_ and t1 > _ns(open_[-1]["ts"]) + _ns(open_[-1]["dur"]):
                errors.append(f"track {track}: {e['name']!r} at {e['ts']} overlaps {open_[-1]['name']!r} "
                              f"at {open_[-1]['ts']} without nesting in it")
            open_.append(e)
    begun: dict[tuple, list[dict]] = {}
    for e in sorted((e for e in doc["traceEvents"] if e["ph"] in "be"), key=lambda e: (_ns(e["ts"]), e["ph"] == "b")):
        key = (e["pid"], e.get("cat"), e.get("id"))
        if e["ph"] == "b":
            begun.setdefault(key, []).append(e)
        elif not begun.get(key):
            errors.append(f"async {key}: end of {e['name']!r} at {e['ts']} without a begin")
        elif begun[key][-1]["name"] != e["name"]:
            errors.append(f"async {key}: end of {e['name']!r} closes {begun[key][-1]['name']!r}")
        else:
            begun[key].pop()
    errors += [f"async {k}: {b['name']!r} never ends" for k, bs in begun.items() for b in bs]
    return errors
