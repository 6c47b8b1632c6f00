"""`commviz relay [--to tcp://host:port]`: one per node of a multi-node job. The
node's ranks connect to it as to a watcher (the default per-user socket, no setup
on the ranks); it forwards their events to the central `commviz watch --listen
tcp://…` with the token, gathered per rank (transport/relay.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading

from commviz.commands.base import Command
from commviz.errors import CommvizError

STATUS_EVERY_S = 5.0


def add_arguments(p) -> None:
    p.add_argument("--to", metavar="tcp://HOST:PORT", default=os.environ.get("COMMVIZ_RELAY_TO"),
                   help="the central watcher (`commviz watch --listen tcp://0.0.0.0:PORT` there); "
                        "default $COMMVIZ_RELAY_TO")
    p.add_argument("--listen", metavar="ADDR", help="where this node's ranks connect (default: per-user socket)")


def run(args, cmd: list[str]) -> int:
    from commviz.commands._live import listen_addr, token
    from commviz.transport.address import AddressError, parse
    from commviz.transport.relay import Relay

    if not args.to:
        raise CommvizError("relay needs the central watcher: commviz relay --to tcp://HOST:PORT "
                           "(start it there with: commviz watch --listen tcp://0.0.0.0:PORT)")
    try:
        if parse(args.to)[0] != "tcp":
            raise CommvizError(f"--to {args.to}: a relay forwards to another machine, give tcp://HOST:PORT")
        tok = os.environ.get("COMMVIZ_TOKEN")
        if not tok:  # every TCP listener wants its token (transport/token.py)
            raise CommvizError("set COMMVIZ_TOKEN to the token the central watcher printed "
                               "(export COMMVIZ_TOKEN=…), then start the relay again")
        listen = listen_addr(args.listen)
        relay = Relay(listen, args.to, token=tok, listen_token=token(listen)).start()
    except (AddressError, OSError) as exc:
        raise CommvizError(str(exc)) from exc
    print(f"commviz relay: ranks on this node connect to {relay.addr}; forwarding to {args.to}", file=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(STATUS_EVERY_S):
            print(f"commviz relay: {relay.status()}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        relay.close()
        print(f"commviz relay: {relay.status()}", file=sys.stderr)
    return 0


COMMAND = Command("relay", "one per node: local ranks connect to it, it forwards to the central watcher",
                  add_arguments, run)
