"""The dashboard as a client of a collector: `commviz watch --connect HOST:PORT`.

The collector (`commviz serve --http PORT`) answers `GET /view` with one data tick's
reading (`view.snapshot.Fetched`), taken under its lock exactly as an embedded
dashboard takes it, with the view's own focus, freeze and summary state in the query.
The view asks at its own frame rate and has at most one request out (the update
thread's rule), so a slow view just asks less often: it never queues snapshots on the
collector and never slows ingest for longer than one snapshot. Any number of views
(and scrapes) share one collector.

The body is msgpack, written and read by msgspec against the types themselves:
`[PROTOCOL, payload]`, the payload a `Fetched` (or, for /view/hello, a `ViewHello`)
whose every field is plain typed data (view/snapshot.py). Reading it builds those
types and nothing else, so an answer that is not one (another program, a collector
of another version, a truncated body) is a `ViewError` that says so, never code run
in the view and never a crash on its update thread. The protocol number comes
first, so a view tells a collector of another version from garbage and names the
fix. This is for commviz's views of the same version, not a format for other
programs: scripts read `/summary` and `/metrics`.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlparse

import msgspec

from commviz.errors import CommvizError
from commviz.topo.model import Topology
from commviz.view.feed import ModelFeed, ViewQuery
from commviz.view.snapshot import Fetched, Hosts, ModelInfo, OneTopology

__all__ = ["CONTENT_TYPE", "PROTOCOL", "Refused", "RemoteFeed", "ViewError", "ViewHello", "ViewQuery",
           "ViewSource", "decode", "encode"]

CONTENT_TYPE = "application/x-commviz-view+msgpack"
# Carried first in every body; a view refuses a collector that speaks another
# (2: pickles of the snapshot; 3: msgspec of typed data, alert rows as words).
PROTOCOL = 3
TIMEOUT_S = 5.0


class ViewError(CommvizError):
    pass


class Refused(ViewError):
    """401: the token was not the collector's."""


@dataclass(frozen=True)
class ViewHello:
    """What a view learns once, when it connects: the collector's name for itself and
    the topology it was given (the links panel's capacities)."""

    title: str
    topology: Topology | None = None


def tokens_to_try(url: str, given: str | None) -> list[str | None]:
    """The tokens to offer a collector at `url`, in turn: the one this user's own
    collector there left (`local_token`), then the one given (COMMVIZ_TOKEN: another
    user's or machine's collector, or a tunnel to one); [None] when there is neither."""
    out = list(dict.fromkeys(t for t in (local_token(url), given) if t))
    return out or [None]


_ENCODER = msgspec.msgpack.Encoder()
_ENVELOPE = msgspec.msgpack.Decoder(tuple[int, msgspec.Raw])  # the payload is read once its version is known
_DECODERS = {Fetched: msgspec.msgpack.Decoder(Fetched), ViewHello: msgspec.msgpack.Decoder(ViewHello)}
T = TypeVar("T", Fetched, ViewHello)


def encode(payload: Fetched | ViewHello) -> bytes:
    """A /view or /view/hello body."""
    return _ENCODER.encode((PROTOCOL, payload))


def decode(data: bytes, kind: type[T], where: str = "the collector") -> T:
    """A body read back as `kind`; ViewError, in words that name the fix, for
    anything else."""
    try:
        protocol, payload = _ENVELOPE.decode(data)
    except msgspec.DecodeError as exc:  # (ValidationError too) a foreign or truncated body
        raise ViewError(f"{where}'s answer could not be read ({exc}): is that a commviz collector of this "
                        "version? Run the same commviz version on both sides") from None
    if protocol != PROTOCOL:
        raise ViewError(f"{where} speaks view protocol {protocol}, this commviz speaks {PROTOCOL}: "
                        "run the same commviz version on both sides")
    try:
        return _DECODERS[kind].decode(payload)
    except msgspec.DecodeError as exc:
        raise ViewError(f"{where}'s answer is not a {kind.__name__} ({exc}): is that a commviz collector of "
                        "this version?") from None


