"""`commviz watch [-- CMD…]`: the dashboard on live events; with `-- CMD` it also
launches the job (its output goes to a log file: the dashboard owns the terminal)."""

from __future__ import annotations

import os

from commviz import launch
from commviz.commands._dashboard import run_app, topology_option
from commviz.commands._live import open_feed
from commviz.commands.base import TOPOLOGY_HELP, Command


def add_arguments(p) -> None:
    p.add_argument("--listen", metavar="ADDR", help="ipc:///path or tcp://host:port (default: per-user socket)")
    p.add_argument("--record", metavar="FILE", help="also write every event to this trace file")
    p.add_argument("--topology", metavar="PRESET", help=TOPOLOGY_HELP + " (default: this machine's NVML, if any)")
    p.add_argument("--hang-after", type=float, default=10.0, metavar="S",
                   help="seconds in one op before a rank shows as hung")


def run(args, cmd: list[str]) -> int:
    return watch(cmd, listen=args.listen, record_to=args.record, topology=args.topology,
                 hang_after_s=args.hang_after)


def watch(cmd: list[str], listen: str | None = None, record_to: str | None = None, topology: str | None = None,
          hang_after_s: float = 10.0, title: str = "commviz watch") -> int:
    topo = topology_option(topology, local=True)
    private = f"watch-{os.getpid()}.sock" if cmd else None
    feed, ring_dir = open_feed(listen, private, record_to, hang_after_s, with_rings=bool(cmd))
    job = None
    if cmd:
        # Ranks capture stacks of ops stuck half the hang threshold (at most 3 s).
        job = launch.Job(cmd, feed.addr, stack_after_s=max(0.5, min(3.0, hang_after_s / 2)), ring_dir=ring_dir,
                         log=True)
        try:
            job.start()
        except BaseException:
            feed.close()
            raise
    return run_app(feed, title, job, topology=topo, simulate=bool(topology))


COMMAND = Command(
    "watch", "dashboard on live events; with -- CMD it also launches the job", add_arguments, run,
    description="Dashboard on live events. Ranks that call commviz.instrument() (or run under "
    "`watch -- CMD`) connect by themselves.",
    takes_cmd=True,
)
