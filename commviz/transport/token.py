"""Who may talk to a watcher over TCP: only peers holding its token.

Loopback is no trust boundary (on a shared login node or GPU box any user can reach
127.0.0.1), so every TCP listener, loopback included, wants a token. An ipc socket is
guarded by its file permissions (a 0700 directory, a 0600 socket) and stays the
default; it uses a token only when COMMVIZ_TOKEN is set, because ranks that hold one
speak PLAIN and a NULL listener would not understand them.

The check runs in a ZAP handler of our own rather than pyzmq's authenticator, so the
token is compared in constant time and every peer turned away is counted, whether it
offered a wrong token (ZAP says no) or none at all (the handshake fails)."""

from __future__ import annotations

import hmac
import os
import secrets
import sys
import threading
from typing import Callable

import zmq

from commviz.transport.address import parse

ENV = "COMMVIZ_TOKEN"
USER = b"commviz"
DOMAIN = b"commviz"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP spec (RFC 27)


def make_token() -> str:
    return secrets.token_urlsafe(18)


def listener_token(addr: str, env=None, say=None) -> str | None:
    """The token a listener on `addr` wants: COMMVIZ_TOKEN, or for TCP one made up
    here, put into `env` (os.environ) so that a job launched from this process
    inherits it, and said once for ranks started by hand."""
    env = os.environ if env is None else env
    token = env.get(ENV) or None
    if token or parse(addr)[0] != "tcp":
        return token
    token = env[ENV] = make_token()
    (say or _say)(f"commviz: {addr} admits only ranks that hold its token; for ranks started by hand:\n"
                  f"  export {ENV}={token}")
    return token


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def matches(offered: bytes, token: bytes) -> bool:
    """Constant-time comparison: how long a wrong guess takes says nothing about it."""
    return hmac.compare_digest(offered, token)


def serve(sock: zmq.Socket, token: str | None) -> None:
    """Make a listening socket ask our ZAP handler about every peer before it takes a
    frame from it; with a token, the peer must offer it (PLAIN)."""
    if token:
        sock.setsockopt(zmq.PLAIN_SERVER, 1)
    sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN)


def present(sock: zmq.Socket, token: str) -> None:
    """Make a connecting socket offer the token."""
    sock.setsockopt(zmq.PLAIN_USERNAME, USER)
    sock.setsockopt(zmq.PLAIN_PASSWORD, token.encode())


class Gate:
    """The ZAP handler of one zmq context: it admits a peer that offers the token (when
    the listener wants one) while the listener has room for one more connection, and
    counts whom it turned away and why. ZAP is asked during the handshake, before zmq
    takes any frame from the peer, so a connection refused here costs no memory.
    Handshakes that fail before ZAP is asked (a peer with no token speaks NULL to our
    PLAIN listener) are counted by the socket's monitor (transport/conns.py), which
    this thread reads too (`follow`), taking all it has queued before each answer."""

    def __init__(self, ctx: zmq.Context, token: str | None, room: Callable[[], bool] = lambda: True) -> None:
        self._token = token.encode() if token else None
        self._room = room
        self._conns = None  # transport.conns.Connections, read by this thread
        self.denied = 0  # offered no valid token
        self.turned_away = 0  # one connection too many
        self.errors = 0  # passes of this thread that failed (it goes on: a dead one would stall every handshake)
        self._zap = ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commviz-zap", daemon=True)

    def follow(self, conns) -> "Gate":
        """Read this listener's monitor here (before `start`)."""
        self._conns = conns
        return self

    def start(self) -> "Gate":
        self._thread.start()
        return self

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        if self._conns is not None:
            poller.register(self._conns.monitor, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(100))
                if self._conns is not None:
                    self._conns.drain()  # every connection accepted before this request
                if self._zap in ready:
                    self._zap.send_multipart(self.reply(self._zap.recv_multipart()))
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                self.errors += 1
            except Exception:
                self.errors += 1

    def reply(self, req: list[bytes]) -> list[bytes]:
        """ZAP: [version, id, domain, address, identity, mechanism, *credentials]."""
        version, rid = (req + [b"", b""])[:2]
        if self._token is None:
            ok = len(req) == 6 and req[5] == b"NULL" and req[2] == DOMAIN
        else:
            ok = (len(req) == 8 and req[5] == b"PLAIN" and req[2] == DOMAIN
                  and matches(req[6], USER) & matches(req[7], self._token))
        if not ok:
            self.denied += 1
            return [version, rid, b"400", b"no valid token", b"", b""]
        if not self._room():
            self.turned_away += 1
            return [version, rid, b"400", b"too many connections", b"", b""]
        return [version, rid, b"200", b"OK", USER, b""]

    def close(self) -> bool:
        """Stop the thread and close the ZAP socket; False if the thread did not stop
        (its sockets, the monitor included, are then left open: closing a socket
        another thread polls is undefined)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1)
        if self._thread.is_alive():
            return False
        self._zap.close(0)
        return True
