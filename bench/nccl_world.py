"""The NCCL integration checks at world size >= 2, several ranks sharing one GPU
(issue 50, item 1), one check per run, for bench/gpu_check.sh once bench/nccl_share.py
has found that N ranks can share the GPU:

    python bench/nccl_world.py CHECK --world N [--fixtures DIR] [--timeout S] [--dry-run]

Each check runs a job of tests/gpu/jobs through bench/gpushare.py (every rank on the
same GPU, a host id of its own) under `commviz record` (attach: plainly, commviz off),
the job writing what commviz must find (its expected-results file), and compares that
with `commviz summary --json` of the recording and with its events:

  every_op  tests/gpu/jobs/every_op_world.py: exact counts and bytes for every op kind
            on every rank; each CUDA op's device time against its host time (OpEnd
            .device_ns against end - start), per op kind; the flight-recorder audit with
            nothing unseen (TORCH_FR_BUFFER_SIZE=2000); NVML values in the Sample events
            local rank 0 took during the traffic at the end
  queued    tests/gpu/jobs/queued_pair.py: two async all_reduces on one group, the
            second issued while the first runs; both device-timed, the second's device
            time not including the first's
  hang      tests/gpu/jobs/fault_nccl.py --kind hang under --hang-timeout 6: a member
  dead      skips a collective / the last rank exits abruptly / the last rank calls
  desync    broadcast where the others all_reduce; record stops the job and prints the
            diagnosis live (exit 3), naming op, group, sequence number, the waiting,
            missing and culprit ranks and the job's lines where they are
  watchdog  the hang with a 10 s process-group timeout and no hang timeout: NCCL's
            watchdog ends it, not commviz; the waiting op must end with its error
            (the probe's error polling), the trace still naming the missing rank
  attach    tests/gpu/jobs/stalled_nccl.py started without commviz, the last rank
            stalled in Python: `commviz attach --json` from outside finds the job, asks
            NCCL's RAS service (on by default since NCCL 2.24) and the flight recorder
            (through the debug pipe), and names the stalled rank

One JSON line: the check, the world size, `ok`, what failed (each with the values
seen), what was skipped and why (GPU-only facts in a dry run), and the facts measured.
Exit 0 when ok. --fixtures DIR: what the run learned that CPU tests can replay (NVML
samples under traffic, flight-recorder dumps, RAS answers, the summary documents),
named <check>_ws<N>_*; bench/gpu_check.sh packs them for tests/gpu/fixtures/.
`--dry-run`: gloo on the CPU, the same jobs and checks (GPU-only ones say skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "tests", "gpu", "jobs")
SHARE = os.path.join(REPO, "bench", "gpushare.py")
HANG_S = "6"
HOST_SLACK_NS = 1_000_000  # an op is seen done after it was done: 1 ms of clock slack


# --------------------------------------------------------------- processes


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun's workers sit in sessions of their own, so
    a process group does not reach them; their parent ids do)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int) -> None:
    """SIGTERM `pid` and everything below it, then SIGKILL what is left: no rank may
    keep the GPU into the next check."""
    pids = [pid, *descendants(pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and _alive(p) for p in pids):
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run(cmd: list[str], env: dict | None = None, timeout: float = 120) -> tuple[int, str, str, bool]:
    """(rc, stdout, stderr, timed_out); on a timeout the whole tree is killed."""
    full = dict(os.environ)
    full.update(env or {})
    p = subprocess.Popen(cmd, env=full, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, False
    except subprocess.TimeoutExpired:
        kill_tree(p.pid)
        out, err = p.communicate()
        return p.returncode, out, err, True


def torchrun(n: int, job: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", SHARE,
            os.path.join(JOBS, job), *args]


def commviz(*args: str) -> list[str]:
    return [sys.executable, "-m", "commviz.cli", *args]


# --------------------------------------------------------------- verdicts


class Verdict:
    def __init__(self, check: str, world: int, dry: bool) -> None:
        self.doc: dict = {"check": check, "world": world, "dry_run": dry, "backend": "gloo" if dry else "nccl",
                          "ok": True, "failed": [], "skipped": [], "facts": {}}

    def expect(self, cond, what: str) -> bool:
        if not cond:
            self.doc["ok"] = False
            self.doc["failed"].append(what[:1500])
        return bool(cond)

    def skip(self, what: str) -> None:
        self.doc["skipped"].append(what)

    def fact(self, key: str, value) -> None:
        self.doc["facts"][key] = value


class Recorded:
    def __init__(self, rc, out, err, timed_out, seconds, trace, summary, events) -> None:
        self.rc, self.out, self.err, self.timed_out, self.seconds = rc, out, err, timed_out, seconds
        self.trace, self.summary, self.events = trace, summary, events  # events: {rank: [event, ...]}


def record(tmp: str, n: int, job: str, args: list[str], timeout: float, env: dict | None = None,
           hang_timeout: str | None = None) -> Recorded:
    trace = os.path.join(tmp, "t.cvz")
    hang = ["--hang-timeout", hang_timeout] if hang_timeout else []
    t0 = time.monotonic()
    rc, out, err, timed_out = run(commviz("record", "-o", trace, *hang, "--", *torchrun(n, job, *args)), env, timeout)
    secs = round(time.monotonic() - t0, 1)
    summary, events = None, {}
    if os.path.exists(trace):
        s_rc, s_out, s_err, _ = run(commviz("summary", trace, "--json", "--hang-after", "1"), timeout=60)
        if s_rc == 0:
            summary = json.loads(s_out)
        from commviz.trace.file import load

        for b in load(trace).batches:
            events.setdefault(b.rank, []).extend(b.events)
    return Recorded(rc, out, err, timed_out, secs, trace, summary, events)


def recorded_ok(v: Verdict, rec: Recorded, want_rc=(0,)) -> bool:
    v.fact("job", {"rc": rec.rc, "seconds": rec.seconds, "timed_out": rec.timed_out})
    good = v.expect(not rec.timed_out, "the recording did not end in its time limit")
    good &= v.expect(rec.rc in want_rc, f"commviz record exited {rec.rc}, not {want_rc}: {why(rec.out + rec.err)}")
    good &= v.expect(rec.summary is not None, "no summary of the recording")
    return good


def why(text: str) -> str:
    """The lines of a job's output that say what went wrong (a rank's exception first)."""
    lines = [ln.strip() for ln in text.splitlines()]
    errs = [ln for ln in lines if ln.startswith("[rank") and ("Error" in ln or "error" in ln)]
    errs = errs or [ln for ln in lines if "Error" in ln or "WARN" in ln]
    return " | ".join(dict.fromkeys(errs[-4:])) or " | ".join(lines[-6:])


def starts_ends(events: list) -> tuple[dict, dict]:
    from commviz.events import OpEnd, OpStart

    return ({e.id: e for e in events if isinstance(e, OpStart)}, {e.id: e for e in events if isinstance(e, OpEnd)})


def median(xs):
    return round(statistics.median(xs), 1) if xs else None


def keep(fixtures: str | None, name: str, src: str | None = None, doc=None) -> None:
    """A fixture for the CPU tests: a file copied, or a document written."""
    if not fixtures:
        return
    os.makedirs(fixtures, exist_ok=True)
    dst = os.path.join(fixtures, name)
    if src is not None:
        shutil.copyfile(src, dst)
    else:
        with open(dst, "w") as f:
            json.dump(doc, f, indent=1, default=str)


# --------------------------------------------------------------- the checks


def check_every_op(v: Verdict, n: int, tmp: str, dry: bool, timeout: float, fixtures: str | None) -> None:
    from commviz.events import Hello, Sample

    exp_dir, fr_dir = os.path.join(tmp, "expect"), os.path.join(tmp, "fr")
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    rec = record(tmp, n, "every_op_world.py", ["--expect", exp_dir, "--fr-dump", fr_dir,
                                                 "--backend", "gloo" if dry else "nccl"], timeout, env)
    if not recorded_ok(v, rec):
        return
    per_rank = {pr["rank"]: pr for pr in rec.summary["per_rank"]}
    for r in range(n):
        path = os.path.join(exp_dir, f"rank-{r}.json")
        if not v.expect(os.path.exists(path), f"rank {r} wrote no expected results"):
            continue
        exp = json.load(open(path))
        got = {op: {"count": o["count"], "bytes": o["bytes"]} for op, o in per_rank.get(r, {}).get("ops", {}).items()}
        diff = {op: {"expected": exp["ops"].get(op), "got": got.get(op)} for op in set(exp["ops"]) | set(got)
                if exp["ops"].get(op) != got.get(op)}
        v.expect(not diff, f"rank {r}: counts/bytes differ: {json.dumps(diff)} (notes {exp['notes']})")
        if r == 0:
            v.fact("ops", len(exp["ops"]))
            v.fact("traffic", exp["traffic"])
        a = per_rank.get(r, {}).get("audit")
        if v.expect(a and "state" not in a, f"rank {r}: no flight-recorder audit: {a}"):
            v.expect(a["unseen"] == {} and a["seen"] == a["backend"], f"rank {r}: the audit found unseen ops: {a}")
            if r == 0:
                v.fact("audit", a)
        host_timed = set(exp["host_timed"])
        starts, ends = starts_ends(rec.events.get(r, []))
        v.expect(set(starts) == set(ends), f"rank {r}: {len(set(starts) - set(ends))} ops never ended")
        times: dict[str, dict[str, list]] = {}
        untimed, too_long = [], []
        for i, s in starts.items():
            e = ends.get(i)
            if e is None:
                continue
            if e.error:
                v.expect(s.op == "all_to_all" and "all_to_all" in exp["notes"], f"rank {r}: {s.op} failed: {e.error}")
                continue
            host_ns = e.t - s.t
            t = times.setdefault(s.op, {"device": [], "host": []})
            t["host"].append(host_ns / 1e3)
            if dry or s.op in host_timed or e.captured:
                continue
            if e.device_ns < 0:
                untimed.append(s.op)
                continue
            t["device"].append(e.device_ns / 1e3)
            if e.device_ns > host_ns + HOST_SLACK_NS:
                too_long.append((s.op, e.device_ns, host_ns))
        if not dry:
            v.expect(not untimed, f"rank {r}: CUDA ops with no device time: {sorted(set(untimed))}")
            v.expect(not too_long, f"rank {r}: device time longer than the host saw (op, device ns, host ns): "
                     f"{too_long[:5]}")
        if r == 0:
            v.fact("device_vs_host_us", {"per_op": "[ops, device p50, host p50]"} | {
                op: [len(t["host"]), median(t["device"]), median(t["host"])] for op, t in sorted(times.items())})
        if fixtures and os.path.exists(os.path.join(fr_dir, f"fr_rank{r}.json")):
            keep(fixtures, f"every_op_ws{n}_fr_{'gloo' if dry else 'nccl'}_rank{r}.json",
                 src=os.path.join(fr_dir, f"fr_rank{r}.json"))
    if dry:
        v.skip("device time against host time: gloo has no device time")
    hellos = [e for r in sorted(rec.events) for e in rec.events[r] if isinstance(e, Hello)]
    v.fact("ranks", sorted({(h.rank, h.device, h.cuda_uuid) for h in hellos}))
    if not dry:
        v.expect(len({h.cuda_uuid for h in hellos}) == 1, f"the ranks are not on one GPU: {hellos}")
    samples = [e for r in sorted(rec.events) for e in rec.events[r] if isinstance(e, Sample)]
    gpu_keys = sorted({k for s in samples for k in s.values if k.startswith("gpu")})
    v.fact("samples", {"count": len(samples), "gpu_keys": gpu_keys})
    if dry:
        v.skip("NVML values in the samples: no GPU")
        v.expect(samples, "no Sample events at all (psutil's figures)")
    else:
        v.expect(gpu_keys, f"no NVML values in the {len(samples)} Sample events")
    keep(fixtures, f"every_op_ws{n}_samples.json", doc=[{"t": s.t, "values": s.values} for s in samples])
    keep(fixtures, f"every_op_ws{n}_summary.json", doc=rec.summary)


def check_queued(v: Verdict, n: int, tmp: str, dry: bool, timeout: float, fixtures: str | None) -> None:
    path = os.path.join(tmp, "queued.json")
    rec = record(tmp, n, "queued_pair.py", ["--expect", path, "--backend", "gloo" if dry else "nccl"]
                 + (["--big", str(1 << 20)] if dry else []), timeout)
    if not recorded_ok(v, rec) or not v.expect(os.path.exists(path), "the job wrote no expected results"):
        return
    judge_queued(v, n, rec, json.load(open(path)), dry)


def judge_queued(v: Verdict, n: int, rec: Recorded, exp: dict, dry: bool) -> None:
    """The pair on every rank: both async and ended without error, the second issued
    before the first was seen done; on the GPU both device-timed, the second's device
    time under a quarter of the first's, its host time at least half the first's."""
    v.fact("job_says", exp)
    per_rank = {}
    for r in range(n):
        starts, ends = starts_ends(rec.events.get(r, []))
        by = {}
        for s in starts.values():
            if s.op == "all_reduce" and s.bytes in (exp["big_bytes"], exp["small_bytes"], exp["alone_bytes"]):
                by[s.bytes] = (s, ends.get(s.id))
        if not v.expect(len(by) == 3 and all(e is not None for _, e in by.values()),
                        f"rank {r}: the three all_reduces are not all there and ended: {sorted(by)}"):
            continue
        (sb, eb), (ss, es), (sa, ea) = by[exp["big_bytes"]], by[exp["small_bytes"]], by[exp["alone_bytes"]]
        v.expect(not (eb.error or es.error), f"rank {r}: errors {eb.error!r} {es.error!r}")
        v.expect(sb.is_async and ss.is_async, f"rank {r}: the pair was not seen as async")
        v.expect(ss.t < eb.t, f"rank {r}: the second was issued after the first was seen done")
        per_rank[r] = {name: {"host_ms": round((e.t - s.t) / 1e6, 3),
                              "device_ms": round(e.device_ns / 1e6, 3) if e.device_ns >= 0 else None}
                       for name, (s, e) in (("first", (sb, eb)), ("second", (ss, es)), ("alone", (sa, ea)))}
        if dry:
            continue
        v.expect(eb.device_ns > 0 and es.device_ns >= 0, f"rank {r}: not both device-timed: {per_rank[r]}")
        v.expect(es.device_ns < 0.25 * eb.device_ns,
                 f"rank {r}: the second's device time includes the first's: {per_rank[r]}")
        v.expect(es.t - ss.t >= 0.5 * eb.device_ns,
                 f"rank {r}: the second did not wait behind the first (make --big larger): {per_rank[r]}")
    v.fact("per_rank", per_rank)
    if dry:
        v.skip("device times of the pair: gloo has none")


def only(v: Verdict, summary: dict, kind: str) -> dict | None:
    ds = [d for d in summary["diagnoses"] if d["kind"] == kind]
    v.fact("diagnoses", [{k: d.get(k) for k in ("kind", "op", "group", "seq", "waiting_ranks", "missing_ranks",
                                                 "culprit_ranks", "message")} for d in summary["diagnoses"]])
    return ds[0] if v.expect(len(ds) == 1, f"not one {kind} diagnosis: {[d['kind'] for d in summary['diagnoses']]}") \
        else None


def check_fault(v: Verdict, n: int, tmp: str, dry: bool, timeout: float, fixtures: str | None, kind: str) -> None:
    path = os.path.join(tmp, "expect.json")
    rec = record(tmp, n, "fault_nccl.py", ["--kind", kind, "--expect", path, "--backend", "gloo" if dry else "nccl"],
                 timeout, hang_timeout=HANG_S)
    # dead: the job's own failure (torchrun's 1) may come before commviz's stop
    if not recorded_ok(v, rec, want_rc=(3,) if kind != "dead" else (1, 3)):
        return
    if not v.expect(os.path.exists(path), "the job wrote no expected results"):
        return
    judge_fault(v, n, rec, json.load(open(path)), kind)
    keep(fixtures, f"{kind}_ws{n}_summary.json", doc=rec.summary)


def judge_fault(v: Verdict, n: int, rec: Recorded, exp: dict, kind: str) -> None:
    """The one diagnosis of its kind, as the job said it must read: op, sequence
    number, group, the waiting, missing and culprit ranks, what the culprit does
    instead, and the job's lines where the ranks are; printed live by record."""
    live = [ln for ln in rec.out.splitlines() if ln.startswith(("HANG:", "DESYNC:", "DEAD", "P2P"))]
    v.fact("live", live[:3])
    if kind != "dead":
        v.expect(live, f"record printed no diagnosis live: {rec.out[-800:]}")
    d = only(v, rec.summary, {"dead": "dead_rank"}.get(kind, kind))
    if d is None:
        return
    top = d
    if kind == "hang" and (d["op"], d["seq"]) != (exp["op"], exp["seq"]):
        # Where as many ranks wait on each side (2 ranks: one in the all_reduce, the
        # victim in the barrier), commviz may report the cycle from the barrier's side;
        # the hang asked for must then be the cycle's other member, exactly.
        other = [c for c in (d.get("details") or {}).get("cycle") or []
                 if (c["op"], c["seq"]) == (exp["op"], exp["seq"])]
        if other:
            top = {**other[0], "culprit_ranks": other[0]["missing_ranks"], "message": d["message"]}
            v.fact("reported_from", f"the other side of a cycle: {d['op']} #{d['seq']}")
    v.expect((top["op"], top["seq"]) == (exp["op"], exp["seq"]),
             f"op/seq {top['op']} #{top['seq']}, not {exp['op']} #{exp['seq']}")
    v.expect((top["group"] == "0") == exp["default_group"],
             f"group {top['group']}: default expected {exp['default_group']}")
    for key, field in (("waiting", "waiting_ranks"), ("missing", "missing_ranks"), ("culprit", "culprit_ranks")):
        if key in exp:
            v.expect(top[field] == exp[key], f"{field} {top[field]}, not {exp[key]}")
    if "instead" in exp:
        v.expect(exp["instead"] in d["message"], f"{exp['instead']!r} not in {d['message']!r}")
    where = {st["rank"]: st.get("where", "") for st in d.get("stacks") or []}
    v.fact("where", where)
    waits = {f"{exp['file']}:{ln}" for ln in exp.get("wait_lines", [])}
    if kind == "dead" and not where:
        waits = set()
        v.skip("the waiting ranks' lines: they ended before a stack was taken (COMMVIZ_STACK_AFTER)")
    for r in exp.get("waiting", []) if waits else []:
        v.expect(where.get(r) in waits, f"rank {r} waits at {where.get(r)!r}, not one of {sorted(waits)}")
    if "culprit_line" in exp:
        c = exp["culprit"][0]
        v.expect(where.get(c) == f"{exp['file']}:{exp['culprit_line']}",
                 f"culprit rank {c} at {where.get(c)!r}, not {exp['file']}:{exp['culprit_line']}")
    if kind == "dead":
        status = {r["rank"]: r["status"] for r in rec.summary["ranks"]}
        v.expect(status.get(exp["missing"][0]) == "dead", f"rank statuses {status}")


