"""The dashboard as a client of a collector: `commviz watch --connect HOST:PORT`.

The collector (`commviz serve --http PORT`) answers `GET /view` with one data tick's
reading (`tui.snapshot.Fetched`), taken under its lock exactly as an embedded
dashboard takes it, with the view's own focus, freeze and summary state in the query.
The view asks at its own frame rate and has at most one request out (the update
thread's rule), so a slow view just asks less often: it never queues snapshots on the
collector and never slows ingest for longer than one snapshot. Any number of views
(and scrapes) share one collector; each request is served on a thread of its own.

The body is a pickle (the snapshot is a graph of the model's dataclasses), read back
with an unpickler that builds only commviz's own data types and plain containers
(ownpickle.py): a collector that answers something else gets a clear error, not code
run in the view.
"""

from __future__ import annotations

import io
import pickle
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlparse

from commviz import ownpickle
from commviz.errors import CommvizError

CONTENT_TYPE = "application/x-commviz-view"
PROTOCOL = 2  # the hello's (2: rank rows are `RankRow`s); a view refuses a collector that speaks another
TIMEOUT_S = 5.0


class ViewError(CommvizError):
    pass


class Refused(ViewError):
    """401: the token was not the collector's."""


def tokens_to_try(url: str, given: str | None) -> list[str | None]:
    """The tokens to offer a collector at `url`, in turn: the one this user's own
    collector there left (`local_token`), then the one given (COMMVIZ_TOKEN: another
    user's or machine's collector, or a tunnel to one); [None] when there is neither."""
    out = list(dict.fromkeys(t for t in (local_token(url), given) if t))
    return out or [None]


def loads(data: bytes):
    try:
        return ownpickle.load(io.BytesIO(data))
    except ownpickle.RefusedPickle as exc:
        raise ViewError(f"the collector's answer {exc}: is that a commviz collector of this version?") from None
    except Exception as exc:  # a truncated or foreign body: say so, do not crash the view
        raise ViewError(f"the collector's answer could not be read ({type(exc).__name__}: {exc})") from None


def dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


@dataclass(frozen=True)
class ViewQuery:
    """What a view asks of each tick: the part of `tui.snapshot.fetch`'s arguments
    that belongs to the view, not to the collector."""

    focus: int | None = None
    frozen: bool = False
    simulate: bool = False
    summary_unless: int | None = -1

    def encode(self) -> str:
        q = {"frozen": int(self.frozen), "simulate": int(self.simulate)}
        if self.focus is not None:
            q["focus"] = self.focus
        if self.summary_unless is not None:
            q["summary_unless"] = self.summary_unless
        return urlencode(q)

    @classmethod
    def decode(cls, query: str) -> "ViewQuery":
        q = {k: v[0] for k, v in parse_qs(query).items()}

        def num(key: str) -> int | None:
            v = q.get(key)
            return int(v) if v is not None and v.lstrip("-").isdigit() else None

        return cls(focus=num("focus"), frozen=q.get("frozen") == "1", simulate=q.get("simulate") == "1",
                   summary_unless=num("summary_unless"))


SHARE_S = 0.1  # views asking the same within this share one snapshot (they ask at 4 Hz)
KEEP_S = 10.0  # the latest answer to each question is kept this long (while the budget is spent)
KEEP_MAX = 64  # and for this many questions at most (at 1,024 ranks ~240 KB each)
# The share of the collector's time that views' snapshots may take, all views together:
# after a snapshot that took `c`, the next waits until c / VIEW_SHARE has passed since
# it began. One view at 4 Hz never waits (1,024 ranks: ~40 ms a snapshot and its
# pickle, 16 %); many views with foci of their own ask less often each, and ingest,
# which shares the collector's GIL, keeps the rest.
VIEW_SHARE = 0.25


