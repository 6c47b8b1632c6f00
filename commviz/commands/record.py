"""`commviz record -o FILE [--hang-timeout S] [--fail-on KIND] -- CMD…`: run a job
headless, write its trace, print the summary; exit 3 on a diagnosis that means the job
is broken (or one named by --fail-on), else the job's status."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from commviz import launch
from commviz.commands._live import METRICS_HELP, metrics_addr, open_feed, start_metrics
from commviz.commands.base import Command
from commviz.errors import CommvizError

FLUSH_WAIT_S = 2.0  # ranks flush their last batch and goodbye at exit: give the frames this long


def add_arguments(p) -> None:
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write (.cvz)")
    p.add_argument("--listen", metavar="ADDR", help="address for the ranks (default: a private per-run socket)")
    p.add_argument("-q", "--quiet", action="store_true", help="summary to stderr")
    p.add_argument("--hang-timeout", type=float, metavar="S",
                   help="stop the job once ranks have waited S seconds on a rank that will not come "
                   "(hang, p2p deadlock, desync, dead rank); print the diagnosis and exit 3")
    p.add_argument("--fail-on", type=_kinds, action="extend", default=[], metavar="KIND",
                   help="also exit 3 when a diagnosis of this kind is found: straggler (repeat it or "
                   "give a comma list; hang, desync, p2p_deadlock and dead_rank always fail)")
    p.add_argument("--metrics", type=metrics_addr, metavar="HOST:PORT", help=METRICS_HELP)


def _kinds(text: str) -> list:
    """`--fail-on straggler` or a comma list; every kind a diagnosis can have."""
    from commviz.model.diagnosis import Kind

    names = [k.strip() for k in text.split(",") if k.strip()]
    valid = {kind.value for kind in Kind}
    bad = [k for k in names if k not in valid]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown kind {', '.join(bad) or repr(text)}; "
                                         f"kinds: {', '.join(k.value for k in Kind)}")
    return [Kind(k) for k in names]


def run(args, cmd: list[str]) -> int:
    from commviz.report import render_summary

    if not cmd:
        raise CommvizError("record needs a command: commviz record -o t.cvz -- torchrun --nproc-per-node 2 "
                           "scenarios/allreduce.py")
    feed, ring_dir = open_feed(args.listen, f"record-{os.getpid()}.sock", args.output, args.hang_timeout or 10.0,
                               with_rings=True)
    stack_after = max(0.5, args.hang_timeout / 2) if args.hang_timeout else None
    job = launch.Job(cmd, feed.addr, stack_after_s=stack_after, ring_dir=ring_dir)
    endpoint = None
    try:
        endpoint = start_metrics(args.metrics, feed)
        if endpoint is not None:
            print(f"commviz: Prometheus metrics on {endpoint.url}", file=sys.stderr)
        job.start()
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        feed.close()
        shutil.rmtree(ring_dir, ignore_errors=True)
        raise
    try:
        rc, found = _wait(job, feed, args.hang_timeout)
    finally:
        _drain(feed)
        shutil.rmtree(ring_dir, ignore_errors=True)
        if endpoint is not None:
            endpoint.close()
    with feed.lock:
        s = feed.model.summary()
    if found:
        s["diagnoses"] = [d.to_json() for d in found]  # what was true when the job was stopped, not after
    print(render_summary(s, feed.errors[-5:]), file=sys.stderr if args.quiet else sys.stdout)
    print(f"trace written to {args.output}  (commviz summary {args.output} · commviz replay {args.output})")
    if found:
        print(f"commviz: stopped the job: {len(found)} diagnosis(es) after {args.hang_timeout:g} s", file=sys.stderr)
        return 3
    if rc != 0:
        print(f"commviz: the job exited with status {rc}", file=sys.stderr)
        return rc
    return _verdict(s["diagnoses"], args.fail_on)


def _verdict(diagnoses: list[dict], fail_on: list) -> int:
    """3 when a finding means the job is broken, or is of a kind asked for: a
    straggler is slow but correct, so it alone does not turn a CI run red."""
    from commviz.model.diagnosis import Kind

    failing = sorted({k for k in (Kind(d["kind"]) for d in diagnoses) if k.blocks or k in fail_on},
                     key=lambda k: k.order)
    if failing:
        print(f"commviz: exit 3: {', '.join(failing)}", file=sys.stderr)
        return 3
    return 0


def _wait(job: launch.Job, feed, hang_timeout: float | None) -> tuple[int, list]:
    """The job's exit status, and the diagnoses that made us stop it (with a hang
    timeout: the model is checked about twice a second)."""
    try:
        if not hang_timeout:
            return job.wait(), []

        def blocking():
            with feed.lock:
                found = [d for d in feed.model.findings(time.time_ns()).diagnoses if d.kind.blocks]
            if found:  # the job is stopped as soon as we return: say so in the trace first
                feed.note_stop("commviz record", ", ".join(dict.fromkeys(d.kind.value for d in found)), hang_timeout)
            return found

        return job.wait_or_diagnose(blocking)
    except KeyboardInterrupt:
        feed.note_stop("commviz record", "Ctrl-C")
        return job.interrupt(grace_s=None), []


def _drain(feed) -> None:
    """Let the last frames and goodbyes land, read the crash rings of ranks that died
    without one, and close the feed (and the trace file)."""
    deadline = time.monotonic() + FLUSH_WAIT_S
    while time.monotonic() < deadline and not feed.all_exited():
        feed.collect_rings()
        time.sleep(0.05)
    time.sleep(0.1)
    feed.collect_rings()
    feed.close()


COMMAND = Command(
    "record", "run a job headless, write its trace, print the summary", add_arguments, run,
    description="Run CMD with every rank instrumented, write the trace, print the summary. "
    "Exit status: the job's own when it fails; 3 when commviz finds a hang, desync, p2p deadlock "
    "or dead rank (or a kind named by --fail-on); else 0. A straggler is printed but does not "
    "fail the run unless --fail-on straggler.",
    takes_cmd=True,
)