def check_watchdog(v: Verdict, n: int, tmp: str, dry: bool, timeout: float, fixtures: str | None) -> None:
    path = os.path.join(tmp, "expect.json")
    pg_timeout = 10
    rec = record(tmp, n, "fault_nccl.py", ["--kind", "hang", "--pg-timeout", str(pg_timeout), "--late", "3",
                                           "--expect", path, "--backend", "gloo" if dry else "nccl"], timeout)
    v.fact("job", {"rc": rec.rc, "seconds": rec.seconds, "timed_out": rec.timed_out})
    v.expect(not rec.timed_out, "the watchdog did not end the job in the time limit")
    v.expect(rec.rc not in (0, 3), f"record exited {rec.rc}: the job's own failure expected")
    if not v.expect(rec.summary is not None and os.path.exists(path), "no summary or expected results"):
        return
    exp = json.load(open(path))
    errors = {}
    for r, evs in sorted(rec.events.items()):
        starts, ends = starts_ends(evs)
        errors[r] = [{"op": starts[i].op, "group": starts[i].group, "seq": starts[i].seq, "error": e.error[:300]}
                     for i, e in ends.items() if e.error and i in starts]
    v.fact("op_errors", errors)
    for r in exp["waiting"]:
        hit = [x for x in errors.get(r, []) if x["op"] == exp["op"] and x["seq"] == exp["seq"]]
        v.expect(hit, f"rank {r}: its {exp['op']} #{exp['seq']} did not end with the watchdog's error")
    diag = [d for d in rec.summary["diagnoses"] if exp["missing"][0] in d["missing_ranks"]]
    v.fact("diagnoses", [{k: d.get(k) for k in ("kind", "op", "group", "seq", "missing_ranks", "message")}
                         for d in rec.summary["diagnoses"]])
    v.expect(diag, f"no diagnosis names rank {exp['missing'][0]} missing")
    keep(fixtures, f"watchdog_ws{n}_summary.json", doc=rec.summary)


