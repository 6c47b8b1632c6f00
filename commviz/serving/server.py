"""One asyncio HTTP server for a collector's every face (/summary, /diagnoses, /view,
/metrics), on aiohttp's low-level server, in one thread of its own.

What it replaced, http.server's ThreadingHTTPServer, started a thread per connection
and never timed one out: 2,000 connections that sent half a request and sat cost
2,010 threads, and a legitimate client waited behind them. Here a connection is a
socket and a few objects on one event loop; guard.py caps how many are open and
closes idle ones past a deadline; complaints.py counts what clients get wrong.

Work that reads the model (a summary, a view's snapshot, a scrape) runs on one of two
single-thread lanes, so the loop keeps accepting, timing out and refusing while the
model's lock is held, and views (which pace themselves, viewlink.ViewSource) never
hold up a summary. The threads are three, however many clients come."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable

from aiohttp import web

from commviz.serving.complaints import AiohttpLog, Complaints, Kind, kind_of_status
from commviz.serving.guard import Guard, Why

SWEEP_S = 0.5  # how often idle connections are checked against their deadline
MAX_LINE = 4096  # request line and each header line, bytes
MAX_HEADERS = 64
BACKLOG = 1024  # the kernel's queue of connections not yet accepted
STOP_S = 2.0


class Lane(enum.Enum):
    """The thread a deferred answer is made on."""

    STATE = "state"  # summaries, diagnoses, scrapes: short, under the model's lock
    VIEW = "view"  # dashboards' snapshots, paced by their own budget


@dataclasses.dataclass(frozen=True)
class Ask:
    """A request, as much of it as an answer needs."""

    method: str
    path: str
    query: str
    authorization: str
    site: str  # the name of the listening address it came in on


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes


@dataclasses.dataclass(frozen=True)
class Later:
    """An answer to be made on a lane's thread (it takes the model's lock)."""

    make: Callable[[], Reply]
    lane: Lane


Answer = Callable[[Ask], "Reply | Later"]


@dataclasses.dataclass(frozen=True)
class Site:
    name: str
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def listening_socket(host: str, port: int) -> socket.socket:
    """Bound and listening now, so the caller learns of a taken port at once and the
    kernel queues clients until the loop serves them. Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class HttpServer:
    """`answer(ask)` decides on the loop (cheap: tokens, paths, errors) and returns a
    `Reply`, or a `Later` whose `make` runs on a lane. It may raise nothing; an
    exception is a 500, counted and said once a minute with its traceback."""

    def __init__(self, answer: Answer, say: Callable[[str], None] | None = None, cap: int | None = None,
                 deadline_s: float | None = None, clock=time.monotonic) -> None:
        self.answer = answer
        self.clock = clock
        say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.complaints = Complaints(say, clock=clock)
        self.guard = Guard(**{k: v for k, v in (("cap", cap), ("deadline_s", deadline_s)) if v is not None})
        self.requests = 0
        self.sites: list[Site] = []
        self._lanes = {lane: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"commviz-http-{lane.value}")
                       for lane in Lane}
        self._log = logging.Logger("commviz.http.aiohttp")  # not aiohttp's global logger
        self._log.addHandler(AiohttpLog(self.complaints, say))
        self._loop = asyncio.new_event_loop()
        self._transports: dict = {}  # aiohttp's protocol -> its transport, to close it
        self._thread = threading.Thread(target=self._run, name="commviz-http", daemon=True)
        self._thread.start()
        self._runner = self._call(self._setup())
        self._sweeper = None
        self._loop.call_soon_threadsafe(self._sweep)

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _setup(self):
        server = GuardedServer(self, self._handle, logger=self._log, access_log=None,
                                keepalive_timeout=self.guard.deadline_s, max_line_size=MAX_LINE,
                                max_field_size=MAX_LINE, max_headers=MAX_HEADERS)
        runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=STOP_S)
        await runner.setup()
        return runner

    def listen(self, sock: socket.socket, name: str = "http") -> Site:
        """Serve on an already listening socket (`listening_socket`)."""
        async def start() -> None:
            await web.SockSite(self._runner, sock).start()

        self._call(start())
        host, port = sock.getsockname()[:2]
        site = Site(name, host, port)
        self.sites.append(site)
        return site

    def close(self) -> None:
        if not self._loop.is_running():
            return
        try:
            self._call(self._runner.cleanup(), timeout=STOP_S * 2)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_S)
        for pool in self._lanes.values():
            pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------- connections
    def opened(self, proto, transport) -> None:
        self._transports[proto] = transport
        for victim, why in self.guard.opened(proto, self.clock()):
            self._drop(victim, why)

    def closed(self, proto) -> None:
        self._transports.pop(proto, None)
        self.guard.closed(proto)

    def _drop(self, proto, why: Why) -> None:
        t = self._transports.pop(proto, None)
        self.complaints.count(Kind(why.value), f"{self._peer(t)}; {len(self.guard)} connections open")
        if t is not None:
            t.abort()

    @staticmethod
    def _peer(transport) -> str:
        try:
            p = transport.get_extra_info("peername")
            return f"from {p[0]}" if p else "from ?"
        except Exception:
            return "from ?"

    def _sweep(self) -> None:
        for proto, why in self.guard.expired(self.clock()):
            self._drop(proto, why)
        self._sweeper = self._loop.call_later(SWEEP_S, self._sweep)

    # ----------------------------------------------------------- requests
    async def _handle(self, request):
        self.requests += 1
        proto = request.protocol
        self.guard.asked(proto)
        try:
            reply = await self._reply(request)
        finally:
            self.guard.answered(proto, self.clock())
        kind = kind_of_status(reply.status)
        if kind is not None and reply.status < 500:  # (ours were counted where they were raised)
            self.complaints.count(kind, f"{request.method} {request.path[:80]} {self._peer(request.transport)}")
        return web.Response(status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type})

    async def _reply(self, request) -> Reply:
        if request.method not in ("GET", "HEAD"):
            return Reply(405, "text/plain", b"only GET is answered here\n")
        site = next((s.name for s in self.sites if s.port == _local_port(request)), "http")
        ask = Ask(request.method, request.path, request.query_string, request.headers.get("Authorization", ""), site)
        try:
            got = self.answer(ask)
            if isinstance(got, Later):
                got = await self._loop.run_in_executor(self._lanes[got.lane], got.make)
            return got
        except Exception:
            self._log.exception("answering %s", request.path)
            return Reply(500, "text/plain", b"the collector failed to answer: see its log\n")


def _local_port(request) -> int | None:
    try:
        return request.transport.get_extra_info("sockname")[1]
    except Exception:
        return None


class GuardedServer(web.Server):
    """aiohttp's low-level server, telling its owner of each connection."""

    def __init__(self, owner: HttpServer, handler, **kwargs) -> None:
        super().__init__(handler, **kwargs)
        self._owner = owner

    def connection_made(self, handler, transport) -> None:
        super().connection_made(handler, transport)
        self._owner.opened(handler, transport)

    def connection_lost(self, handler, exc=None) -> None:
        super().connection_lost(handler, exc)
        self._owner.closed(handler)
