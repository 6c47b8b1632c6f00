"""A pytest plugin (`-p outcomes`, with this folder on PYTHONPATH) that writes one
JSON line per test to $PEER_OUTCOMES: its id, outcome (passed, failed, skipped; an
error in setup or teardown is a failure), wall-clock start and stop, and the last
lines of what failed. bench/peer_suite.py compares two runs by these lines and maps
each rank process commviz saw to its test by the start and stop."""

import json
import os

_path = os.environ.get("PEER_OUTCOMES")
_open: dict = {}


def _write(rec: dict) -> None:
    with open(_path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def pytest_runtest_logreport(report):
    if not _path:
        return
    rec = _open.setdefault(report.nodeid, {"test": report.nodeid, "outcome": "passed", "start": report.start,
                                           "stop": report.stop, "why": ""})
    rec["start"], rec["stop"] = min(rec["start"], report.start), max(rec["stop"], report.stop)
    if report.skipped and rec["outcome"] == "passed":
        rec["outcome"] = "skipped"
        longrepr = report.longrepr
        rec["why"] = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)[:300]
    elif report.failed:
        rec["outcome"] = "failed"
        rec["why"] = str(report.longrepr)[-1500:]
    if report.when == "teardown":
        _write(_open.pop(report.nodeid))
