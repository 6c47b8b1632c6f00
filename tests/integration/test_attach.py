"""`commviz attach` on a job nobody started under commviz (issue 30, item 3): a real
4-rank torchrun job, stalled in plain Python on rank 2, diagnosed from another
process through py-spy — the hang, the ranks waiting, the culprit's line."""

import json
import os
import shutil
import signal
import subprocess

import pytest

from commviz.attach.discover import find_ranks, parent_of
from tests.helpers import wait_for
from tests.integration.conftest import REPO, commviz, run, torchrun

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed (dev extra)")]

JOB = os.path.join(REPO, "tests", "integration", "jobs", "stalled_stage.py")


def last_call(mark, rank: int) -> str | None:
    """What rank `rank` of the job went to do last (stalled_stage.py's `about_to`)."""
    try:
        return (mark.parent / f"{mark.name}.{rank}").read_text()
    except FileNotFoundError:
        return None


@pytest.fixture
def stalled_job(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMVIZ")}
    mark = tmp_path / "stalled"
    env.update(COMMVIZ="0", STALL_MARK=str(mark))
    p = subprocess.Popen(torchrun(4, JOB), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    workers: list[int] = []
    try:
        assert wait_for(mark.exists, 60), "rank 2 never entered its stall"
        # the others, blocked behind it: each wrote where it went last (the job's `about_to`)
        blocked = {0: "send 4", 1: "send 3", 3: "recv 2"}
        assert wait_for(lambda: {r: last_call(mark, r) for r in blocked} == blocked, 30), \
            {r: last_call(mark, r) for r in blocked}
        workers = [r.pid for r in find_ranks() if parent_of(r.pid) == p.pid]
        yield workers
    finally:
        os.killpg(p.pid, signal.SIGTERM)  # torchrun's agent stops its workers (their own sessions)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass



def test_attach_finds_the_job_and_names_the_culprits_line(stalled_job, tmp_path):
    assert len(stalled_job) == 4
    p = run(commviz("attach", "--pid", str(stalled_job[0]), "--json", "--interval", "1.5", "--save",
                    str(tmp_path / "seen")), timeout=120)
    assert p.returncode == 3, p.stderr
    doc = json.loads(p.stdout)
    a = doc["attach"]
    assert a["launcher"] == "torchrun" and a["ranks_here"] == [0, 1, 2, 3] and a["stacks"]["read"] == 4
    hangs = [d for d in doc["diagnoses"] if d["kind"] == "hang"]
    assert hangs and all(d["missing_ranks"] == [2] for d in hangs), doc["diagnoses"]
    recv = next(d for d in hangs if d["op"] == "recv")
    assert recv["waiting_ranks"] == [3]
    assert "now in load_next_shard (stalled_stage.py:17)" in recv["message"]
    culprit = {s["rank"]: s for s in recv["stacks"]}[2]
    assert culprit["user_frame"]["function"] == "load_next_shard"
    groups = {(g["op"], g["where"]): g["ranks"] for g in a["roll_call"]["groups"]}
    assert groups[("", "stalled_stage.py:17")] == "2" and groups[("send", "stalled_stage.py:39")] == "0,1"
    assert any("TORCH_FR_BUFFER_SIZE" in t for t in a["next_time"])
    # what was seen, saved as a trace dir, reads as the same hang in summary (the multi-node recipe)
    s = json.loads(run(commviz("summary", str(tmp_path / "seen"), "--json", "--hang-after", "1")).stdout)
    assert any(d["kind"] == "hang" and d["missing_ranks"] == [2] for d in s["diagnoses"]), s["diagnoses"]


def test_attach_with_no_job_says_what_it_looks_for():
    p = run(commviz("attach", "--pid", str(os.getpid())))
    assert p.returncode == 2 and "RANK and WORLD_SIZE" in p.stderr
