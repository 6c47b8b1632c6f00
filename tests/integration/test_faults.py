"""A watcher that freezes, dies and comes back costs the job nothing and loses
nothing that a trace dir keeps; a rank that dies is marked dead in seconds."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from commviz.trace.file import load
from tests.integration.conftest import JOBS, REPO, commviz, ends_per_rank, run, torchrun

pytestmark = pytest.mark.integration

FREEZE_S = 8  # the issue says 30 s; 8 keeps CI short and already overflows nothing


def start_watcher(addr, out):
    p = subprocess.Popen([sys.executable, os.path.join(JOBS, "headless_watcher.py"), addr, str(out)],
                         cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "listening"
    return p


def wait_line(p, prefix, timeout):
    """The first stdout line of `p` starting with prefix (the watcher prints as it learns)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = p.stdout.readline()
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no '{prefix}' from the watcher in {timeout} s")


def rss(pids):
    import psutil

    return {pid: psutil.Process(pid).memory_info().rss for pid in pids}


def rank_pids(job):
    import psutil

    return [c.pid for c in psutil.Process(job.pid).children(recursive=True) if "allreduce.py" in " ".join(c.cmdline())]


def test_frozen_killed_and_restarted_watcher(tmp_path):
    sock = tmp_path / "sock"
    sock.mkdir(mode=0o700)
    addr = f"ipc://{sock}/w.sock"
    tdir = tmp_path / "traces"
    iters = 400
    w1 = start_watcher(addr, tmp_path / "w1.json")
    env = dict(os.environ, COMMVIZ_ADDR=addr, COMMVIZ_TRACE_DIR=str(tdir))
    job = subprocess.Popen(torchrun(2, os.path.join(REPO, "scenarios", "allreduce.py"), "--iters", str(iters),
                                    "--numel", "4096", "--interval", "0.05"),
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_line(w1, "ranks 2", 30)
        pids = rank_pids(job)
        assert len(pids) == 2
        # warmed up (first ops allocate) before memory is measured: 20 ops on each rank
        deadline = time.monotonic() + 120
        while not all(n >= 20 for n in ends_per_rank(tdir, 2)):
            assert time.monotonic() < deadline and job.poll() is None, "the ranks never got going"
            time.sleep(0.05)
        w1.send_signal(signal.SIGSTOP)  # frozen: its socket fills, ranks must not care
        t_stop = time.monotonic_ns()
        before = rss(pids)
        time.sleep(FREEZE_S)
        grown = {pid: rss([pid])[pid] - before[pid] for pid in pids}
        w1.send_signal(signal.SIGCONT)
        t_cont = time.monotonic_ns()
        time.sleep(1)
        w1.kill()  # dies without a word
        w1.wait()
        assert job.poll() is None, "the job should still be running"
        time.sleep(1)
        w2 = start_watcher(addr, tmp_path / "w2.json")
        t0 = time.monotonic()
        line = wait_line(w2, "ranks 2", 10)
        reconnect_s = float(line.split()[2]) - t0  # the watcher stamps the line with the same clock
        print(f"restarted watcher heard both ranks after {reconnect_s * 1000:.0f} ms; "
              f"rank RSS growth while frozen {[g // 1024 for g in grown.values()]} KiB")
        assert job.wait(120) == 0
        wait_line(w2, "gone 2", 10)  # both goodbyes arrived
        w2.send_signal(signal.SIGTERM)
        w2.wait(10)
    finally:
        for p in (job,):
            if p.poll() is None:
                p.kill()
    assert reconnect_s < 2.0  # contract: within a second; slack for a loaded machine
    # docs/PROMISES.md's figure is ~120 KiB per rank for this freeze; a few times that holds
    # on a busy box (seen: 64 KiB idle, 2.3 MiB once under load before this test
    # waited for the ranks to warm up), runaway buffering would not
    assert all(g < 2 * 2**20 for g in grown.values()), grown
    # the trace dir lost nothing
    counts, starts = {}, {}
    for b in load(tdir).batches:
        for e in b.events:
            if type(e).__name__ == "OpEnd":
                counts[b.rank] = counts.get(b.rank, 0) + 1
            elif type(e).__name__ == "OpStart":
                starts.setdefault(b.rank, []).append(e.t)
    assert counts == {0: iters, 1: iters}
    # and the training loop went on while the watcher was frozen, at much its own pace
    for r, ts in starts.items():
        pace = (max(ts) - min(ts)) / (len(ts) - 1)
        during = sum(t_stop <= t <= t_cont for t in ts)
        assert during > 0.5 * (t_cont - t_stop) / pace, (r, during)
    # the second watcher knows both ranks, saw them exit, and got a share of the ops
    s = json.loads((tmp_path / "w2.json").read_text())
    assert [r["status"] for r in s["ranks"]] == ["exited", "exited"]
    assert all(0 < pr["ops"]["all_reduce"]["count"] <= iters for pr in s["per_rank"])


def test_rank_killed_with_sigkill_is_dead_within_two_seconds(tmp_path):
    from commviz.watcher import LiveFeed

    sock = tmp_path / "sock"
    sock.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{sock}/w.sock").start()
    env = dict(os.environ, COMMVIZ_ADDR=feed.addr, COMMVIZ_TRACE_DIR=str(tmp_path / "tr"))
    job = subprocess.Popen(torchrun(2, os.path.join(REPO, "scenarios", "allreduce.py"), "--iters", "400",
                                    "--numel", "256", "--interval", "0.05"),
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with feed.lock:
                r1 = feed.model.ranks.get(1)
                if r1 is not None and r1.hello is not None and r1.ops_done > 5:
                    pid = r1.hello.pid
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("rank 1 never reported")
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            with feed.lock:
                if feed.model.ranks[1].status == "dead":
                    break
            time.sleep(0.05)
        dead_after = time.monotonic() - t0
        print(f"rank 1 marked dead {dead_after * 1000:.0f} ms after SIGKILL")
        assert dead_after < 2.0
        job.wait(timeout=60)  # rank 0 fails its next all_reduce and torchrun ends the job
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # torchrun and its ranks
            job.wait()
        feed.close()
    # its trace file loads, and with its crash ring it holds every op it took part in:
    # each all_reduce rank 0 finished needed rank 1, so rank 1 started at least those.
    # Counted by op id: an op in both a trace file and a ring is loaded twice (the
    # model keeps one), and a rank that did not exit cleanly leaves its ring too.
    s = json.loads(run(commviz("summary", str(tmp_path / "tr"), "--json")).stdout)
    assert [r["status"] for r in s["ranks"]][1] == "dead"
    assert any("crash ring" in p for p in s.get("problems", []))
    started = {0: set(), 1: set()}
    finished_ok = set()
    for b in load(tmp_path / "tr").batches:
        for e in b.events:
            name = type(e).__name__
            if name == "OpStart":
                started[b.rank].add(e.id)
            elif name == "OpEnd" and b.rank == 0 and not e.error:
                finished_ok.add(e.id)
    assert len(finished_ok) > 5 and len(started[1]) >= len(finished_ok)


def test_unwritable_trace_dir_warns_once_and_the_job_finishes(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    sock = tmp_path / "sock"
    sock.mkdir(mode=0o700)
    p = run(torchrun(2, os.path.join(REPO, "scenarios", "allreduce.py"), "--iters", "20", "--numel", "64"),
            env={"COMMVIZ_TRACE_DIR": str(blocker / "traces"), "COMMVIZ_ADDR": f"ipc://{sock}/nobody.sock"})
    assert p.returncode == 0 and "all_reduce: ok" in p.stdout
    warnings = [line for line in p.stderr.splitlines() if "cannot write the trace" in line]
    assert len(warnings) == 2  # once per rank
