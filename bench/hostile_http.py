"""A collector's HTTP face under hostile clients, while a 4-rank job streams to it.

    python bench/hostile_http.py [--idle 2000] [--iters 300]

Starts `commviz serve --http`, then a job (scenarios/allreduce.py under torchrun),
and meanwhile opens `--idle` connections that each send half a request and sit (and
50 more every 0.2 s while the job runs), 20 slow readers, garbage, a 100 KB header,
a wrong token and a POST. It asks /summary every 0.2 s during the job and after it,
and reads the collector's threads and memory each time. Prints what it measured;
tests/integration/test_hostile_clients.py holds the collector to it.

Before (issue 49, http.server's ThreadingHTTPServer): 2,000 half-requests held
2,010 threads and +53 MB; 44,000 log lines of tracebacks; /summary unanswered for
over 10 s."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Measured:
    summary_s: list[float]  # each /summary's time to answer, during the job and after
    threads: list[int]  # the collector's threads at each of those
    rss_growth: int  # bytes, from before the job to its end
    answers: dict[str, bytes]  # the first bytes answered to each bad request
    job_rc: int
    job_err: str
    per_rank_counts: list[int | None]  # all_reduce count per rank, last summary
    per_rank_bytes: list[int | None]
    client_errors: dict[str, int]
    log: list[str]  # the collector's output


def _half_requests(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        out.append(s)
    time.sleep(0.2)
    for s in out:
        try:
            s.send(b"GET /summary HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            pass  # closed by the collector already (evicted at its cap)
    return out


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            return s.recv(200)
        except OSError:
            return b""


def _summary(port: int, token: str) -> tuple[float, dict]:
    t0 = time.monotonic()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/summary", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        doc = json.loads(r.read())
    return time.monotonic() - t0, doc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(workdir: str, idle: int = 2000, iters: int = 300) -> Measured:
    import psutil

    from commviz.viewlink import local_token

    sock_dir = os.path.join(workdir, "sock")
    os.makedirs(sock_dir, mode=0o700, exist_ok=True)
    addr = f"ipc://{sock_dir}/serve.sock"
    port = _free_port()
    log = open(os.path.join(workdir, "serve.log"), "w+")
    srv = subprocess.Popen([sys.executable, "-m", "commviz.cli", "serve", "--listen", addr, "--http", str(port),
                            "--for", "600"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
    held: list[socket.socket] = []
    took: list[float] = []
    threads: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while local_token(f"127.0.0.1:{port}") is None and time.monotonic() < deadline:
            time.sleep(0.2)
        token = local_token(f"127.0.0.1:{port}")
        if not token:
            raise RuntimeError("the collector did not start: " + open(log.name).read()[-2000:])
        proc = psutil.Process(srv.pid)
        rss0 = proc.memory_info().rss
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                                os.path.join(REPO, "scenarios", "allreduce.py"), "--iters", str(iters),
                                "--numel", "1024"], cwd=REPO, env={**os.environ, "COMMVIZ_ADDR": addr},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        held = _half_requests(port, idle)
        for _ in range(20):  # slow readers: ask, never read, with a small window
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.connect(("127.0.0.1", port))
            s.sendall(f"GET /summary HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
            held.append(s)
        answers = {
            "garbage": _raw(port, os.urandom(512)),
            "oversized": _raw(port, b"GET /summary HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"),
            "wrong token": _raw(port, b"GET /summary HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n"),
            "post": _raw(port, f"POST /summary HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                               "Content-Length: 0\r\n\r\n".encode()),
        }
        while job.poll() is None:  # during the job
            took.append(_summary(port, token)[0])
            threads.append(proc.num_threads())
            held += _half_requests(port, 50)  # and they keep coming
            time.sleep(0.2)
        job_err = job.stderr.read()[-2000:]
        rss = proc.memory_info().rss
    finally:
        for s in held:
            s.close()
    try:
        deadline = time.monotonic() + 30
        while True:  # after it: the last frames land within a flush or two
            t, doc = _summary(port, token)
            took.append(t)
            threads.append(proc.num_threads())
            counts = [pr["ops"].get("all_reduce", {}).get("count") for pr in doc["per_rank"]]
            if counts == [iters] * 4 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    finally:
        srv.terminate()
        srv.wait(30)
    log.seek(0)
    return Measured(took, threads, rss - rss0, answers, job.returncode, job_err, counts,
                    [pr["ops"].get("all_reduce", {}).get("bytes") for pr in doc["per_rank"]],
                    doc["http"]["client_errors"], log.read().splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        m = measure(d, args.idle, args.iters)
    took = sorted(m.summary_s)
    print(f"idle half-requests: {args.idle} (+50 every 0.2 s during the job)")
    print(f"/summary: {len(took)} asked, median {took[len(took) // 2] * 1e3:.0f} ms, max {took[-1] * 1e3:.0f} ms")
    print(f"collector threads: max {max(m.threads)}; memory: {m.rss_growth / 2**20:+.1f} MiB over the job")
    print(f"job: exit {m.job_rc}; all_reduce per rank {m.per_rank_counts} (expected {[args.iters] * 4})")
    print(f"clients' errors counted: {m.client_errors}")
    print(f"collector's log: {len(m.log)} lines")
    for line in m.log:
        print(f"  | {line}")


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    main()
