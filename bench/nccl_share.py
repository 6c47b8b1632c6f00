"""Can N NCCL ranks share ONE GPU? (issue 50, item 1). bench/gpu_check.sh runs it first:
the steps at world size >= 2 run only where it says yes.

    python bench/nccl_share.py [--world 2 4] [--timeout 60] [--log-dir DIR] [--dry-run]

For each world size N it starts N ranks itself (RANK, WORLD_SIZE, LOCAL_RANK and a free
MASTER_PORT set per process, no torchrun), each with bench/gpushare.py's variables (its
own NCCL_HOSTID, every rank on the same GPU, socket transport on loopback) and
NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET,ENV). Each rank: init_process_group("nccl"),
a first all_reduce (the communicator is made then), ten more, each result checked, a
ring send/recv (batch_isend_irecv), checked, and destroy. The whole run has --timeout
seconds: NCCL may hang instead of refusing.

One JSON line: per world size, whether every rank passed, the seconds, and NCCL's own
answer either way, read from its log: its version, the network it used, the transport
of each channel ("via NET/Socket/0"), the variables it saw set, its warnings and the
refusal ("Duplicate GPU detected ...") where it refused; per rank, its first op's and
a small all_reduce's time. `shared` lists the world sizes that worked. --log-dir keeps
each world size's whole log (nccl_share_ws<N>.log: a fixture for CPU tests that parse
NCCL's INFO lines). `--dry-run`: gloo on the CPU, to rehearse (it says so).

A world size larger than one that timed out is not tried: it would time out too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpushare  # noqa: E402  (bench/, beside this file)

RANK_TAG = "nccl_share_rank"

# --------------------------------------------------------------- NCCL's log

_VERSION = re.compile(r"NCCL version (\S+)")
# "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0" (ring/tree set-up in transport.cc)
_CHANNEL = re.compile(r"Channel (\d+)/\d+ : (\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\](?: \[(send|receive)\])? via (\S+)")
_NETWORK = re.compile(r"Using network (\S+)")
_ENVSET = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (\S*)")
_WARN = re.compile(r"NCCL WARN (.*)")
_LAST_ERROR = re.compile(r"Last error:\s*(.*)")


def transport_kind(via: str) -> str:
    """'NET/Socket/0' -> 'NET/Socket', 'P2P/CUMEM/read' -> 'P2P', 'SHM/direct/direct' -> 'SHM'."""
    parts = via.split("/")
    return "/".join(parts[:2]) if parts[0] == "NET" and len(parts) > 1 else parts[0]


def parse_nccl_log(text: str) -> dict:
    """What NCCL said about itself in a (NCCL_DEBUG=INFO) log: its version, the network,
    each channel's transport, the variables it saw set, its warnings and refusal."""
    out: dict = {"version": None, "network": None, "transports": {}, "channels": 0, "env": {},
                 "warnings": [], "refusal": None}
    seen_channels = set()
    for line in text.splitlines():
        if line.lstrip().startswith("{"):
            continue  # a rank's own JSON line (its error is read from the JSON: refusal_from_error)
        m = _VERSION.search(line)
        if m and out["version"] is None:
            out["version"] = m.group(1)
        m = _NETWORK.search(line)
        if m and out["network"] is None:
            out["network"] = m.group(1)
        m = _CHANNEL.search(line)
        if m:
            via = m.group(5)
            out["transports"][via] = out["transports"].get(via, 0) + 1
            seen_channels.add(int(m.group(1)))
        m = _ENVSET.search(line)
        if m:
            out["env"][m.group(1)] = m.group(2).rstrip(".")  # NCCL's parameters print "... to 1."
        m = _WARN.search(line)
        if m:
            w = m.group(1).strip()
            if w not in out["warnings"]:
                out["warnings"].append(w)
            if out["refusal"] is None and "Duplicate GPU" in w:
                out["refusal"] = w
        m = _LAST_ERROR.search(line)
        if m and out["refusal"] is None and m.group(1).strip():
            out["refusal"] = m.group(1).strip()
    out["channels"] = len(seen_channels)
    out["transport_kinds"] = sorted({transport_kind(v) for v in out["transports"]})
    out["warnings"] = out["warnings"][:8]
    return out


def refusal_from_error(text: str) -> str | None:
    """NCCL's own words in the exception torch raised: what follows "Last error:"
    (on the next line in torch's message)."""
    m = _LAST_ERROR.search(text or "")
    return m.group(1).strip()[:500] if m and m.group(1).strip() else None


