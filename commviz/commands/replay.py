"""`commviz replay FILE_OR_DIR`: the dashboard on a recorded trace."""

from __future__ import annotations

import os

from commviz.commands._dashboard import run_app, topology_option
from commviz.commands._trace import add_path_arguments, open_stream
from commviz.commands.base import TOPOLOGY_HELP, Command
from commviz.errors import CommvizError


def add_arguments(p) -> None:
    add_path_arguments(p)
    p.add_argument("--speed", type=float, default=None,
                   help="playback speed, 0.001 to 16 (default: 1, or slower for a trace under 10 s, "
                   "so that it lasts about 10 s)")
    p.add_argument("--topology", metavar="PRESET", help=TOPOLOGY_HELP)


def run(args, cmd: list[str]) -> int:
    from commviz.tui.feed import ReplayFeed

    topology = topology_option(args.topology)
    # Read as it plays, never whole: the first pass (frame heads and hellos) and each
    # rank's last frame, then the dashboard; an index of seek checkpoints is built
    # beside it (trace/seek.py).
    stream = open_stream(args.path, rank_map=args.rank_map)
    if not stream.ranks:
        raise CommvizError(f"{args.path}: no events to replay")
    feed = ReplayFeed(stream, cut_off=stream.truncated, snapshot=stream.snapshot, speed=args.speed,
                      name=os.path.basename(str(args.path).rstrip("/")))
    if feed.done:
        feed.close()
        raise CommvizError(f"{args.path}: no events to replay")
    return run_app(feed, f"commviz replay {os.path.basename(str(args.path))}", topology=topology,
                   simulate=topology is not None)


COMMAND = Command("replay", "dashboard on a recorded trace", add_arguments, run)
