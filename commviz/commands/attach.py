"""`commviz attach`: diagnose torch.distributed jobs already running on this machine,
started without commviz. Nothing in the job changes: the ranks are found by their
environment, their stacks read with py-spy, NCCL's RAS service and torch's flight
recorder asked where the job enabled them, and the model that reads live traffic
gives the diagnoses, the roll-call and the summary document."""

from __future__ import annotations

import json
import os
import socket
import time

from commviz.commands.base import JSON_HELP, Command
from commviz.errors import CommvizError
from commviz.model import traces


def add_arguments(p) -> None:
    p.add_argument("--pid", type=int, action="append", metavar="PID",
                   help="only the job this process is a rank of (default: every job on this machine)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="look at every rank twice, this far apart: a rank in the same call both times is stuck "
                        "(default 2)")
    p.add_argument("--json", action="store_true", help=JSON_HELP + ", with an `attach` key saying what was read")
    p.add_argument("--save", metavar="DIR",
                   help="also write what was seen as a trace dir (rank-R.cvz): run attach on every node with one "
                        "shared DIR, then `commviz summary DIR` diagnoses the whole job")
    p.add_argument("--ras", metavar="HOST:PORT", default=None,
                   help="NCCL's RAS service to ask (default: NCCL_RAS_ADDR of the job, else localhost:28028)")
    p.add_argument("--watch", action="store_true",
                   help="the dashboard on what attach sees, looked at again after each round (Ctrl-C or q quits)")
    p.add_argument("--no-dump", action="store_true",
                   help="do not ask ranks' debug pipes for flight-recorder dumps (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)")


def run(args, cmd: list[str]) -> int:
    from commviz.attach import discover

    ranks = discover.find_ranks()
    jobs = discover.group_jobs(ranks)
    if args.pid:
        jobs = [j for j in jobs if any(r.pid in args.pid for r in j.ranks)]
    if not jobs:
        hint = (" (none of --pid is a rank of one)" if args.pid else "")
        raise CommvizError(
            "no torch.distributed job found on this machine" + hint + ": attach looks for Python processes with "
            "RANK and WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID in their environment, "
            "readable by this user (run it as the job's user, or with sudo)", 2)
    if args.save and len(jobs) > 1:
        raise CommvizError(f"{len(jobs)} jobs run here ({', '.join(j.key for j in jobs)}): --save writes one job's "
                           "ranks; say which with --pid PID", 2)
    if args.watch:
        if len(jobs) > 1:
            raise CommvizError(f"{len(jobs)} jobs run here ({', '.join(j.key for j in jobs)}): --watch shows one; "
                               "say which with --pid PID", 2)
        from commviz.attach.feed import AttachFeed
        from commviz.commands._dashboard import run_app

        feed = AttachFeed(lambda: observe(jobs[0], args)[:2], pause_s=args.interval)
        feed.look_once()  # the first round before the screen: the dashboard opens on the job
        return run_app(feed.start(), f"commviz attach · {jobs[0].key}")
    docs = [attach_job(j, args) for j in jobs]
    if args.json:
        print(json.dumps(docs[0] if len(docs) == 1 else {"jobs": docs}, indent=2))
    else:
        from commviz.report import render_summary

        for d in docs:
            print("\n".join(_header(d["attach"])))
            print(render_summary(d, d.get("notes")))
            print()
    return 3 if any(dd["kind"] != "straggler" for d in docs for dd in d["diagnoses"]) else 0


def attach_job(job, args) -> dict:
    """One round of attach on `job`: the summary document with its `attach` key."""
    model, tiers, notes, now_wall = observe(job, args)
    doc = model.summary(now_wall)
    if notes:
        doc["notes"] = notes
    doc["attach"] = tiers
    return doc


def observe(job, args):
    """Two looks at every rank, the dumps and RAS where there are any: (the model
    of what was seen, what was read and how, notes, the time it stands for)."""
    from commviz.attach import discover, look, pyspy, ras
    from commviz.model import Model
    from commviz.model.rollcall import groups_json, place, roll_call
    from commviz.model.thresholds import Thresholds

    exe = pyspy.find_pyspy()
    first = _looks(job, exe)
    time.sleep(max(0.0, args.interval))
    second = _looks(job, exe)
    tiers: dict = {"job": job.key, "launcher": job.launcher.value, "world_size": job.world_size,
                   "ranks_here": [r.rank for r in job.ranks], "host": socket.gethostname()}
    read = sum(1 for lk in second.values() if lk.threads is not None)
    errors = sorted({lk.error for lk in second.values() if lk.error})
    tiers["stacks"] = {"tool": "py-spy" if exe else None, "read": read, "of": len(second), "errors": errors,
                       "interval_s": args.interval}

    notes: list[str] = []
    dumps: list[str] = []
    if not args.no_dump:
        tiers["dump_requested"] = look.request_dumps(job)
    dumps = look.dump_paths(job)
    nccl = any(lk.nccl for lk in second.values())
    fr_on = any(r.has(discover.FLIGHT_RECORDER) for r in job.ranks)
    tiers["flight_recorder"] = {"enabled": fr_on, "dumps": dumps}

    observed = look.to_batches(job, first, second, with_ops=not dumps)
    model = Model(thresholds=Thresholds(hang_after_s=observed.hang_after_s), flows=False)
    if dumps:
        from pathlib import Path

        from commviz.trace.torchfiles import TorchFileError, load_torch

        try:
            loaded = load_torch([Path(p) for p in dumps], job=job.key)
            traces.ingest_trace(model, loaded.batches)
            notes += loaded.notes + loaded.problems
        except TorchFileError as exc:
            notes.append(f"flight-recorder dumps not read: {exc}")
            observed = look.to_batches(job, first, second)
    for b in observed.batches:
        for ev in b.events:
            model.ingest(b.rank, ev)

    if nccl:
        addr = args.ras or next((r.env[discover.RAS_ADDR] for r in job.ranks if r.env.get(discover.RAS_ADDR)),
                                ras.DEFAULT_ADDR)
        try:
            tiers["ras"] = ras.query(addr).to_json()
        except ras.RasError as exc:
            tiers["ras"] = {"error": str(exc)}
    else:
        tiers["ras"] = {"error": "no NCCL in this job's processes"}

    tiers["roll_call"] = groups_json(roll_call([place(model, rank) for rank in sorted(second)
                                                if rank in model.ranks]))
    tiers["next_time"] = _next_time(job, tiers, nccl)
    if args.save:
        tiers["saved"] = _save(args.save, look.to_batches(job, first, second).batches)
    return model, tiers, notes, observed.now_wall


