"""`watch`'s collector in a process of its own (commands/_collector.py): a real
`commviz serve` child, a real rank's frames, the dashboard's view of them."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from commviz.commands._collector import SpawnedCollector, SpawnedFeed
from commviz.errors import CommvizError
from commviz.events import Hello, OpEnd, OpStart, encode_batch
from commviz.trace.file import read_trace
from commviz.transport.client import Client
from commviz.viewlink import ViewQuery
from tests.helpers import wait_for


def _rank_sends(addr: str, rank: int, ops: int) -> Client:
    c = Client(addr, identity=f"rank{rank}".encode())
    evs = [Hello(rank, rank, 2, "h", 4000 + rank, "gloo", "cpu", "2", "0", "j", time.monotonic_ns(), time.time_ns())]
    for i in range(ops):
        evs += [OpStart(i, time.monotonic_ns(), "all_reduce", "0", i, 64), OpEnd(i, time.monotonic_ns())]
    assert wait_for(lambda: c.send(encode_batch(rank, evs)), timeout=30)
    return c


def test_the_dashboard_draws_a_collector_in_another_process_and_quitting_marks_the_stop(sockdir, tmp_path):
    """What `watch --record` now runs: the frames go to the child, the view reads
    them back, the stop marker lands in the trace before the child closes it."""
    trace = tmp_path / "t.cvz"
    feed = SpawnedFeed(SpawnedCollector(f"ipc://{sockdir}/w.sock", str(trace), 10.0))
    try:
        pid = feed.collector.proc.pid
        assert pid != os.getpid()
        c = _rank_sends(feed.addr, 0, 5)
        assert wait_for(lambda: feed.fetch(ViewQuery()).info.events == 11, timeout=30)
        status = feed.fetch(ViewQuery()).status
        assert status.startswith(f"listening on {feed.addr} · 1 ranks · 11 events"), status
        feed.note_stop("commviz watch", "quit while it ran")
        c.close()
    finally:
        feed.close()
    assert feed.collector.proc.returncode == 0
    stops = [ev for b in read_trace(trace).batches for ev in b.events if type(ev).__name__ == "Stopped"]
    assert [(s.by, s.reason) for s in stops] == [("commviz watch", "quit while it ran")]


def test_a_collector_that_cannot_listen_says_why(sockdir):
    with pytest.raises(CommvizError, match="the collector did not start") as got:
        SpawnedCollector("tcp://256.1.1.1:1", None, 10.0)
    assert "256.1.1.1" in str(got.value)  # its own words, not only ours


def test_the_collector_stops_by_itself_when_the_dashboard_is_gone(sockdir):
    """A dashboard killed outright (SIGKILL: no `close`) leaves no collector behind
    holding the ranks' socket."""
    code = textwrap.dedent(f"""
        import sys, time
        from commviz.commands._collector import SpawnedCollector
        c = SpawnedCollector("ipc://{sockdir}/w.sock", None, 10.0)
        print(c.proc.pid, flush=True)
        time.sleep(60)
    """)
    dash = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(dash.stdout.readline())
        dash.kill()
        dash.wait()

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            with open(f"/proc/{child}/stat") as f:  # a zombie until init reaps it
                return f.read().split(") ", 1)[1].startswith("Z")

        assert wait_for(gone, timeout=20)
    finally:
        dash.kill()


def test_the_dashboards_own_collector_answers_no_one_without_its_token(sockdir):
    """Another user on the machine reaches 127.0.0.1 too: the view of a dashboard's
    own collector (job names, stacks, and a snapshot under the model's lock per
    request) wants the token only that dashboard holds."""
    import urllib.error
    import urllib.request

    feed = SpawnedFeed(SpawnedCollector(f"ipc://{sockdir}/w.sock", None, 10.0))
    try:
        with pytest.raises(urllib.error.HTTPError) as got:
            urllib.request.urlopen(feed.url + "/view/hello", timeout=10)
        assert got.value.code == 401
        assert feed.fetch(ViewQuery()).snap is not None  # the dashboard itself gets in
    finally:
        feed.close()


def test_a_second_view_of_the_same_user_joins_the_dashboards_collector(sockdir):
    """`watch -- CMD` in one terminal, `watch --connect` or `summary --live` in another:
    the collector left its view's token in the per-user directory, so this user's
    other views and scripts get in with no token given, and no one else does."""
    from commviz.httpview import fetch_summary
    from commviz.viewlink import RemoteFeed, local_token

    addr = f"ipc://{sockdir}/w.sock"
    feed = SpawnedFeed(SpawnedCollector(addr, None, 10.0))
    c = _rank_sends(addr, 0, 5)
    try:
        assert local_token(feed.url) == feed.collector.view_token
        other = RemoteFeed(addr, token=None)  # by the ranks' address, as `watch --connect ADDR`
        assert wait_for(lambda: [r.ops_done for r in other.fetch(ViewQuery()).snap.rank_rows] == [5], timeout=30)
        assert fetch_summary(addr)["per_rank"][0]["ops"]["all_reduce"]["count"] == 5
    finally:
        c.close()
        feed.close()
    assert local_token(feed.url) is None  # gone with its collector


def test_a_preset_the_dashboard_was_given_places_the_ranks_in_its_collector(sockdir):
    """`lesson --topology PRESET` on CPU ranks: the snapshot, now taken in the
    collector, puts them on the preset's GPUs."""
    feed = SpawnedFeed(SpawnedCollector(f"ipc://{sockdir}/w.sock", None, 10.0, topology="pcie-2gpu"))
    try:
        c = _rank_sends(feed.addr, 0, 1)
        assert wait_for(lambda: feed.fetch(ViewQuery(simulate=True)).info.nranks == 1, timeout=30)
        snap = feed.fetch(ViewQuery(simulate=True)).snap
        assert snap.simulated and snap.places[0].gpu == 0
        c.close()
    finally:
        feed.close()


def test_a_collector_that_dies_says_so_on_the_status_line(sockdir):
    feed = SpawnedFeed(SpawnedCollector(f"ipc://{sockdir}/w.sock", None, 10.0))
    try:
        feed.collector.proc.kill()
        feed.collector.proc.wait()
        status = feed.fetch(ViewQuery()).status
        assert status.startswith("the collector exited (status -9)"), status
    finally:
        feed.close()
