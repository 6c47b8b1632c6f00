"""A running collector's state over HTTP, for scripts, cron and CI: `GET /summary`
is the `commviz summary --json` document of everything seen so far, computed now;
`GET /diagnoses` only its diagnoses. Each request takes the model's lock for one
summary (the dashboard's snapshot does the same), so a scrape never slows ingest
for longer than one snapshot; requests are served one at a time, in a thread of
their own.

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
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from commviz.errors import CommvizError
from commviz.transport.address import is_loopback

def loopback_host(host: str) -> bool:
    """A bare host (name, IPv4 or IPv6) that only this machine reaches."""
    return is_loopback(f"tcp://[{host}]:0" if ":" in host else f"tcp://{host}:0")


class StateServer:
    """`feed`: the LiveFeed (its `lock` and `model`). `extra`: path -> (content type,
    () -> bytes) for other views of the same model (Prometheus' /metrics). `views`: a
    `viewlink.ViewSource` answering /view and /view/hello for remote dashboards."""

    def __init__(self, feed, host: str, port: int, token: str | None = None, extra: dict | None = None,
                 views=None, loopback_token: str | None = None) -> None:
        """`token`: the collector's (COMMVIZ_TOKEN), wanted off loopback; `loopback_token`:
        the view's own, wanted everywhere (on loopback, either does; with neither,
        loopback is open)."""
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
        self.requests = 0
        handler = self._handler()
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
            self.httpd.daemon_threads = True
        except OSError as exc:
            raise CommvizError(f"cannot serve HTTP on {host}:{port} ({exc.strerror or exc}): pick another port "
                               f"(--http {host}:{port + 1})") from None
        self.host, self.port = self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="commviz-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> StateServer:
        self.thread.start()
        return self

    def close(self) -> None:
        if self.thread.is_alive():  # (shutdown waits for a serving loop: one never started would never answer)
            self.httpd.shutdown()
        self.httpd.server_close()

    def summary(self) -> dict:
        """The summary document now, and for a live collector an `ingest` part: how
        far behind it is and what it sheds, so a script sees a collector that keeps
        counts exact but has stopped timing (`commviz summary --live --json`)."""
        feed = self.feed
        with feed.lock:
            doc = feed.model.summary(time.time_ns())
            counts = getattr(feed, "ingest_counts", None)  # a live feed's (not attach's rounds)
            if counts is not None:
                doc["ingest"] = {**dataclasses.asdict(counts()), "shed_instances": feed.model.shed_ops}
            return doc

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # no stderr line per request
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.requests += 1
                url = urlparse(self.path)
                if server.tokens and url.path not in server.open_paths:
                    given = parse_qs(url.query).get("token", [""])[0]
                    auth = self.headers.get("Authorization", "")
                    if auth.startswith("Bearer "):
                        given = auth[7:]
                    if not any([hmac.compare_digest(given.encode(), t) for t in server.tokens]):
                        return self._send(401, "text/plain", b"a token is needed: Authorization: Bearer TOKEN "
                                          b"(this user's own collectors: commviz finds it by itself)\n")
                if url.path in ("/summary", "/summary.json"):
                    return self._send(200, "application/json", json.dumps(server.summary()).encode())
                if url.path == "/diagnoses":
                    return self._send(200, "application/json", json.dumps(server.summary()["diagnoses"]).encode())
                if server.views is not None and url.path == "/view":
                    from commviz.viewlink import CONTENT_TYPE

                    return self._send(200, CONTENT_TYPE, server.views.view(url.query))
                if server.views is not None and url.path == "/view/hello":
                    from commviz.viewlink import CONTENT_TYPE

                    return self._send(200, CONTENT_TYPE, server.views.hello())
                if url.path in server.extra:
                    ctype, body = server.extra[url.path]
                    return self._send(200, ctype, body())
                paths = ", ".join(["/summary", "/diagnoses", *(["/view"] if server.views else []), *server.extra])
                return self._send(404, "text/plain", f"no such view; there are: {paths}\n".encode())

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


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
