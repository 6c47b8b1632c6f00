"""`commviz web [--connect ADDR]`: the dashboard in a browser. Each browser tab runs
its own `commviz watch --connect` on the same collector (textual-serve starts one per
tab and draws it with xterm.js), so a tab is a view like any other: it never slows
ingest, and closing it leaves the collector running.

Bound to 127.0.0.1 unless `--host` says otherwise, and the page wants a token either
way, given once as `?token=TOKEN` (then kept in a cookie for the page's websocket):
on 127.0.0.1 one made up at start and printed in the page's address (any user on the
machine can reach 127.0.0.1, and the page runs a dashboard as you); on any other
address the collector's (COMMVIZ_TOKEN)."""

from __future__ import annotations

import hmac
import os
import shlex
import socket
import sys

from commviz.commands.base import Command
from commviz.errors import CommvizError

DEFAULT_PORT = 8566
COOKIE = "commviz_token_{port}"  # by port: a browser sends a host's cookies to all its ports


def add_arguments(p) -> None:
    p.add_argument("--connect", metavar="ADDR", default=None,
                   help="the collector: the address its ranks use (ipc://…, tcp://…; default: the per-user socket) "
                        "or its --http HOST:PORT")
    p.add_argument("--host", default="127.0.0.1", help="where the web page listens (default 127.0.0.1: this machine "
                   "only; another address needs the collector's token)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"its port (default {DEFAULT_PORT})")


def command_line(url: str) -> str:
    """What each browser tab runs: a dashboard on the collector at `url`."""
    return shlex.join([sys.executable, "-m", "commviz.cli", "watch", "--connect", url])


def run(args, cmd: list[str]) -> int:
    try:
        from textual_serve.server import Server
    except ImportError as exc:
        raise CommvizError("commviz web needs textual-serve: pip install 'commviz[web]' "
                           "(or pip install textual-serve)") from exc
    from commviz.httpview import loopback_host
    from commviz.transport.token import make_token
    from commviz.viewlink import RemoteFeed

    token = os.environ.get("COMMVIZ_TOKEN")
    public = not loopback_host(args.host)
    if public and not token:
        raise CommvizError(f"--host {args.host} lets other machines in: set COMMVIZ_TOKEN to the collector's token "
                           "(they then open the page with ?token=TOKEN), or keep the default 127.0.0.1 and "
                           "tunnel (ssh -L)")
    feed = RemoteFeed(args.connect, token=token)  # fail here, once, not in every tab
    # the page names its scripts and websocket by this URL: a browser elsewhere cannot reach 0.0.0.0
    shown = socket.getfqdn() if args.host in ("0.0.0.0", "::", "") else args.host
    page_token = token if public else make_token()
    server = _server_class(Server, page_token, args.port)(command_line(feed.url), host=args.host, port=args.port,
                                               title="commviz", public_url=f"http://{shown}:{args.port}")
    print(f"commviz web: the dashboard of {feed.url} at {server.public_url}"
          + ("/?token=… (COMMVIZ_TOKEN)" if public else f"/?token={page_token}"), flush=True)
    server.serve()
    return 0


def _server_class(base, token: str, port: int):
    """textual-serve's Server, with the token checked before any page or websocket."""
    from aiohttp import web

    cookie = COOKIE.format(port=port)

    @web.middleware
    async def check(request, handler):
        given = request.query.get("token") or request.cookies.get(cookie, "")
        if not hmac.compare_digest(given.encode(), token.encode()):
            return web.Response(status=401, text="a token is needed: open this page with ?token=TOKEN\n")
        response = await handler(request)
        if request.query.get("token") and isinstance(response, web.Response):
            response.set_cookie(cookie, given, httponly=True, samesite="Strict")
        return response

    class TokenServer(base):
        async def _make_app(self):
            app = await super()._make_app()
            app.middlewares.append(check)
            return app

    return TokenServer


COMMAND = Command("web", "the dashboard in a browser, one view per tab, on a running collector (textual-serve)",
                  add_arguments, run, description=__doc__)
