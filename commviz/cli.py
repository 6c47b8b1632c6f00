"""The `commviz` command."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import commviz
from commviz.transport.address import AddressError, default_addr, is_loopback, private_dir

EPILOG = """start here:
  commviz demo                                   dashboard + a 4-rank CPU job, one command
  commviz watch -- torchrun --nproc-per-node 4 scenarios/allreduce.py
  commviz record -o t.cvz -- torchrun --nproc-per-node 4 scenarios/allreduce.py
  commviz summary t.cvz            (or a COMMVIZ_TRACE_DIR of rank-<R>.cvz files)
  commviz replay t.cvz

A script that calls commviz.instrument() streams to a running `commviz watch`;
`watch/record -- CMD` instrument unmodified scripts too."""


def _split_cmd(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _token(addr: str) -> str | None:
    """A listener other machines can reach only admits ranks holding a shared token
    (COMMVIZ_TOKEN, made up here if unset; a launched job inherits it)."""
    if is_loopback(addr):
        return os.environ.get("COMMVIZ_TOKEN") or None
    token = os.environ.get("COMMVIZ_TOKEN")
    if not token:
        import secrets

        token = os.environ["COMMVIZ_TOKEN"] = secrets.token_urlsafe(18)
        print(f"commviz: {addr} is reachable from other machines; ranks must set\n"
              f"  export COMMVIZ_TOKEN={token}", file=sys.stderr)
    return token


def _listen_addr(args, private_name: str | None = None) -> str:
    if args.listen:
        return args.listen
    if private_name:
        return f"ipc://{os.path.join(private_dir(), private_name)}"
    private_dir()  # create and check the per-user directory
    return default_addr()


def _die(msg: str, code: int = 2) -> int:
    print(f"commviz: {msg}", file=sys.stderr)
    return code


# ---------------------------------------------------------------- summary


def cmd_summary(args) -> int:
    from commviz.model import Model
    from commviz.report import render_summary
    from commviz.trace.file import TraceError, load

    try:
        loaded = load(args.path)
    except (TraceError, OSError) as exc:
        return _die(str(exc))
    model = Model(hang_after_s=args.hang_after)
    model.ingest_trace(loaded.batches, cut_off=loaded.truncated)
    s = model.summary()
    if loaded.problems:
        s["problems"] = loaded.problems
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(render_summary(s, loaded.problems))
    return 0


# ----------------------------------------------------------------- record


def cmd_record(args, cmd: list[str]) -> int:
    from commviz import launch
    from commviz.report import render_summary
    from commviz.watcher import LiveFeed

    if not cmd:
        return _die("record needs a command: commviz record -o t.cvz -- torchrun --nproc-per-node 2 scenarios/allreduce.py")
    try:
        addr = _listen_addr(args, private_name=f"record-{os.getpid()}.sock")
        ring_dir = tempfile.mkdtemp(prefix="rings-", dir=private_dir())
        feed = LiveFeed(addr, record_to=args.output, hang_after_s=args.hang_timeout or 10.0, ring_dir=ring_dir,
                        token=_token(addr)).start()
    except (AddressError, OSError) as exc:
        return _die(str(exc))
    try:
        stack_after = max(0.5, args.hang_timeout / 2) if args.hang_timeout else None
        proc = launch.start(cmd, feed.addr, stack_after_s=stack_after, ring_dir=ring_dir)
    except SystemExit as exc:
        feed.close()
        shutil.rmtree(ring_dir, ignore_errors=True)
        return _die(str(exc).removeprefix("commviz: "))
    found: list = []
    try:
        rc = _wait_or_diagnose(proc, feed, args.hang_timeout, found)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    # Ranks flush their last batch and goodbye at exit; give the frames a moment.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not feed.all_exited():
        feed.collect_rings()  # ranks that died before saying (or without saying) goodbye
        time.sleep(0.05)
    time.sleep(0.1)
    feed.collect_rings()
    feed.close()
    shutil.rmtree(ring_dir, ignore_errors=True)
    with feed.lock:
        s = feed.model.summary()
    if found:
        # what was true when the job was stopped, not after we killed it
        s["diagnoses"] = [d.to_json() for d in found]
    out = sys.stderr if args.quiet else sys.stdout
    print(render_summary(s, feed.errors[-5:]), file=out)
    print(f"trace written to {args.output}  (commviz summary {args.output} · commviz replay {args.output})")
    if found:
        print(f"commviz: stopped the job: {len(found)} diagnosis(es) after {args.hang_timeout:g} s", file=sys.stderr)
        return 3
    if rc != 0:
        print(f"commviz: the job exited with status {rc}", file=sys.stderr)
        return rc
    if s["diagnoses"]:
        return 3
    return 0


def _wait_or_diagnose(proc, feed, hang_timeout: float | None, found: list) -> int:
    """Wait for the job; with a hang timeout, check the model about once a second
    and stop the job (torchrun, then its ranks) as soon as something is wrong."""
    if not hang_timeout:
        return proc.wait()
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        with feed.lock:
            diags = [d for d in feed.model.findings(time.time_ns()).diagnoses if d.kind.blocks]
        if diags:
            found.extend(diags)
            _stop(proc)
            return proc.returncode


def _stop(proc) -> None:
    """SIGTERM torchrun (it forwards to its workers), then SIGKILL if it lingers."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------ watch / demo


