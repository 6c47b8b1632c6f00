"""A local flood (garbage, deeply nested msgpack, multi-part messages, 1 MB frames and
a 20 MB one, from many peers) leaves the watcher and its dashboard within a memory
ceiling, and the memory comes back when the flood is over. Measured in a subprocess
by bench/flood.py; the ceiling is generous (~100 MB measured) and holds on a loaded box."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CEILING_MB = 250


def flood(*args: str) -> dict:
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "flood.py"), "--json", *args],
                       capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=REPO))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_hostile_flood_stays_under_the_ceiling_with_the_dashboard():
    # The flood lasts until the watcher has turned away 20,000 frames (a loaded box
    # is slow to deliver it), at least 2 s, at most 60 s.
    got = flood("--peers", "40", "--seconds", "2", "--mix", "hostile", "--settle", "1.5", "--min-rejected", "20000")
    assert got["rejected"] >= 20000  # it was a flood, and it was turned away
    assert got["frames"] == 0  # none of it reached the model
    assert got["peak_mb"] < CEILING_MB, got
    assert got["end_mb"] < CEILING_MB, got


def test_more_connections_than_the_cap_sending_the_largest_frames_stay_under_the_ceiling():
    """The worst case for memory: every peer sends garbage frames of the largest size
    the watcher takes, over more connections than it keeps open at once, while the
    reader takes nothing for 3 s (so zmq's queues fill to whatever bounds them: main
    before the cap peaked at 666 MB here; with it, 63-94 MB)."""
    got = flood("--peers", "300", "--seconds", "2", "--stall", "3", "--mix", "big",
                "--settle", "1.5", "--min-rejected", "500")
    assert got["peak_mb"] < CEILING_MB, got
    assert got["end_mb"] < CEILING_MB, got
    assert got["evicted"] > 0 and got["frames"] == 0  # garbage senders lost their connections
