"""torch's own distributed test suite as the judge of commviz's invisibility.

Runs torch's `DistributedTest._DistTestBase` (bench/peer/suite.py, shaped like
torch's test_distributed_spawn.py) plainly and under `commviz record`, at each world
size given, and compares the passed, failed and skipped sets test by test. Both runs
have torch's flight recorder on (TORCH_FR_BUFFER_SIZE=2000), so the audit of the
commviz run names every op the suite ran that commviz did not see, summed over every
rank process of every test.

    python bench/peer_suite.py                       # world sizes 2 and 3, the whole suite
    python bench/peer_suite.py --world-size 3 -k "broadcast or barrier"
    python bench/peer_suite.py --python VENV/bin/python   # another torch, in its own venv

The whole suite takes ~13 min a run on a 2-core box (90 tests run, 195 skip for want of
CUDA); `--jobs N` runs tests in N pytest-xdist workers (then an unseen op's test is a
guess: ranks of tests running at once are told apart by time only). Exit status 1 when any test's
outcome differs, or a run gave no outcomes at all.

Needs `expecttest` (torch's test utilities import it) in the Python that runs the
suite.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SUITE = HERE / "peer" / "suite.py"
PLUGIN_DIR = HERE / "peer"
CLASS = "TestDistBackendWithSpawn"
MODES = ("plain", "commviz")


@dataclasses.dataclass(frozen=True)
class Outcome:
    test: str  # the test's name, without the file and class
    outcome: str  # passed | failed | skipped
    start: float  # wall clock, s
    stop: float
    why: str = ""


@dataclasses.dataclass
class Run:
    mode: str
    world: int
    outcomes: dict[str, Outcome]
    seconds: float
    returncode: int
    trace: Path | None = None
    tail: str = ""  # the runner's last output, where it gave no outcomes

    def counts(self) -> collections.Counter:
        return collections.Counter(o.outcome for o in self.outcomes.values())


def _ini(workdir: Path) -> Path:
    """An empty pytest config: the suite runs under pytest's defaults, not this repo's
    (its timeout, asyncio mode and warning filters)."""
    p = workdir / "pytest.ini"
    p.write_text("[pytest]\n")
    return p


def run_suite(mode: str, world: int, workdir: Path, k: str = "", jobs: int = 0, python: str = sys.executable,
              timeout: float = 3600.0, backend: str = "gloo", tests: tuple[str, ...] = ()) -> Run:
    """One run of the suite (or of the `tests` named); its outcomes, per test."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"{mode}-ws{world}.jsonl"
    out.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(BACKEND=backend, WORLD_SIZE=str(world), TORCH_FR_BUFFER_SIZE="2000", PEER_OUTCOMES=str(out),
               PYTHONPATH=os.pathsep.join(p for p in (str(PLUGIN_DIR), env.get("PYTHONPATH", "")) if p))
    for var in ("COMMVIZ_ADDR", "COMMVIZ_TRACE_DIR", "COMMVIZ_AUTOSTART"):
        env.pop(var, None)  # a watcher the developer has running is not this run's
    where = [f"{SUITE}::{CLASS}::{t}" for t in tests] or [str(SUITE)]
    cmd = [python, "-m", "pytest", *where, "-c", str(_ini(workdir)), "--rootdir", str(workdir), "-q",
           "-p", "outcomes", "-p", "no:cacheprovider"]
    if k:
        cmd += ["-k", k]
    if jobs:
        cmd += ["-n", str(jobs)]
    trace = None
    if mode == "commviz":
        trace = workdir / f"commviz-ws{world}.cvz"
        trace.unlink(missing_ok=True)
        env["PYTHONPATH"] = os.pathsep.join((str(REPO), env["PYTHONPATH"]))
        cmd = [python, "-m", "commviz.cli", "record", "-q", "-o", str(trace), "--", *cmd]
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=timeout)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = -1, f"timed out after {timeout:.0f} s\n" + str(exc.stdout or "")[-2000:]
    seconds = time.monotonic() - t
    return Run(mode, world, read_outcomes(out), seconds, rc, trace, tail)


def read_outcomes(path: Path) -> dict[str, Outcome]:
    got: dict[str, Outcome] = {}
    if not path.exists():
        return got
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        name = rec["test"].rsplit("::", 1)[-1]
        got[name] = Outcome(name, rec["outcome"], rec["start"], rec["stop"], rec.get("why", ""))
    return got


@dataclasses.dataclass(frozen=True)
class Difference:
    test: str
    plain: str  # an outcome, or "absent"
    commviz: str
    why: str  # the commviz run's failure text, or the plain run's where only it failed


def compare(plain: Run, under: Run) -> list[Difference]:
    diffs = []
    for name in sorted(set(plain.outcomes) | set(under.outcomes)):
        a, b = plain.outcomes.get(name), under.outcomes.get(name)
        oa, ob = a.outcome if a else "absent", b.outcome if b else "absent"
        if oa != ob:
            why = (b.why if b and b.outcome == "failed" else a.why if a else "") or ""
            diffs.append(Difference(name, oa, ob, why))
    return diffs