class ViewSource:
    """The collector's side: turns a view's query into one `Fetched`, with the
    collector's topology (`topology`, `hosts` as the embedded dashboard has them).

    Views that ask the same question within `SHARE_S` of each other get the same
    answer: a room of people watching one job costs the collector one snapshot a
    tick, not one each (at 1,024 ranks a snapshot and its pickle are ~40 ms); and
    snapshots together take at most `VIEW_SHARE` of its time, however many views ask
    different questions: past that a view gets the latest answer to its question
    (fresher when the budget allows), and only a view asking for the first time
    waits for one."""

    def __init__(self, feed, topology=None, hosts=None, title: str = "commviz serve",
                 clock=time.monotonic, sleep=time.sleep) -> None:
        import threading

        self.feed, self.topology, self.hosts, self.title = feed, topology, hosts, title
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()  # one snapshot at a time; the others wait and share it
        self._last: dict[ViewQuery, tuple[float, bytes]] = {}
        self._next_at = 0.0  # the next snapshot may begin then (VIEW_SHARE)
        self.taken = 0  # snapshots taken (the rest of the answers were shared)
        self.waited_s = 0.0  # how long first questions were held back for VIEW_SHARE
        self.stale = 0  # answers given again while the budget was spent

    def hello(self) -> bytes:
        return dumps({"protocol": PROTOCOL, "title": self.title, "topology": self.topology})

    def view(self, query: str) -> bytes:
        from commviz.tui.snapshot import fetch

        q = ViewQuery.decode(query)
        asked = self._clock()
        with self._lock:
            now = self._clock()
            hit = self._last.get(q)
            # made since it was asked (while it waited for the lock), or just before
            if hit is not None and hit[0] >= asked - SHARE_S:
                return hit[1]
            if now < self._next_at:
                if hit is not None:  # the budget is spent: the latest answer to this question
                    self.stale += 1
                    return hit[1]
                self._sleep(self._next_at - now)  # a first question waits (the lock held: one at a time)
                self.waited_s += self._next_at - now
                now = self._clock()
            body = dumps(fetch(self.feed, q.focus, self.topology, q.frozen, q.simulate,
                               summary_unless=q.summary_unless, hosts=self.hosts))
            done = self._clock()
            self._next_at = now + (done - now) / VIEW_SHARE
            self.taken += 1
            kept = sorted(((t, k) for k, (t, _) in self._last.items() if done - t < KEEP_S and k != q), reverse=True)
            self._last = {k: self._last[k] for _, k in kept[:KEEP_MAX - 1]}
            self._last[q] = (done, body)
            return body


def note_path(listen_addr: str) -> str:
    """Where a collector listening on `listen_addr` writes its HTTP view's URL, so a
    view or a script on this machine can be given the address the ranks use: next to
    an ipc socket, or in the per-user directory for a TCP port."""
    import os

    from commviz.transport.address import parse, private_dir

    kind, rest = parse(listen_addr)
    if kind == "ipc":
        return rest + ".http"
    return os.path.join(private_dir(), f"collector-{rest.rsplit(':', 1)[1]}.http")


def write_note(listen_addr: str, url: str) -> str:
    path = note_path(listen_addr)
    with open(path, "w") as f:
        f.write(url + "\n")
    return path


def _token_name(url: str) -> str | None:
    """`view-<host>-<port>.token` for a loopback `url` (None for any other): named by
    the exact host, so a token is offered only where its collector answered."""
    from commviz.httpview import loopback_host

    u = urlparse(url if "://" in url else f"http://{url}")
    host = (u.hostname or "").lower()
    if u.port is None or not loopback_host(host):
        return None
    return f"view-{host.replace(':', '_')}-{u.port}.token"


def token_path(url: str) -> str | None:
    """Where this user's collector whose HTTP view answers at `url` keeps that view's
    token (None where `url` is not on this machine's loopback): in the per-user 0700
    directory, so a view or script of the same user finds it, and no other user can.
    Loopback is no trust boundary (transport/token.py): the view carries stacks,
    hosts and paths, so it wants a token there too. Raises AddressError (its words
    name the fix) where the per-user directory is not private."""
    import os

    from commviz.transport.address import private_dir

    name = _token_name(url)
    return None if name is None else os.path.join(private_dir(), name)


def _token_dirs() -> list[str]:
    """The per-user directories a collector of this user may have kept a token in:
    `$XDG_RUNTIME_DIR/commviz-UID` (or systemd's `/run/user/UID`) and the temp dir's
    `commviz-UID` (a collector started from a login session, a script from cron, which
    has no XDG_RUNTIME_DIR), each only if it is private."""
    import os
    import tempfile

    from commviz.transport.address import AddressError, check_private_dir, user_dir_in

    bases = [os.environ.get("XDG_RUNTIME_DIR") or "", f"/run/user/{os.getuid()}", tempfile.gettempdir()]
    out = []
    for base in dict.fromkeys(b for b in bases if b and os.path.isdir(b)):
        d = user_dir_in(base)
        try:
            check_private_dir(d)
        except (AddressError, OSError):
            continue
        out.append(d)
    return out


def write_token(url: str, token: str) -> str:
    """Keep the view's token where `local_token` finds it: written whole to a new 0600
    file, then renamed into place (a reader never sees half of it). Its path; raises
    AddressError or OSError where it cannot be kept."""
    import os

    path = token_path(url)
    if path is None:
        raise ValueError(f"{url} is not on loopback")
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return path


