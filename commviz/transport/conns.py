"""The watcher's connections, from zmq's socket monitor: how many are open, and the
power to close one.

zmq bounds what it holds per connection (a few frames of at most MAX_WIRE_FRAME), not
across them, so a flood of connections is the one way to make a watcher hold more.
The ZAP handler (token.Gate) admits a new peer only while fewer than `max_open` are
open, before zmq takes a frame from it: what zmq holds for the wire is then at most
max_open × a few frames. A peer that sent a bad frame is closed (it may come back; it
is closed again), so strangers hold no connection long. Handshakes that failed before
ZAP was asked (a peer with no token speaks NULL to a PLAIN listener) are counted here:
one monitor per socket.

The monitor is read by the ZAP handler's own thread, which takes every event queued
before it answers. With one I/O thread (the server's context has one) the event of a
connection accepted is sent before that thread can run the connection's handshake,
so the count the answer rests on always holds the peer asking and every one before
it. Read by a thread of its own, the monitor lagged on a loaded box and a flood got in
past the cap. The count may also hold peers accepted after the one asking: in a burst
of connections near the cap one that would fit can be refused; it connects again
(zmq retries), and is admitted once there is room."""

from __future__ import annotations

import socket

import zmq
from zmq.utils.monitor import parse_monitor_message

# Refusals by ZAP (HANDSHAKE_FAILED_AUTH) are counted by the Gate, which knows why.
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | _FAILED


def stop_monitor(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    """Stop watching `sock` and close its monitor socket; the socket may be closed or
    its monitor already off (zmq then refuses to disable it, which is no error here)."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(0)


def close_fd(fd: int) -> bool:
    """Shut a connection's socket down under zmq, which then closes it and frees what
    it held for it. True if there was a socket to shut (-1: zmq did not say which)."""
    if fd < 0:
        return False
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
    def __init__(self, sock: zmq.Socket, max_open: int, count_failed: bool = True) -> None:
        self.max_open = max_open
        # Without a token a handshake fails only when we close the connection
        # ourselves (a bad frame), which is counted as that.
        self.count_failed = count_failed
        self.open: set[int] = set()  # fds zmq accepted and has not closed
        self.evicted = 0  # connections closed after a bad frame
        self.failed = 0  # handshakes that failed before ZAP was asked (no token)
        self._sock = sock
        # Read only by the ZAP handler's thread (token.Gate), like any zmq socket by one.
        self.monitor = sock.get_monitor_socket(_EVENTS)

    def drain(self) -> None:
        """Take every event the monitor has queued, without waiting."""
        while True:
            try:
                msg = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.on_event(parse_monitor_message(msg))

    def room(self) -> bool:
        """For the ZAP handler, after `drain`: may one more peer connect? (The one
        asking is counted in `open` already.)"""
        return len(self.open) <= self.max_open

    def on_event(self, event: dict) -> None:
        kind, fd = event["event"], event["value"]
        if kind == zmq.EVENT_ACCEPTED:
            self.open.add(fd)
        elif kind == zmq.EVENT_DISCONNECTED:
            self.open.discard(fd)
        elif kind & _FAILED and self.count_failed:
            self.failed += 1

    def evict(self, fd: int) -> None:
        """From the reader thread: close the connection a bad frame came on (it may
        not be in `open` yet: the monitor's news can lag the frame)."""
        if close_fd(fd):
            self.evicted += 1

    def close(self) -> None:
        """After the Gate that reads the monitor has stopped."""
        stop_monitor(self._sock, self.monitor)
