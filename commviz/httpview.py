"""A running collector's state over HTTP, for scripts, cron and CI: `GET /summary`
is the `commviz summary --json` document of everything seen so far, computed now;
`GET /diagnoses` only its diagnoses; `/view` answers remote dashboards, `/metrics`
Prometheus. Each request takes the model's lock for one summary (the dashboard's
snapshot does the same), so a scrape never slows ingest for longer than one
snapshot. All of it is one asyncio server (serving/server.py): a connection cap,
deadlines, bounded requests, and clients' errors counted rather than logged each.

Bound to 127.0.0.1 unless told otherwise. On any other address a request must carry
the collector's token (`Authorization: Bearer TOKEN` or `?token=TOKEN`), the one
ranks and relays present (transport/token.py). A collector also has a view token of
its own (`loopback_token`), wanted on loopback too: any user on the machine can reach
127.0.0.1, and the views carry stacks, hosts and paths. It keeps that token in the
per-user directory (viewlink.write_token), where the same user's views and scripts
find it. Prometheus' /metrics (the `extra` views) stays open on loopback, as the
`--metrics` endpoint is: counts, no stacks.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import time
from urllib.parse import parse_qs, urlparse

from commviz.errors import CommvizError
from commviz.serving.server import Ask, HttpServer, Lane, Later, Reply, Site, listening_socket
from commviz.transport.address import is_loopback

METRICS_SITE = "metrics"


def loopback_host(host: str) -> bool:
    """A bare host (name, IPv4 or IPv6) that only this machine reaches."""
    return is_loopback(f"tcp://[{host}]:0" if ":" in host else f"tcp://{host}:0")


def bind(host: str, port: int, what: str, flag: str):
    """A listening socket, or a CommvizError that names another port."""
    try:
        return listening_socket(host, port)
    except OSError as exc:
        raise CommvizError(f"cannot serve {what} on {host}:{port} ({exc.strerror or exc}): pick another port "
                           f"({flag} {host}:{port + 1})") from None


class StateServer:
    """`feed`: the LiveFeed (its `lock` and `model`). `extra`: path -> (content type,
    () -> bytes) for other views of the same model (Prometheus' /metrics). `views`: a
    `viewlink.ViewSource` answering /view and /view/hello for remote dashboards."""

    def __init__(self, feed, host: str, port: int, token: str | None = None, extra: dict | None = None,
                 views=None, loopback_token: str | None = None) -> None:
        """`token`: the collector's (COMMVIZ_TOKEN), wanted off loopback; `loopback_token`:
        the view's own, wanted everywhere (on loopback, either does; with neither,
        loopback is open). Binds now (a taken port is a CommvizError here); answers
        from `start`."""
        loopback = loopback_host(host)
        if not loopback and not token:
            raise CommvizError(f"{host}:{port} is not loopback: the HTTP view needs a token there "
                               "(listen on tcp:// so the collector makes one, or bind the HTTP view to 127.0.0.1)")
        self.feed = feed
        wanted = (token, loopback_token) if loopback_token or not loopback else ()
        self.tokens = [t.encode() for t in wanted if t]  # any one of them lets a request in
        self.extra = dict(extra or {})
        self.open_paths = set(self.extra) if loopback else set()  # /metrics, as --metrics asks none
        self.views = views
        self._socks = [("http", bind(host, port, "HTTP", "--http"))]
        self.host, self.port = self._socks[0][1].getsockname()[:2]
        self.http = HttpServer(self._answer)
        self.metrics_site: Site | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def requests(self) -> int:
        return self.http.requests

    def add_metrics(self, host: str, port: int, metrics_path: str = "/metrics") -> str:
        """`--metrics HOST:PORT` on the same server: that address answers only
        /metrics, with no token, as a Prometheus endpoint is scraped. Its URL."""
        if metrics_path not in self.extra:
            raise CommvizError("--metrics needs prometheus-client: pip install 'commviz[metrics]' "
                               "(or pip install prometheus-client)")
        self._socks.append((METRICS_SITE, bind(host, port, "metrics", "--metrics")))
        sock = self._socks[-1][1]
        h, p = sock.getsockname()[:2]
        return f"http://{f'[{h}]' if ':' in h else h}:{p}{metrics_path}"

    def start(self) -> StateServer:
        for name, sock in self._socks:
            self.http.listen(sock, name)
        self._socks = []
        return self

    def close(self) -> None:
        self.http.close()
        for _, sock in self._socks:  # bound, never served
            sock.close()

    def summary(self) -> dict:
        """The summary document now, and for a live collector an `ingest` part: how
        far behind it is and what it sheds, so a script sees a collector that keeps
        counts exact but has stopped timing (`commviz summary --live --json`); and an
        `http` part: this server's requests, open connections and clients' errors."""
        feed = self.feed
        feed.drain()  # every frame that has arrived: taking the lock no longer puts them in
        with feed.lock:
            doc = feed.model.summary(time.time_ns())
            counts = feed.ingest_counts()  # a live feed's (not attach's rounds, not a replay's)
            if counts is not None:
                doc["ingest"] = {**dataclasses.asdict(counts), "shed_instances": feed.model.shed_ops}
        doc["http"] = {"requests": self.http.requests, "connections": len(self.http.guard),
                       "client_errors": self.http.complaints.as_dict()}
        return doc

    # --------------------------------------------------------- answering
    def _answer(self, ask: Ask) -> Reply | Later:
        """On the server's loop: cheap checks here, the model's reads on a lane."""
        if ask.site == METRICS_SITE:
            if ask.path != "/metrics":
                return Reply(404, "text/plain", b"only /metrics is served here\n")
            return self._extra("/metrics")
        if self.tokens and ask.path not in self.open_paths:
            given = parse_qs(ask.query).get("token", [""])[0]
            if ask.authorization.startswith("Bearer "):
                given = ask.authorization[7:]
            if not any([hmac.compare_digest(given.encode(), t) for t in self.tokens]):
                return Reply(401, "text/plain", b"a token is needed: Authorization: Bearer TOKEN "
                             b"(this user's own collectors: commviz finds it by itself)\n")
        if ask.path in ("/summary", "/summary.json"):
            return Later(lambda: _json(self.summary()), Lane.STATE)
        if ask.path == "/diagnoses":
            return Later(lambda: _json(self.summary()["diagnoses"]), Lane.STATE)
        if self.views is not None and ask.path in ("/view", "/view/hello"):
            from commviz.viewlink import CONTENT_TYPE

            views, query = self.views, ask.query
            make = views.hello if ask.path == "/view/hello" else (lambda: views.view(query))
            return Later(lambda: Reply(200, CONTENT_TYPE, make()), Lane.VIEW)
        if ask.path in self.extra:
            return self._extra(ask.path)
        paths = ", ".join(["/summary", "/diagnoses", *(["/view"] if self.views else []), *self.extra])
        return Reply(404, "text/plain", f"no such view; there are: {paths}\n".encode())

    def _extra(self, path: str) -> Later:
        ctype, body = self.extra[path]
        return Later(lambda: Reply(200, ctype, body()), Lane.STATE)


def _json(doc) -> Reply:
    return Reply(200, "application/json", json.dumps(doc).encode())


def fetch_summary(url: str, token: str | None = None, timeout_s: float = 10.0) -> dict:
    """The summary document of the collector at `url` (`http://HOST:PORT`, or its
    /summary)."""
    import urllib.error
    import urllib.request

    from commviz.viewlink import resolve, tokens_to_try

    u = resolve(url)
    tokens = tokens_to_try(u, token)  # this user's own collector's first, then the one given
    if urlparse(u).path in ("", "/"):
        u = u.rstrip("/") + "/summary"
    try:
        for t in tokens:
            req = urllib.request.Request(u, headers={"Authorization": f"Bearer {t}"} if t else {})
            try:
                with urllib.request.urlopen(req, timeout=timeout_s) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as exc:
                if exc.code != 401 or t == tokens[-1]:
                    raise
    except urllib.error.HTTPError as exc:
        raise CommvizError(f"{u}: {exc.code} {exc.reason}" + (" (another user's or machine's collector: set COMMVIZ_TOKEN to its token)" if exc.code == 401 else ""))
    except (urllib.error.URLError, OSError) as exc:
        raise CommvizError(f"no collector answers at {u} ({getattr(exc, 'reason', exc)}): is `commviz serve "
                           "--http …` running there?") from None
    except ValueError as exc:
        raise CommvizError(f"{u} did not answer a summary document ({exc})") from None