def check_attach(v: Verdict, n: int, tmp: str, dry: bool, timeout: float, fixtures: str | None) -> None:
    from commviz.attach.discover import find_ranks, parent_of

    mark = os.path.join(tmp, "stalled")
    env = {k: val for k, val in os.environ.items() if not k.startswith("COMMVIZ")}
    env.update(COMMVIZ="0", STALL_MARK=mark, STALL_BACKEND="gloo" if dry else "nccl",
               TORCH_FR_BUFFER_SIZE="2000", TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
               TORCH_NCCL_DEBUG_INFO_TEMP_FILE=os.path.join(tmp, "fr_"),
               TORCH_NCCL_DEBUG_INFO_PIPE_FILE=os.path.join(tmp, "fr_pipe_"))
    t0 = time.monotonic()
    job = subprocess.Popen(torchrun(n, "stalled_nccl.py"), cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while not os.path.exists(mark) and time.monotonic() - t0 < timeout / 2 and job.poll() is None:
            time.sleep(0.2)
        if not v.expect(os.path.exists(mark), f"the job never stalled (rc {job.poll()})"):
            return
        time.sleep(2)  # the others launch their all_reduce and wait for it
        workers = sorted(r.pid for r in find_ranks() if parent_of(r.pid) == job.pid)
        if not v.expect(len(workers) == n, f"{len(workers)} ranks found under torchrun, not {n}"):
            return
        rc, out, err, timed_out = run(commviz("attach", "--pid", str(workers[0]), "--json", "--interval", "1.5",
                                              "--save", os.path.join(tmp, "seen")), timeout=max(30, timeout / 2))
        v.fact("attach", {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "timed_out": timed_out})
        if not v.expect(not timed_out and out.strip().startswith("{"), f"attach gave no JSON: {err[-800:]}"):
            return
        doc = json.loads(out)
        a = doc["attach"]
        v.fact("tiers", {"stacks": a["stacks"], "flight_recorder": a["flight_recorder"],
                         "dump_requested": a.get("dump_requested"), "roll_call": a["roll_call"],
                         "ras": {k: a["ras"][k] for k in a["ras"] if k != "report"}})
        v.fact("diagnoses", [{k: d.get(k) for k in ("kind", "op", "seq", "waiting_ranks", "missing_ranks", "message")}
                             for d in doc["diagnoses"]])
        v.expect(a["ranks_here"] == list(range(n)), f"ranks here {a['ranks_here']}")
        v.expect(rc == 3, f"attach exited {rc}, not 3 (a diagnosis)")
        v.expect(any(d["kind"] == "hang" and d["missing_ranks"] == [n - 1] for d in doc["diagnoses"]),
                 f"no hang naming rank {n - 1} missing")
        if a["stacks"]["tool"] is None:
            v.skip("py-spy is not installed here: no stacks")
        if dry:
            v.skip("NCCL's RAS service: gloo")
        else:
            v.expect("addr" in a["ras"], f"NCCL's RAS did not answer: {a['ras']}")
        keep(fixtures, f"attach_ws{n}.json", doc=doc)
        for p in sorted(os.listdir(tmp)):
            if p.startswith("fr_") and not p.startswith("fr_pipe_"):
                keep(fixtures, f"attach_ws{n}_{p}", src=os.path.join(tmp, p))
    finally:
        kill_tree(job.pid)


CHECKS = {"every_op": check_every_op, "queued": check_queued, "watchdog": check_watchdog, "attach": check_attach,
          "hang": lambda *a: check_fault(*a, kind="hang"), "dead": lambda *a: check_fault(*a, kind="dead"),
          "desync": lambda *a: check_fault(*a, kind="desync")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("check", choices=sorted(CHECKS))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("STEP_LIMIT", 135)) - 15,
                    help="seconds for the job (default: 15 s under bench/gpu_check.sh's STEP_LIMIT, else 120)")
    ap.add_argument("--fixtures", help="keep what CPU tests can replay here")
    ap.add_argument("--keep", action="store_true", help="keep the job's folder (trace, expected results); say where")
    ap.add_argument("--dry-run", action="store_true", help="gloo on the CPU: rehearse without a GPU")
    args = ap.parse_args()
    v = Verdict(args.check, args.world, args.dry_run)
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix=f"nccl_world_{args.check}_")
    try:
        CHECKS[args.check](v, args.world, tmp, args.dry_run, args.timeout, args.fixtures)
    except Exception as exc:
        import traceback

        v.expect(False, f"the check itself failed: {type(exc).__name__}: {exc}")
        traceback.print_exc()
    if args.keep:
        v.fact("kept", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    v.doc["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(v.doc, default=str))
    return 0 if v.doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