@dataclasses.dataclass
class SuiteAudit:
    """The flight-recorder audit (docs/SEEN.md) of every rank process of the run."""

    processes: int = 0  # rank processes whose audit came back with entries
    states: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # no entries: why
    backend: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    unseen: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    unseen_by_test: dict[str, collections.Counter] = dataclasses.field(default_factory=dict)


def audit_trace(trace: Path, outcomes: dict[str, Outcome]) -> SuiteAudit:
    """Replays the run's trace and takes each rank process's audit as it arrives. A
    summary of the trace keeps one audit per rank (the last process's); the suite
    starts new processes for every test, so each is taken here as it comes."""
    sys.path.insert(0, str(REPO))
    from commviz.events import Audit, Hello
    from commviz.model.merge import order_events
    from commviz.model.state import Model
    from commviz.trace.file import load

    spans = sorted((o.start, o.stop, o.test) for o in outcomes.values())
    model = Model()
    res = SuiteAudit()
    test_of: dict[int, str] = {}  # rank -> the test its current process belongs to
    for _, rank, ev in order_events(load(trace).batches):
        model.ingest(rank, ev)
        if isinstance(ev, Hello):
            wall = ev.wall_ns / 1e9
            test_of[rank] = next((name for a, b, name in spans if a <= wall <= b), "(outside any test)")
        elif isinstance(ev, Audit):
            got = model.ranks[rank].audit or {}
            if "state" in got:
                res.states[got["state"].split(":", 1)[0]] += 1
                continue
            res.processes += 1
            res.backend.update(got.get("backend", {}))
            unseen = got.get("unseen", {})
            res.unseen.update(unseen)
            if unseen:
                res.unseen_by_test.setdefault(test_of.get(rank, "?"), collections.Counter()).update(unseen)
    return res


def _line(run: Run) -> str:
    c = run.counts()
    return (f"{run.mode:8s} {c['passed']:4d} passed {c['failed']:3d} failed {c['skipped']:4d} skipped"
            f"  in {run.seconds / 60:5.1f} min (exit {run.returncode})")


def _cause(why: str) -> str:
    """The line of a failure that names the error: a rank's own exception, which
    torch's harness reports inside its RuntimeError, before that RuntimeError."""
    lines = [ln.strip() for ln in why.splitlines() if ln.strip()]
    named = [ln for ln in lines if ("Error" in ln or "Exception" in ln) and ":" in ln and not ln.startswith("/")]
    return (named or lines or [""])[0].lstrip("E ").strip()


def report(plain: Run, under: Run, audit: SuiteAudit | None) -> list[str]:
    lines = [f"world size {plain.world}", "  " + _line(plain), "  " + _line(under)]
    for r in (plain, under):
        if not r.outcomes:
            lines.append(f"  {r.mode}: no outcomes; its output ended:\n" + r.tail)
    diffs = compare(plain, under)
    if diffs:
        lines.append(f"  {len(diffs)} test(s) differ:")
        for d in diffs:
            first = _cause(d.why)
            lines.append(f"    {d.test}: {d.plain} plainly, {d.commviz} under commviz  {first[:160]}")
    else:
        lines.append("  the same outcome for every test")
    if audit is not None:
        lines.append(f"  audit: {audit.processes} rank processes audited, {sum(audit.backend.values())} backend ops"
                     + (f"; no entries: {dict(audit.states)}" if audit.states else ""))
        if audit.unseen:
            lines.append("  unseen by commviz: " + ", ".join(f"{n} {op}" for op, n in audit.unseen.most_common()))
            for test, c in sorted(audit.unseen_by_test.items()):
                lines.append(f"    {test}: " + ", ".join(f"{n} {op}" for op, n in c.most_common()))
        else:
            lines.append("  unseen by commviz: nothing")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, nargs="+", default=[2, 3])
    ap.add_argument("-k", default="", help="pytest -k expression: a slice of the suite")
    ap.add_argument("--tests", nargs="+", default=(), help="run these tests only, by name (test_broadcast ...)")
    ap.add_argument("--jobs", type=int, default=0, help="pytest-xdist workers (0: none)")
    ap.add_argument("--python", default=sys.executable, help="the Python (and so the torch) to run the suite with")
    ap.add_argument("--keep", type=Path, help="keep outcomes and traces here (default: a temporary directory)")
    ap.add_argument("--only", choices=MODES, help="run one mode only and print its outcomes")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a run may take")
    args = ap.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="peer-suite-"))
    print(f"outcomes and traces in {work}", flush=True)
    status = 0
    for world in args.world_size:
        runs = {}
        for mode in (args.only,) if args.only else MODES:
            runs[mode] = run_suite(mode, world, work, args.k, args.jobs, args.python, args.timeout,
                                   tests=tuple(args.tests))
            print(f"world size {world}: " + _line(runs[mode]), flush=True)
            if not runs[mode].outcomes:
                status = 1
        if args.only:
            continue
        plain, under = runs["plain"], runs["commviz"]
        audit = audit_trace(under.trace, under.outcomes) if under.trace and under.trace.exists() else None
        print("\n".join(report(plain, under, audit)), flush=True)
        if compare(plain, under):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
