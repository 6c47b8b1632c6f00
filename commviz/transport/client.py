"""Rank side of the wire: a non-blocking zmq DEALER that reconnects by itself and
keeps count, with the watcher's acks (credit.py), of what it has handed over."""

from __future__ import annotations

import os

import zmq
from zmq.utils.monitor import parse_monitor_message

from commviz.transport import token as tokens
from commviz.transport.address import parse
from commviz.transport.conns import stop_monitor
from commviz.transport.credit import Window, acked

SNDHWM = 256  # batches queued in zmq before sends fail (the window keeps far fewer)
RECONNECT_MS = 100
RECONNECT_MAX_MS = 500  # a watcher started mid-run is reached within a second
LINGER_MS = 500  # at exit, at most this long is spent handing over the last frames
# Frames a sender may have handed over that the watcher has not acknowledged. A rank
# flushes ~50 frames a second and a watcher acks within milliseconds, so 8 never
# slows a live stream; a frozen or slow watcher holds at most 8 of a rank's frames.
WINDOW = 8


class Client:
    def __init__(self, addr: str, identity: bytes, token: str | None = None, window: int = WINDOW) -> None:
        parse(addr)
        self.addr = addr
        self.window = Window(window)
        self._ctx = zmq.Context(io_threads=1)
        s = self._ctx.socket(zmq.DEALER)
        token = token if token is not None else os.environ.get(tokens.ENV)
        if token:
            tokens.present(s, token)
        s.setsockopt(zmq.IDENTITY, identity)
        # Queue only on live connections: with no watcher a send fails at once and
        # the batch stays in the sender's backlog, instead of piling up in zmq.
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.SNDHWM, SNDHWM)
        s.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
        s.setsockopt(zmq.LINGER, LINGER_MS)
        # A dropped connection takes the frames zmq still held for it: the monitor
        # says when, so the sender can count them.
        self._mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        s.connect(addr)
        self._sock = s

    @property
    def room(self) -> int:
        """Frames that may be handed over before the watcher acknowledges more."""
        return self.window.room

    def writable(self) -> bool:
        """Whether zmq would take a frame now: with IMMEDIATE, only once a connection
        is up. Asked before a resync is encoded, so a rank with no watcher pays one
        socket option read per flush (~1 us), not an encode and a failed send that
        raises (~4 us)."""
        return bool(self._sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT)

    def send(self, payload: bytes, tag=None) -> bool:
        """Hand one frame to zmq without ever blocking; False if it was not taken
        (no connection). The caller checks `room` first, except for a last frame
        (a goodbye) that may go one past the window."""
        try:
            self._sock.send(payload, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self.window.sent(tag)
        return True

    def poll(self) -> list | None:
        """Take the watcher's acks. None while the connection held; after it dropped,
        the tags of the frames it took unacknowledged (a list, maybe empty)."""
        # Each socket is asked whether it has something before it is read: a read
        # that finds nothing raises zmq.Again, ~3 us, twice a flush with no watcher.
        # (zmq.Again is still caught: the check and the read should always agree.)
        dropped = False
        try:
            while _readable(self._mon):
                event = parse_monitor_message(self._mon.recv_multipart(zmq.NOBLOCK))
                dropped |= event["event"] == zmq.EVENT_DISCONNECTED
        except zmq.Again:
            pass
        # Acks that arrived before the drop was seen came over the old connection.
        n = 0
        try:
            while _readable(self._sock):
                n += acked(self._sock.recv(zmq.NOBLOCK))
        except zmq.Again:
            pass
        self.window.ack(n)
        return self.window.lose() if dropped else None

    def close(self) -> None:
        stop_monitor(self._sock, self._mon)
        self._sock.close()
        self._ctx.term()


def _readable(sock: zmq.Socket) -> bool:
    return bool(sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)