def _dashboard_topology(name: str | None, local: bool = False):
    """The dashboard's GPU topology: `--topology` (a preset name or a fixture file), else
    for a live watch this machine's NVML when it has GPUs, else None. Raises FixtureError."""
    from commviz.topo.discover import discover
    from commviz.topo.fake import FakeNvml
    from commviz.topo.presets import load_preset

    if name:
        backend = FakeNvml.from_file(name) if os.path.exists(name) else load_preset(name)
    elif local:
        try:
            from commviz.topo.backend import open_backend

            backend = open_backend()
        except Exception:  # NVML absent or broken is a normal state here
            return None
    else:
        return None
    try:
        topo = discover(backend)
    finally:
        backend.close()
    return topo if topo.gpus else None


def _run_app(feed, title: str, proc=None, log_path: str | None = None, topology=None) -> int:
    from commviz.tui.app import WatchApp

    app = WatchApp(feed, title=title, topology=topology)
    try:
        app.run()
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(5)
            except Exception:
                proc.kill()
        if hasattr(feed, "close"):
            feed.close()
    if log_path:
        print(f"job output: {log_path}")
    return 0


def _start_job_logged(cmd: list[str], addr: str, stack_after_s: float | None = None, ring_dir: str | None = None):
    from commviz import launch

    log = tempfile.NamedTemporaryFile(prefix="commviz-job-", suffix=".log", delete=False)
    env = launch.job_env(addr, stack_after_s=stack_after_s, ring_dir=ring_dir)
    proc = subprocess.Popen(launch.resolve(cmd), env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, log.name


def cmd_watch(args, cmd: list[str]) -> int:
    from commviz.topo.fake import FixtureError
    from commviz.watcher import LiveFeed

    try:
        topology = _dashboard_topology(getattr(args, "topology", None), local=True)
    except FixtureError as exc:
        return _die(str(exc))
    try:
        addr = _listen_addr(args, private_name=f"watch-{os.getpid()}.sock" if cmd else None)
        ring_dir = tempfile.mkdtemp(prefix="rings-", dir=private_dir()) if cmd else None
        feed = LiveFeed(addr, record_to=args.record, hang_after_s=args.hang_after, ring_dir=ring_dir,
                        token=_token(addr)).start()
    except (AddressError, OSError) as exc:
        return _die(str(exc))
    proc = log = None
    if cmd:
        try:
            proc, log = _start_job_logged(cmd, feed.addr, stack_after_s=max(0.5, min(3.0, args.hang_after / 2)),
                                          ring_dir=ring_dir)
        except SystemExit as exc:
            feed.close()
            return _die(str(exc).removeprefix("commviz: "))
    return _run_app(feed, "commviz watch", proc, log, topology=topology)


def demo_script() -> str | None:
    here = os.path.dirname(os.path.abspath(commviz.__file__))
    for cand in (os.path.join(here, "scenarios", "allreduce.py"), os.path.join(os.path.dirname(here), "scenarios", "allreduce.py")):
        if os.path.exists(cand):
            return cand
    return None


def cmd_demo(args) -> int:
    from commviz import launch

    script = demo_script()
    if script is None:
        return _die("the demo needs scenarios/allreduce.py from a source checkout (pip install -e .)")
    cmd = launch.torchrun(args.nproc, script, "--iters", str(args.iters), "--numel", str(args.numel),
                          "--interval", str(args.interval))
    args.listen = None
    args.record = None
    return cmd_watch(args, cmd)


# ----------------------------------------------------------------- export


def _load_noting(path):
    """A trace file or dir for a viewer: what could not be read is said on stderr
    (the load goes on); a file that is no trace at all is an error (None)."""
    from commviz.trace.file import TraceError, load

    try:
        loaded = load(path)
    except (TraceError, OSError) as exc:
        _die(str(exc))
        return None
    for p in loaded.problems:
        print(f"commviz: note: {p}", file=sys.stderr)
    return loaded


def cmd_export(args) -> int:
    from commviz.model import Model
    from commviz.trace.perfetto import to_chrome_trace

    loaded = _load_noting(args.path)
    if loaded is None:
        return 2
    model = Model(keep_ops=True)
    model.ingest_trace(loaded.batches, cut_off=loaded.truncated)
    doc = to_chrome_trace(model)
    with open(args.perfetto, "w") as f:
        json.dump(doc, f)
    n = sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    print(f"{n} ops written to {args.perfetto}: open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


# ----------------------------------------------------------------- replay


def cmd_replay(args) -> int:
    from commviz.topo.fake import FixtureError
    from commviz.tui.feed import ReplayFeed

    try:
        topology = _dashboard_topology(getattr(args, "topology", None))
    except FixtureError as exc:
        return _die(str(exc))
    loaded = _load_noting(args.path)
    if loaded is None:
        return 2
    if not loaded.batches:
        return _die(f"{args.path}: no events to replay")
    feed = ReplayFeed(loaded.batches, cut_off=loaded.truncated)
    feed.set_speed(args.speed)
    return _run_app(feed, f"commviz replay {os.path.basename(str(args.path))}", topology=topology)


# ------------------------------------------------------------- topo / nvml-dump


def cmd_topo(args) -> int:
    from commviz.topo.backend import open_backend
    from commviz.topo.discover import discover
    from commviz.topo.fake import FakeNvml, FixtureError
    from commviz.topo.presets import load_preset, preset_names
    from commviz.topo.render import render_topology

    try:
        if args.preset:
            backend = load_preset(args.preset)
        elif args.fixture:
            backend = FakeNvml.from_file(args.fixture)
        else:
            backend = open_backend()
    except FixtureError as exc:
        return _die(str(exc))
    try:
        topo = discover(backend)
    finally:
        backend.close()
    if not backend.available:
        hint = (f"commviz: {backend.reason}; no GPU topology to show here.\n"
                f"  to see a machine's shape anyway: commviz topo --preset dgx-h100"
                f"  (presets: {', '.join(preset_names())})")
        print(hint, file=sys.stderr if args.json else sys.stdout)
        if not args.json:
            return 0
    if args.json:
        print(json.dumps(topo.to_document(), indent=2))
    else:
        print(render_topology(topo), end="")
    return 0


def cmd_nvml_dump(args) -> int:
    from commviz.topo.dump import fixture_from, fixture_text
    from commviz.topo.real import RealNvml

    backend = RealNvml()
    if not backend.available:
        return _die(f"cannot dump: {backend.reason}. Run `commviz nvml-dump FILE` on the GPU machine "
                    "you want to capture; `commviz topo --fixture FILE` shows the result anywhere.")
    try:
        doc = fixture_from(backend, samples=args.samples, interval_s=args.interval)
    finally:
        backend.close()
    try:
        with open(args.path, "w", encoding="utf-8") as f:
            f.write(fixture_text(doc))
    except OSError as exc:
        return _die(f"cannot write {args.path}: {exc.strerror or exc}")
    print(f"fixture of {len(doc['gpus'])} GPU(s) on {doc['host']} written to {args.path}"
          f"  (commviz topo --fixture {args.path})")
    return 0


# ------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="commviz",
        description="Live torch.distributed traffic in your terminal.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"commviz {commviz.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    w = sub.add_parser("watch", help="dashboard on live events; with -- CMD it also launches the job",
                       description="Dashboard on live events. Ranks that call commviz.instrument() (or run "
                       "under `watch -- CMD`) connect by themselves.")
    w.add_argument("--listen", metavar="ADDR", help="ipc:///path or tcp://host:port (default: per-user socket)")
    w.add_argument("--record", metavar="FILE", help="also write every event to this trace file")
    w.add_argument("--topology", metavar="PRESET", help="lay GPUs out as this machine: a preset (dgx-h100, dgx-a100, "
                   "pcie-2gpu, pcie-4gpu-2socket) or a fixture file (default: this machine's NVML, if any)")
    w.add_argument("--hang-after", type=float, default=10.0, metavar="S", help="seconds in one op before a rank shows as hung")

    r = sub.add_parser("record", help="run a job headless, write its trace, print the summary",
                       description="Run CMD with every rank instrumented, write the trace, print the summary. "
                       "Exits with the job's status.")
    r.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write (.cvz)")
    r.add_argument("--listen", metavar="ADDR", help="address for the ranks (default: a private per-run socket)")
    r.add_argument("-q", "--quiet", action="store_true", help="summary to stderr")
    r.add_argument("--hang-timeout", type=float, metavar="S",
                   help="stop the job once ranks have waited S seconds on a rank that will not come "
                   "(hang, p2p deadlock, desync, dead rank); print the diagnosis and exit 3")

    rp = sub.add_parser("replay", help="dashboard on a recorded trace")
    rp.add_argument("path", metavar="FILE_OR_DIR")
    rp.add_argument("--speed", type=float, default=1.0, help="playback speed, 0.25 to 16 (default 1)")
    rp.add_argument("--topology", metavar="PRESET", help="lay GPUs out as this machine: a preset (dgx-h100, "
                    "dgx-a100, pcie-2gpu, pcie-4gpu-2socket) or a fixture file from `commviz nvml-dump`")

    s = sub.add_parser("summary", help="per-op table (or --json) of a trace file or COMMVIZ_TRACE_DIR")
    s.add_argument("path", metavar="FILE_OR_DIR")
    s.add_argument("--json", action="store_true", help="the stable JSON document (see DESIGN.md)")
    s.add_argument("--hang-after", type=float, default=1.0, metavar="S",
                   help="ops still waiting this long at the end of the trace count as a hang (default 1)")

    e = sub.add_parser("export", help="a trace as Chrome trace JSON for Perfetto / chrome://tracing")
    e.add_argument("path", metavar="FILE_OR_DIR")
    e.add_argument("--perfetto", required=True, metavar="OUT", help="JSON file to write")

    d = sub.add_parser("demo", help="dashboard + a small CPU job, one command")
    d.add_argument("--nproc", type=int, default=4)
    d.add_argument("--iters", type=int, default=600)
    d.add_argument("--numel", type=int, default=1 << 16)
    d.add_argument("--interval", type=float, default=0.05)
    d.add_argument("--hang-after", type=float, default=10.0, help=argparse.SUPPRESS)

    t = sub.add_parser("topo", help="GPU topology matrix (like nvidia-smi topo -m) and NVLink list",
                       description="GPU topology of this machine from NVML, or of a preset or fixture file.")
    t.add_argument("--json", action="store_true", help="the stable JSON document (see DESIGN.md)")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--preset", metavar="NAME", help="a shipped machine: dgx-h100, dgx-a100, pcie-2gpu, pcie-4gpu-2socket")
    src.add_argument("--fixture", metavar="FILE", help="a fixture file (from commviz nvml-dump)")

    nd = sub.add_parser("nvml-dump", help="write this machine's GPU topology and counters as a fixture file",
                        description="Capture this machine's NVML view (topology and a few counter readings) "
                        "as a fixture for `commviz topo --fixture` and the tests.")
    nd.add_argument("path", metavar="FILE")
    nd.add_argument("--samples", type=int, default=3, help="counter readings to capture (default 3)")
    nd.add_argument("--interval", type=float, default=0.2, metavar="S", help="seconds between readings")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, cmd = _split_cmd(argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.command is None:
        parser.print_help()
        return 2
    if cmd and args.command not in ("watch", "record"):
        return _die(f"`{args.command}` takes no command after --")
    if args.command == "summary":
        return cmd_summary(args)
    if args.command == "record":
        return cmd_record(args, cmd)
    if args.command == "watch":
        return cmd_watch(args, cmd)
    if args.command == "replay":
        return cmd_replay(args)
    if args.command == "demo":
        return cmd_demo(args)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "topo":
        return cmd_topo(args)
    if args.command == "nvml-dump":
        return cmd_nvml_dump(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
