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


def serve_plain(sock: zmq.Socket) -> None:
    """Make a listening socket ask every peer for the token (PLAIN, checked by ZAP)."""
    sock.setsockopt(zmq.PLAIN_SERVER, 1)
    sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN)


def present(sock: zmq.Socket, token: str) -> None:
    """Make a connecting socket offer the token."""
    sock.setsockopt(zmq.PLAIN_USERNAME, USER)
    sock.setsockopt(zmq.PLAIN_PASSWORD, token.encode())


class Gate:
    """The ZAP handler of one zmq context. Every handshake that failed, whether ZAP
    said no or it failed before ZAP was asked (a peer with no token speaks NULL to our
    PLAIN listener), is counted by the socket's monitor (transport/conns.py)."""

    def __init__(self, ctx: zmq.Context, token: str) -> None:
        self._token = token.encode()
        self._zap = ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commviz-token", daemon=True)

    def start(self) -> "Gate":
        self._thread.start()
        return self

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if poller.poll(100):
                    self._zap.send_multipart(self.reply(self._zap.recv_multipart()))
            except zmq.ZMQError:
                if self._stop.is_set():
                    return

    def reply(self, req: list[bytes]) -> list[bytes]:
        """ZAP: [version, id, domain, address, identity, mechanism, *credentials]."""
        version, rid = (req + [b"", b""])[:2]
        ok = (len(req) == 8 and req[5] == b"PLAIN" and req[2] == DOMAIN
              and matches(req[6], USER) & matches(req[7], self._token))
        code, text = (b"200", b"OK") if ok else (b"400", b"no valid token")
        return [version, rid, code, text, USER if ok else b"", b""]

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1)
        self._zap.close(0)
