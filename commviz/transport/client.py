"""Rank side of the wire: a non-blocking zmq DEALER that reconnects by itself."""

from __future__ import annotations

import os

import zmq

from commviz.transport import token as tokens
from commviz.transport.address import parse

SNDHWM = 256  # batches queued in zmq before sends fail and are counted as dropped
RECONNECT_MS = 100
RECONNECT_MAX_MS = 500  # a watcher started mid-run is reached within a second
LINGER_MS = 500  # at exit, at most this long is spent handing over the last batches


class Client:
    def __init__(self, addr: str, identity: bytes, token: str | None = None) -> None:
        parse(addr)
        self.addr = addr
        self._ctx = zmq.Context(io_threads=1)
        s = self._ctx.socket(zmq.DEALER)
        token = token if token is not None else os.environ.get(tokens.ENV)
        if token:
            tokens.present(s, token)
        s.setsockopt(zmq.IDENTITY, identity)
        # Queue only on live connections: with no watcher a send fails at once and
        # the batch is counted as dropped, instead of piling up in memory.
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.SNDHWM, SNDHWM)
        s.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
        s.setsockopt(zmq.LINGER, LINGER_MS)
        s.connect(addr)
        self._sock = s

    def send(self, payload: bytes) -> bool:
        """Hand one frame to zmq without ever blocking; False if it was not taken."""
        try:
            self._sock.send(payload, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()