def rank_results(text: str) -> list[dict]:
    """The JSON lines the ranks printed (tagged RANK_TAG)."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if RANK_TAG not in line or not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and RANK_TAG in doc:
            found.append(doc)
    return found


# --------------------------------------------------------------- one rank


def rank_body(dry: bool) -> int:
    gpushare.apply()  # before torch: CUDA_VISIBLE_DEVICES and NCCL's variables
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    doc: dict = {RANK_TAG: rank, "ok": False, "backend": "gloo" if dry else "nccl"}
    try:
        dev = torch.device("cpu") if dry else torch.device("cuda", 0)
        if not dry:
            torch.cuda.set_device(dev)
            doc["gpu"] = torch.cuda.get_device_name(dev)
            doc["uuid"] = f"GPU-{torch.cuda.get_device_properties(dev).uuid}"  # the same on every rank
        sync = (lambda: None) if dry else torch.cuda.synchronize
        t0 = time.perf_counter()
        dist.init_process_group("gloo" if dry else "nccl")
        want = world * (world + 1) / 2
        x = torch.full((1024,), float(rank + 1), device=dev)
        t1 = time.perf_counter()
        dist.all_reduce(x)  # NCCL makes its communicator now
        sync()
        doc["init_s"] = round(t1 - t0, 3)
        doc["first_op_s"] = round(time.perf_counter() - t1, 3)
        bad = int((x != want).sum())
        times = []
        for _ in range(10):
            y = torch.full((1024,), float(rank + 1), device=dev)
            sync()
            t = time.perf_counter()
            dist.all_reduce(y)
            sync()
            times.append(time.perf_counter() - t)
            bad += int((y != want).sum())
        doc["allreduce_wrong"] = bad
        doc["allreduce_4k_us"] = round(sorted(times)[len(times) // 2] * 1e6, 1)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        out, got = torch.full((256,), float(rank), device=dev), torch.full((256,), -1.0, device=dev)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prv)]):
            w.wait()
        sync()
        doc["sendrecv_wrong"] = int((got != float(prv)).sum())
        dist.destroy_process_group()
        doc["ok"] = bad == 0 and doc["sendrecv_wrong"] == 0
    except Exception as exc:  # NCCL's refusal arrives as an exception: keep its text
        doc["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    print(json.dumps(doc), flush=True)
    return 0 if doc["ok"] else 1


# --------------------------------------------------------------- the parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass


def try_world(world: int, timeout: float, dry: bool, log_dir: str | None) -> dict:
    port = free_port()
    base = dict(os.environ)
    base.update(COMMVIZ="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world), NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,ENV",
                PYTHONUNBUFFERED="1")
    logs, procs = [], []
    t0 = time.monotonic()
    for r in range(world):
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r))  # gpushare.apply() in the rank adds the rest
        f = tempfile.TemporaryFile("w+")
        logs.append(f)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-body"]
                                      + (["--dry-run"] if dry else []), env=env, stdout=f, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    timed_out = False
    deadline = t0 + timeout
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            timed_out = True
            kill(procs)
            break
        time.sleep(0.1)
    secs = round(time.monotonic() - t0, 1)
    texts = []
    for r, f in enumerate(logs):
        f.seek(0)
        texts.append(f.read())
        f.close()
    whole = "".join(f"==== rank {r}\n{t}" for r, t in enumerate(texts))
    if log_dir:
        with open(os.path.join(log_dir, f"nccl_share_ws{world}.log"), "w") as fh:
            fh.write(whole)
    ranks = [next(iter(rank_results(t)), {"ok": False, "error": "printed no result"}) for t in texts]
    nccl = parse_nccl_log(whole)
    if nccl["refusal"] is None:  # the exception text a rank printed, where the log had none
        nccl["refusal"] = next(filter(None, (refusal_from_error(d.get("error", "")) for d in ranks)), None)
    ok = not timed_out and all(p.returncode == 0 for p in procs) and all(d.get("ok") for d in ranks)
    doc = {"world": world, "ok": ok, "seconds": secs, "timed_out": timed_out,
           "rcs": [p.returncode for p in procs], "nccl": nccl,
           "ranks": [{k: v for k, v in d.items() if k != RANK_TAG} for d in ranks]}
    if not ok and not nccl["refusal"]:
        errs = [d.get("error") for d in ranks if d.get("error")]
        doc["why"] = ("timed out after %gs (NCCL hung: no refusal)" % timeout if timed_out
                      else (errs[0] if errs else "a rank failed without saying why"))[:1000]
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds for each world size's run")
    ap.add_argument("--log-dir", help="keep each world size's whole log here (nccl_share_ws<N>.log)")
    ap.add_argument("--dry-run", action="store_true", help="gloo on the CPU: rehearse without a GPU")
    ap.add_argument("--rank-body", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_body:
        return rank_body(args.dry_run)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    out: dict = {"fact": "nccl_share", "dry_run": args.dry_run, "backend": "gloo" if args.dry_run else "nccl",
                 "recipe": gpushare.share_env(0, "<gpu>") | {"NCCL_HOSTID": gpushare.HOSTID_PREFIX + "<local rank>"},
                 "worlds": []}
    if args.dry_run:
        out["note"] = "dry run: gloo on the CPU; NCCL's answer is not asked"
    hung = None
    for n in args.world:
        if hung is not None and n > hung:
            out["worlds"].append({"world": n, "ok": False, "skipped": f"world size {hung} timed out"})
            continue
        doc = try_world(n, args.timeout, args.dry_run, args.log_dir)
        if doc["timed_out"]:
            hung = n if hung is None else min(hung, n)
        out["worlds"].append(doc)
    out["shared"] = [w["world"] for w in out["worlds"] if w["ok"]]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