def local_token(url: str) -> str | None:
    """The token this user's collector answering at `url` left (`write_token`), if any."""
    import os

    name = _token_name(url)
    if name is None:
        return None
    for d in _token_dirs():
        try:
            fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                token = f.read().strip()
        except OSError:
            continue
        if token:
            return token
    return None


def resolve(addr: str | None) -> str:
    """A collector's HTTP view from what the user gave: its URL, HOST:PORT or PORT of
    `--http`, or the address its ranks connect to (ipc://…, tcp://…; none: the
    per-user default socket), read from the note the collector left."""
    from commviz.transport.address import AddressError, default_addr

    default = addr is None or addr == default_addr()
    addr = addr or default_addr()
    if not addr.startswith(("ipc://", "tcp://")):
        return addr if "://" in addr else f"http://{addr if ':' in addr else '127.0.0.1:' + addr}"
    try:
        path = note_path(addr)
        with open(path) as f:
            url = f.read().strip()
    except AddressError as exc:
        raise ViewError(str(exc)) from None
    except OSError:
        start = "commviz serve" if default else f"commviz serve --listen {addr}"
        raise ViewError(f"no collector on this machine listens on {addr} with a view (no {path}): start one with "
                        f"`{start}`, or give its --http HOST:PORT") from None
    if not url.startswith("http://"):
        raise ViewError(f"{path} does not hold a collector's URL")
    return url


class RemoteFeed:
    """The view's side: a `Feed` whose `fetch` asks a collector over HTTP. It holds
    no model. A collector that stops answering leaves the last snapshot on screen
    and says so on the status line; the view asks again on the next tick."""

    def __init__(self, url: str | None, token: str | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self.url = resolve(url).rstrip("/")
        if urlparse(self.url).path not in ("", "/"):
            self.url = self.url.rsplit("/", 1)[0]
        self.timeout_s = timeout_s
        self.model = None
        self.lock = None
        self.failures = 0
        self._last_ok = time.monotonic()
        from commviz.tui.snapshot import ModelInfo

        self._info = ModelInfo()
        self._given = token
        tokens = tokens_to_try(self.url, token)
        for self.token in tokens:
            try:
                hello = loads(self._get("/view/hello"))
                break
            except Refused:
                if self.token == tokens[-1]:
                    raise
        if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
            raise ViewError(f"{self.url} speaks view protocol {getattr(hello, 'get', lambda k: None)('protocol')}, "
                            f"this commviz speaks {PROTOCOL}: run the same commviz version on both sides")
        self.title = str(hello.get("title") or "commviz")
        self.topology = hello.get("topology")

    def _get(self, path: str) -> bytes:
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": f"Bearer {self.token}"} if self.token else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return r.read()
        except urllib.error.HTTPError as exc:
            hint = (" (another user's or machine's collector: set COMMVIZ_TOKEN to its token)"
                    if exc.code == 401 else "")
            if exc.code == 404:
                hint = " (is it a commviz collector started with --http?)"
            raise (Refused if exc.code == 401 else ViewError)(f"{self.url}{path}: {exc.code} {exc.reason}{hint}") \
                from None
        except (urllib.error.URLError, OSError) as exc:
            raise ViewError(f"no collector answers at {self.url} ({getattr(exc, 'reason', exc)}): start one with "
                            "`commviz serve`") from None

    # Feed protocol ---------------------------------------------------------
    def now_ns(self) -> int:
        return time.time_ns()

    def advance(self) -> None:
        pass

    def status(self) -> str:
        return f"connected to {self.url}"

    def fetch(self, query: ViewQuery):
        """One tick's `Fetched` from the collector; when it does not answer, a
        `Fetched` with no snapshot (the view keeps what it shows) and the reason."""
        from commviz.tui.snapshot import Fetched

        try:
            try:
                got = loads(self._get("/view?" + query.encode()))
            except Refused:  # the collector came back with a new token: this user's own, left anew
                fresh = [t for t in tokens_to_try(self.url, self._given) if t != self.token]
                if not fresh:
                    raise
                self.token = fresh[0]
                got = loads(self._get("/view?" + query.encode()))
            if not isinstance(got, Fetched):
                raise ViewError(f"{self.url}/view answered a {type(got).__name__}, not a snapshot")
        except ViewError as exc:  # on the update thread: said on the status line, never raised there
            self.failures += 1
            gone = time.monotonic() - self._last_ok
            return Fetched(time.time_ns(), f"collector lost {gone:.0f} s ago: {exc}", self._info, None)
        self._last_ok = time.monotonic()
        self._info = got.info
        got.status = f"view of {self.url} · {got.status}"
        return got

    def close(self) -> None:
        pass