SHARE_S = 0.1  # views asking the same within this share one snapshot (they ask at 4 Hz)
KEEP_S = 10.0  # the latest answer to each question is kept this long (while the budget is spent)
KEEP_MAX = 64  # and for this many questions at most (at 1,024 ranks ~390 KB each)
# The share of the collector's time that views' snapshots may take, all views together:
# after a snapshot that took `c`, the next waits until c / VIEW_SHARE has passed since
# it began. One view at 4 Hz never waits (1,024 ranks: ~40 ms a snapshot and its
# encoding, 16 %); many views with foci of their own ask less often each, and ingest,
# which shares the collector's GIL, keeps the rest.
VIEW_SHARE = 0.25


class ViewSource:
    """The collector's side: turns a view's query into one `Fetched`, with the
    collector's topology (`topology`, `hosts` as the embedded dashboard has them).

    Views that ask the same question within `SHARE_S` of each other get the same
    answer: a room of people watching one job costs the collector one snapshot a
    tick, not one each (at 1,024 ranks a snapshot and its encoding are ~40 ms); and
    snapshots together take at most `VIEW_SHARE` of its time, however many views ask
    different questions: past that a view gets the latest answer to its question
    (fresher when the budget allows), and only a view asking for the first time
    waits for one."""

    def __init__(self, feed: ModelFeed, topology: Topology | None = None, hosts: Hosts | None = None,
                 title: str = "commviz serve", clock=time.monotonic, sleep=time.sleep) -> None:
        import threading

        self.feed, self.topology, self.title = feed, topology, title
        self.hosts = hosts if hosts is not None else OneTopology(topology)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()  # one snapshot at a time; the others wait and share it
        self._last: dict[ViewQuery, tuple[float, bytes]] = {}
        self._next_at = 0.0  # the next snapshot may begin then (VIEW_SHARE)
        self.taken = 0  # snapshots taken (the rest of the answers were shared)
        self.waited_s = 0.0  # how long first questions were held back for VIEW_SHARE
        self.stale = 0  # answers given again while the budget was spent

    def hello(self) -> bytes:
        return encode(ViewHello(self.title, self.topology))

    def view(self, query: str) -> bytes:
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
            body = encode(self.feed.fetch(q, self.hosts))
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
    """The view's side: a `Feed` (tui/feed.py) whose `fetch` asks a collector over
    HTTP. It holds no model. A collector that stops answering leaves the last
    snapshot on screen and says so on the status line; the view asks again on the
    next tick."""

    replay = None  # a collector is live: nothing to pause, step or seek

    def __init__(self, url: str | None, token: str | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self.url = resolve(url).rstrip("/")
        if urlparse(self.url).path not in ("", "/"):
            self.url = self.url.rsplit("/", 1)[0]
        self.timeout_s = timeout_s
        self.failures = 0
        self._last_ok = time.monotonic()
        self._info = ModelInfo()
        self._given = token
        tokens = tokens_to_try(self.url, token)
        for self.token in tokens:
            try:
                hello = decode(self._get("/view/hello"), ViewHello, self.url)
                break
            except Refused:
                if self.token == tokens[-1]:
                    raise
        self.title = hello.title or "commviz"
        self.topology = hello.topology

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

    # Feed ------------------------------------------------------------------
    def status(self) -> str:
        return f"connected to {self.url}"

    def fetch(self, query: ViewQuery, hosts: Hosts | None = None) -> Fetched:
        """One tick's `Fetched` from the collector (which places ranks on its own
        topologies: `hosts` is not asked); when it does not answer, or answers
        something unreadable, a `Fetched` with no snapshot (the view keeps what it
        shows) and the reason."""
        try:
            try:
                got = decode(self._get("/view?" + query.encode()), Fetched, f"{self.url}/view")
            except Refused:  # the collector came back with a new token: this user's own, left anew
                fresh = [t for t in tokens_to_try(self.url, self._given) if t != self.token]
                if not fresh:
                    raise
                self.token = fresh[0]
                got = decode(self._get("/view?" + query.encode()), Fetched, f"{self.url}/view")
        except ViewError as exc:  # on the update thread: said on the status line, never raised there
            self.failures += 1
            gone = time.monotonic() - self._last_ok
            return Fetched(time.time_ns(), f"collector lost {gone:.0f} s ago: {exc}", self._info, None)
        self._last_ok = time.monotonic()
        self._info = got.info
        got.status = f"view of {self.url} · {got.status}"
        return got

    def note_stop(self, by: str, reason: str = "", after_s: float = 0.0) -> None:
        """A view stops no job: whoever runs the collector marks its own stops."""

    def close(self) -> None:
        pass
