"""`commviz serve` (issue 31): the collector with no screen, a job streaming to it,
and the summary document of what it holds asked for while it runs
(`summary --live`) and dashboards as clients (`watch --connect`), exact; then its
trace file the same."""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.helpers import free_port
from tests.integration.conftest import REPO, commviz, run, torchrun

pytestmark = pytest.mark.integration

ALLREDUCE = os.path.join(REPO, "scenarios", "allreduce.py")



def test_serve_collects_a_job_and_answers_its_summary_live(isolated_env):
    addr = f"ipc://{isolated_env}/sock/serve.sock"
    port = free_port()
    out = isolated_env / "t.cvz"
    srv = subprocess.Popen(commviz("serve", "--listen", addr, "--http", str(port), "-o", str(out), "--for", "120"),
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        from commviz.viewlink import local_token, token_path

        deadline = time.monotonic() + 20
        while local_token(f"127.0.0.1:{port}") is None and time.monotonic() < deadline:
            time.sleep(0.2)
        token = local_token(f"127.0.0.1:{port}")
        assert token and os.stat(token_path(f"127.0.0.1:{port}")).st_mode & 0o077 == 0  # this user's only
        job = run(torchrun(4, ALLREDUCE, "--iters", "30", "--numel", "1024"), env={"COMMVIZ_ADDR": addr})
        assert job.returncode == 0, job.stderr[-2000:]
        deadline = time.monotonic() + 20
        while True:  # the last frames land within a flush or two
            s = json.loads(run(commviz("summary", "--live", f"127.0.0.1:{port}", "--json")).stdout)
            done = [pr for pr in s["per_rank"] if pr["ops"].get("all_reduce", {}).get("count") == 30]
            if len(done) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert len(done) == 4, s["per_rank"]
        assert all(pr["ops"]["all_reduce"]["bytes"] == 30 * 4096 for pr in s["per_rank"])
        # (on a loaded box one rank may truly arrive late most of the time: a straggler
        # is then what the job did; anything else would be wrong for a healthy job)
        assert s["world_size"] == 4 and [d for d in s["diagnoses"] if d["kind"] != "straggler"] == []
        # two dashboards' worth of views on the same collector, while it runs
        from commviz.viewlink import RemoteFeed, ViewQuery

        views = [RemoteFeed(f"127.0.0.1:{port}"), RemoteFeed(addr)]  # by --http, by the ranks' address
        for v in views:
            snap = v.fetch(ViewQuery()).snap
            assert [(row.rank, row.ops_done, row.bytes) for row in snap.rank_rows] == \
                [(r, 30, 30 * 4096) for r in range(4)]
        # loopback is no trust boundary: another user on the machine, without the token, gets nothing
        for path in ("/summary", "/view/hello"):
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/nothing", headers={
                "Authorization": f"Bearer {token}"})) as r:
            pytest.fail(f"an unknown path answered {r.status}")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404 and b"/summary" in exc.read()
    finally:
        srv.terminate()
        stdout, _ = srv.communicate(timeout=30)
    assert "4 ranks connected" in stdout and "stopped" in stdout
    assert not os.path.exists(f"{isolated_env}/sock/serve.sock.http")  # its note went with it
    assert local_token(f"127.0.0.1:{port}") is None  # and its token
    s = json.loads(run(commviz("summary", str(out), "--json")).stdout)
    assert [pr["ops"]["all_reduce"]["count"] for pr in s["per_rank"]] == [30] * 4