def _looks(job, exe) -> dict:
    from commviz.attach import look, pyspy

    out = {}
    for r in job.ranks:
        t = time.monotonic_ns()
        try:
            threads = pyspy.dump(r.pid, exe)
            err = ""
        except pyspy.AttachError as exc:
            threads, err = None, str(exc)
        out[r.rank] = look.RankLook(r, t, threads, err, look.uses_nccl(r.pid))
    return out


def _next_time(job, tiers, nccl: bool) -> list[str]:
    from commviz.attach.discover import DUMP_FILE, DUMP_PIPE

    tips = []
    if not tiers["flight_recorder"]["enabled"]:
        tips.append("the flight recorder (sequence numbers, sizes, what each rank last ran): "
                    "TORCH_FR_BUFFER_SIZE=2000 (NCCL: TORCH_NCCL_TRACE_BUFFER_SIZE=2000)")
    if not any(r.has(DUMP_PIPE) for r in job.ranks):
        tips.append("dumps on request from attach: TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_pipe_ with "
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/fr_")
    elif not any(r.has(DUMP_FILE) for r in job.ranks):
        tips.append("a dump file to go with the pipe: TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/fr_")
    if nccl and "error" in tiers.get("ras", {}):
        tips.append("NCCL's RAS service: NCCL >= 2.24 with NCCL_RAS_ENABLE unset or 1")
    if not any(r.env.get("COMMVIZ_ADDR") or r.env.get("COMMVIZ_TRACE_DIR") for r in job.ranks):
        tips.append("every op, live and exact: commviz watch -- torchrun … (or COMMVIZ_TRACE_DIR=DIR with "
                    "`import commviz`)")
    return tips


def _header(a: dict) -> list[str]:
    st = a["stacks"]
    lines = [f"commviz attach: job {a['job']} ({a['launcher']}) · ranks {_ranks(a['ranks_here'])} here on "
             f"{a['host']}, world size {a['world_size']}"]
    if st["tool"] is None:
        lines.append("  stacks: py-spy is not installed (pip install 'commviz[attach]')")
    else:
        lines.append(f"  stacks: py-spy, {st['read']} of {st['of']} ranks read, two looks {st['interval_s']:g} s "
                     "apart (the times below are at least that)")
        lines += [f"    {e}" for e in st["errors"][:4]]
    fr = a["flight_recorder"]
    lines.append("  flight recorder: " + (f"{len(fr['dumps'])} dump(s) read" if fr["dumps"] else
                                         "on, no dump on disk yet" if fr["enabled"] else "off"))
    r = a["ras"]
    lines.append("  NCCL RAS: " + (f"answered at {r['addr']}" if "addr" in r else r["error"]))
    rc = a["roll_call"]["groups"]
    if rc:
        lines.append("  where the ranks are (odd ones first):")
        for g in rc[:8]:
            state = f"in {g['op']}" if g["op"] else "in no op"
            at = f", in {g['function']} at {g['where']}" if g["where"] else ""
            lines.append(f"    {g['count']} rank{'s' if g['count'] > 1 else ''} {state}{at}: {g['ranks']}")
    if a["next_time"]:
        lines.append("  next time, for more:")
        lines += [f"    {t}" for t in a["next_time"]]
    if a.get("saved"):
        lines.append(f"  saved: {a['saved']} (commviz summary on it, with the other nodes' files)")
    return lines


def _ranks(rs: list[int]) -> str:
    from commviz.model.text import rank_list

    return rank_list(rs)


def _save(d: str, batches) -> str:
    from commviz.events import encode_batch
    from commviz.trace.file import TraceWriter

    os.makedirs(d, exist_ok=True)
    for b in batches:
        w = TraceWriter(os.path.join(d, f"rank-{b.rank}.cvz"))
        w.write(encode_batch(b.rank, b.events))
        w.close()
    return d


COMMAND = Command("attach", "diagnose a torch.distributed job already running on this machine, started "
                  "without commviz (py-spy stacks, NCCL RAS, flight-recorder dumps)", add_arguments, run,
                  description=__doc__)
