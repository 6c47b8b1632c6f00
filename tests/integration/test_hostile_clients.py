"""`commviz serve --http` while a 4-rank job streams to it, and clients that hold
connections without asking, ask in garbage, send headers that never end, read their
answers slowly or bring the wrong token (bench/hostile_http.py does it all and
measures). http.server's ThreadingHTTPServer held 2,010 threads for 2,000
half-requests, logged 44,000 lines of tracebacks and left /summary unanswered for
over 10 s (issue 49). Now the job's counts stay exact, /summary answers throughout
(most at once), the collector's threads stay few and its log short."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ITERS = 300


@pytest.fixture(scope="module")
def bench():
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("hostile_http", root / "bench" / "hostile_http.py")
    mod = sys.modules["hostile_http"] = importlib.util.module_from_spec(spec)  # (its dataclass looks it up)
    spec.loader.exec_module(mod)
    return mod


def test_hostile_clients_cost_the_collector_nothing_it_needs(bench, isolated_env):
    m = bench.measure(str(isolated_env), idle=2000, iters=ITERS)
    assert m.job_rc == 0, m.job_err
    assert m.per_rank_counts == [ITERS] * 4 and m.per_rank_bytes == [ITERS * 4096] * 4  # the job is exact
    # Every /summary answered (each waits at most 10 s), most of them at once. Under http.server
    # it went unanswered for over 10 s; the bound on the slowest is loose because CI runs this
    # beside two other test workers on two cores (one answer once took 1.02 s there).
    took = sorted(m.summary_s)
    assert len(took) >= 5 and took[len(took) // 2] < 0.25 and took[-1] < 5.0, took
    assert max(m.threads) <= 64, m.threads
    assert m.rss_growth < 100 * 2**20
    assert m.answers["wrong token"].startswith(b"HTTP/1.1 401")
    assert m.answers["post"].startswith(b"HTTP/1.1 405")
    for k in ("garbage", "oversized"):  # a 400, or the connection closed: never a hang
        assert m.answers[k] == b"" or m.answers[k].split(b" ")[1].startswith(b"4"), (k, m.answers[k])
    e = m.client_errors
    assert e.get("evicted", 0) > 0 and e.get("no token", 0) >= 1 and e.get("method not allowed") == 1, e
    assert not any("Traceback" in line for line in m.log), m.log[:40]
    assert len(m.log) < 60, m.log  # one line per kind per minute, and serve's own
