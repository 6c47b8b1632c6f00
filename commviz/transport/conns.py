"""The watcher's connections, from zmq's socket monitor: how many are open, how many
were turned away, and the power to close one.

zmq bounds what it holds per connection (a few frames of at most MAX_WIRE_FRAME), not
across them, so a flood of connections is the one way to make a watcher hold more.
Past `max_open` connections a new one is closed as soon as zmq reports it, and
counted: what zmq holds for the wire is then at most max_open × a few frames. A peer
that sent a bad frame is closed too (it may come back; it is closed again), so
strangers hold no connection long. Handshakes that failed (no token, a wrong one) are
counted here as well: one monitor per socket."""

from __future__ import annotations

import socket
import threading

import zmq
from zmq.utils.monitor import parse_monitor_message

_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | _FAILED


def close_fd(fd: int) -> bool:
    """Shut a connection's socket down under zmq, which then closes it and frees what
    it held for it. True if there was a socket to shut."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        s.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        s.detach()  # the fd stays zmq's


class Connections:
    def __init__(self, sock: zmq.Socket, max_open: int) -> None:
        self.max_open = max_open
        self.open: set[int] = set()  # fds zmq accepted and has not closed
        self.turned_away = 0  # connections closed for being one too many
        self.evicted = 0  # connections closed after a bad frame
        self.denied = 0  # handshakes that failed (the token)
        self._sock = sock
        self._monitor = sock.get_monitor_socket(_EVENTS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commviz-conns", daemon=True)

    def start(self) -> "Connections":
        self._thread.start()
        return self

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._monitor, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if poller.poll(100):
                    self.on_event(parse_monitor_message(self._monitor.recv_multipart()))
            except zmq.ZMQError:
                if self._stop.is_set():
                    return

    def on_event(self, event: dict) -> None:
        kind, fd = event["event"], event["value"]
        if kind == zmq.EVENT_ACCEPTED:
            if len(self.open) >= self.max_open:
                self.turned_away += 1
                close_fd(fd)
            else:
                self.open.add(fd)
        elif kind == zmq.EVENT_DISCONNECTED:
            self.open.discard(fd)
        elif kind & _FAILED:
            self.denied += 1

    def evict(self, fd: int) -> None:
        """From the reader thread: close the connection a bad frame came on."""
        if fd in self.open and close_fd(fd):
            self.evicted += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1)
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(0)
