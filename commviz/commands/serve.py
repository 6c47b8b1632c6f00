"""`commviz serve`: the collector alone — the transport server, the model, the trace
(`-o FILE`), relays and tokens as `watch` has them — with no screen, until stopped.
It prints each diagnosis as it appears, and answers `--http [HOST:]PORT` with the
summary document (`commviz summary --live`), dashboards in other processes or on
other machines (`commviz watch --connect`, as many as like) and, where
prometheus-client is installed, `/metrics`."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time

from commviz.commands._live import METRICS_HELP, metrics_addr, open_feed
from commviz.commands.base import Command

CHECK_EVERY_S = 0.5
# Set by a dashboard that starts its own collector (commands/_collector.py): the HTTP
# view's token (wanted on loopback too); without it the collector makes one. Either
# way it is kept in the per-user directory for this user's other views and scripts.
VIEW_TOKEN_ENV = "COMMVIZ_VIEW_TOKEN"


def add_arguments(p) -> None:
    p.add_argument("--listen", metavar="ADDR", help="ipc:///path or tcp://host:port (default: per-user socket, "
                   "as `watch`)")
    p.add_argument("-o", "--output", metavar="FILE", help="write every event to this trace file")
    p.add_argument("--hang-after", type=float, default=10.0, metavar="S",
                   help="seconds in one op before a rank counts as hung (default 10)")
    p.add_argument("--http", metavar="[HOST:]PORT", type=metrics_addr,
                   help="answer `commviz watch --connect`, GET /summary, /diagnoses (and /metrics) here; "
                        "127.0.0.1 unless HOST is given, which then needs the collector's token (on 127.0.0.1 "
                        "a token of its own, which your own views and scripts find by themselves)")
    p.add_argument("--metrics", type=metrics_addr, metavar="HOST:PORT", help=METRICS_HELP + " (also on --http)")
    p.add_argument("--for", dest="for_s", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C or SIGTERM)")
    # What `watch`, `demo` and `lesson` start it with (commands/_collector.py): stop when
    # that process is gone; on SIGUSR1 mark every running rank stopped by it; collect
    # the crash rings of the job it launched.
    p.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--stop-by", default="commviz serve", help=argparse.SUPPRESS)
    p.add_argument("--ring-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--topology", default=None, help=argparse.SUPPRESS)  # watch/lesson --topology PRESET


def run(args, cmd: list[str]) -> int:
    from commviz.commands._dashboard import topology_option
    from commviz.httpview import StateServer
    from commviz.topo.hosts import HostTopologies
    from commviz.transport.token import make_token
    from commviz.viewlink import ViewSource, write_note

    feed, _ = open_feed(args.listen, None, args.output, args.hang_after, with_rings=bool(args.ring_dir),
                        ring_dir=args.ring_dir)
    http = note = token_file = None
    try:
        # Always a view: on --http, else on a free loopback port that the note next to
        # the listening address names (`watch --connect ADDR`, `summary --live ADDR`).
        host, port = args.http or ("127.0.0.1", 0)
        # this machine's NVML, as an embedded dashboard has it; or the preset a dashboard
        # that started this collector was given
        topo = topology_option(args.topology, local=True)
        views = ViewSource(feed, topo, HostTopologies(local=topo), title=f"collector {feed.addr}")
        view_token = os.environ.get(VIEW_TOKEN_ENV) or make_token()
        http = StateServer(feed, host, port, token=os.environ.get("COMMVIZ_TOKEN"),
                           extra=_metrics_view(feed), views=views, loopback_token=view_token)
        if args.metrics:  # a second address of the same server, answering /metrics alone
            feed.metrics_url = http.add_metrics(*args.metrics)
        token_file = _keep_token(http, view_token)  # before it answers: a script polling it gets in at once
        http.start()
        # Before the first line a dashboard waits for: from then on it may signal us.
        stopping, notes = [], []
        signal.signal(signal.SIGTERM, lambda *a: stopping.append("SIGTERM"))
        signal.signal(signal.SIGUSR1, lambda *a: notes.append(args.stop_by))
        note = write_note(feed.addr, http.url)
        print(f"commviz serve: listening on {feed.addr}" + (f" · {http.url}/summary" if args.http else ""),
              flush=True)
        print(f"  dashboards: commviz watch --connect {feed.addr if not args.http else f'{http.host}:{http.port}'}",
              flush=True)
        if token_file is not None and args.http:
            print(f"  its token (your own views and scripts find it): {token_file}", flush=True)
            print(f"  from another machine, through ssh -L: COMMVIZ_TOKEN=$(ssh {socket.gethostname()} cat {token_file})",
                  flush=True)
        if feed.metrics_url:
            print(f"  metrics: {feed.metrics_url}", flush=True)
        if args.output:
            print(f"  writing every event to {args.output}", flush=True)
        _loop(feed, stopping, args.for_s, notes, args.parent)
    except KeyboardInterrupt:
        pass
    finally:
        for path in (note, token_file):
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        if http is not None:
            http.close()
        feed.close()
    with feed.lock:
        s = feed.model.summary()
    print(f"commviz serve: stopped · {len(s['ranks'])} ranks · {s['events']} events"
          + (f" · trace in {args.output}" if args.output else ""), flush=True)
    return 0


def _keep_token(http, token: str) -> str | None:
    """The view's token, kept for this user's views and scripts where they will ask:
    the loopback address the view is bound to (127.0.0.1 for every interface); none
    for another address, where COMMVIZ_TOKEN is asked. Its file, or None (said)."""
    from commviz.httpview import loopback_host
    from commviz.transport.address import AddressError
    from commviz.viewlink import write_token

    host = "127.0.0.1" if http.host in ("0.0.0.0", "::", "") else http.host
    if not loopback_host(host):
        return None
    try:
        return write_token(f"{'[' + host + ']' if ':' in host else host}:{http.port}", token)
    except (AddressError, OSError) as exc:
        print(f"commviz serve: cannot keep the view's token for your other views and scripts ({exc}); "
              "they will need COMMVIZ_TOKEN", file=sys.stderr, flush=True)
        return None


def _loop(feed, stopping: list, for_s: float | None, notes: list | None = None, parent: int | None = None) -> None:
    """Say each new diagnosis once, and ranks as they come and go; mark the stops
    asked for (`notes`, by SIGUSR1: here, not in the handler, which could interrupt
    this loop while it holds the model's lock); stop when `parent` is gone."""
    said: set[str] = set()
    ranks_seen = 0
    t_end = time.monotonic() + for_s if for_s else None
    notes = [] if notes is None else notes
    while not stopping and (t_end is None or time.monotonic() < t_end):
        time.sleep(CHECK_EVERY_S if not notes else 0)
        while notes:
            feed.note_stop(notes.pop(), "quit while it ran")
            print("  stop noted", flush=True)
        if parent is not None and os.getppid() != parent:
            print("commviz serve: the dashboard that started it is gone", flush=True)
            break
        with feed.lock:
            found = feed.model.findings(time.time_ns()).diagnoses
            n = len(feed.model.ranks)
        if n != ranks_seen:
            print(f"  {n} rank{'s' if n != 1 else ''} connected", flush=True)
            ranks_seen = n
        for d in found:
            key = f"{d.kind.value}:{d.group}:{d.seq}:{d.op}"
            if key not in said:
                said.add(key)
                print(f"{time.strftime('%H:%M:%S')} {d.kind.value.upper()}: {d.message}", flush=True)
    sys.stdout.flush()


def _metrics_view(feed) -> dict:
    """/metrics, where the Prometheus exposition is available (commviz/metrics.py)."""
    try:
        from commviz import metrics
    except ImportError:
        return {}
    view = getattr(metrics, "http_view", None)
    return view(feed) if view is not None else {}


COMMAND = Command("serve", "the collector alone, no screen: listen, keep the model, write the trace, answer HTTP",
                  add_arguments, run, description=__doc__)
