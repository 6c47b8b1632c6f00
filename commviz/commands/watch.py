"""`commviz watch [-- CMD…]`: the dashboard on live events; with `-- CMD` it also
launches the job (its output goes to a log file: the dashboard owns the terminal).
The collector runs in a child process (`--connect`: one that runs already)."""

from __future__ import annotations

import os

from commviz import launch
from commviz.commands._dashboard import run_app, topology_option
from commviz.commands._live import METRICS_HELP, listen_addr, metrics_addr, new_ring_dir, token
from commviz.commands.base import TOPOLOGY_HELP, Command


def add_arguments(p) -> None:
    p.add_argument("--listen", metavar="ADDR", help="ipc:///path or tcp://host:port (default: per-user socket)")
    p.add_argument("--record", metavar="FILE", help="also write every event to this trace file")
    p.add_argument("--topology", metavar="PRESET", help=TOPOLOGY_HELP + " (default: this machine's NVML, if any)")
    p.add_argument("--hang-after", type=float, default=10.0, metavar="S",
                   help="seconds in one op before a rank shows as hung")
    p.add_argument("--metrics", type=metrics_addr, metavar="HOST:PORT", help=METRICS_HELP)
    p.add_argument("--connect", metavar="ADDR", nargs="?", const="",
                   help="open the dashboard on a running `commviz serve` instead of listening here: the address "
                        "its ranks use (ipc://…, tcp://…; none: the default socket) on this machine, or its "
                        "--http HOST:PORT from anywhere; its token from COMMVIZ_TOKEN")


def run(args, cmd: list[str]) -> int:
    if args.connect is not None:
        return connect(args, cmd)
    return watch(cmd, listen=args.listen, record_to=args.record, topology=args.topology,
                 hang_after_s=args.hang_after, metrics=args.metrics)


def watch(cmd: list[str], listen: str | None = None, record_to: str | None = None, topology: str | None = None,
          hang_after_s: float = 10.0, title: str = "commviz watch", metrics: tuple[str, int] | None = None) -> int:
    """The dashboard on a collector of its own (commands/_collector.py: `commviz
    serve` in a child process, so drawing never waits for ingest's GIL), and the job
    when there is one."""
    from commviz.commands._collector import SpawnedCollector, SpawnedFeed
    from commviz.errors import CommvizError
    from commviz.transport.address import AddressError

    topo = topology_option(topology, local=True)
    try:
        addr = listen_addr(listen, f"watch-{os.getpid()}.sock" if cmd else None)
        token(addr)  # a TCP listener's, made here: the collector, this view and the job inherit it
        ring_dir = new_ring_dir() if cmd else None
    except (AddressError, OSError) as exc:
        raise CommvizError(str(exc)) from exc
    feed = SpawnedFeed(SpawnedCollector(addr, record_to, hang_after_s, metrics, ring_dir, topology=topology))
    job = None
    try:
        if cmd:
            # Ranks capture stacks of ops stuck half the hang threshold (at most 3 s).
            job = launch.Job(cmd, feed.addr, stack_after_s=max(0.5, min(3.0, hang_after_s / 2)), ring_dir=ring_dir,
                             log=True)
            job.start()
    except BaseException:
        feed.close()
        raise
    return run_app(feed, title, job, topology=topo, simulate=bool(topology))


def connect(args, cmd: list[str]) -> int:
    """The dashboard as a client: the collector ingests in its own process, this one
    only draws (commviz/viewlink.py)."""
    from commviz.errors import CommvizError
    from commviz.viewlink import RemoteFeed

    clash = [o for o, v in (("-- CMD", cmd), ("--listen", args.listen), ("--record", args.record),
                            ("--metrics", args.metrics)) if v]
    if clash:
        raise CommvizError(f"--connect opens a view on a collector that runs elsewhere; {', '.join(clash)} "
                           "belong to that collector (`commviz serve …`)")
    if "web_driver" in os.environ.get("TEXTUAL_DRIVER", ""):
        exit_with_parent()  # a browser tab's view (commviz web) must not outlive the page's server
    feed = RemoteFeed(args.connect or None, token=os.environ.get("COMMVIZ_TOKEN"))
    topo = topology_option(args.topology) if args.topology else feed.topology
    return run_app(feed, f"commviz · {feed.title}", topology=topo, simulate=bool(args.topology))


def exit_with_parent(every_s: float = 1.0) -> None:
    """End this process once its parent is gone. textual-serve feeds a tab's app
    through pipes; if `commviz web` is killed, the orphaned app read its closed stdin
    in a busy loop (three of them took ~45 % of a core each here, for as long as
    nobody noticed)."""
    import threading
    import time

    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(0)

    threading.Thread(target=watch_parent, name="commviz-parent", daemon=True).start()


COMMAND = Command(
    "watch", "dashboard on live events; with -- CMD it also launches the job", add_arguments, run,
    description="Dashboard on live events. Ranks that call commviz.instrument() (or run under "
    "`watch -- CMD`) connect by themselves.",
    takes_cmd=True,
)
