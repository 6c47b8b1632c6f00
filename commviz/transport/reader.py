"""Taking messages off the watcher's ROUTER socket, a round at a time, as
(identity, payload, extra parts, where) tuples.

Under a flood this is the reader's whole cost, and pyzmq's price per message (a Frame
object, or a getsockopt to learn whether more parts follow) is four times what
libzmq itself needs. So the loop is in C (`_fastrecv.c`, built when the package is
installed) on the same socket and the same libzmq pyzmq loaded (found through
pyzmq's extension, and its version checked); where it could not be
built, the same tuples come from pyzmq, slower. `where` names the connection the
payload came on, for closing it: an fd from C, a zmq.Frame from pyzmq (whose fd is
asked for only then: `fd_of`)."""

from __future__ import annotations

import ctypes
import errno
from typing import Callable

import zmq

from commviz import native

Message = tuple[bytes, bytes, int, object]
Read = Callable[[int, int], list[Message]]

_fastrecv = native.load("commviz.transport._fastrecv")  # None: pyzmq does the reading

_FUNCS = ("zmq_msg_init", "zmq_msg_recv", "zmq_msg_close", "zmq_msg_data",
          "zmq_msg_size", "zmq_msg_more", "zmq_msg_get", "zmq_errno")
_bound: bool | None = None  # None: not tried yet


def _pyzmqs_libzmq():
    """pyzmq's own libzmq, looked up through its extension module: the C loop must
    call into that very copy, since a socket is that copy's object (another copy
    loaded beside it, by name, could be any version)."""
    from zmq.backend.cython import _zmq

    lib = ctypes.CDLL(_zmq.__file__)  # already loaded: symbols resolve as its own do
    major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.zmq_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    if (major.value, minor.value, patch.value) != zmq.zmq_version_info():
        return None
    return lib


def _bind() -> bool:
    global _bound
    if _bound is None:
        _bound = False
        if _fastrecv is not None:
            try:
                lib = _pyzmqs_libzmq()
                if lib is not None:
                    _fastrecv.bind_zmq(*(ctypes.cast(getattr(lib, f), ctypes.c_void_p).value for f in _FUNCS))
                    _bound = True
            except (ImportError, OSError, AttributeError, ValueError, TypeError) as exc:
                native.declined("commviz.transport._fastrecv", f"pyzmq's libzmq could not be bound ({exc})")
            if not _bound and _fastrecv is not None and native.STATUS.get("commviz.transport._fastrecv") == "loaded":
                native.declined("commviz.transport._fastrecv", "pyzmq's libzmq is not the version pyzmq reports")
    return _bound


def fast() -> bool:
    """Whether the C loop reads (else pyzmq does)."""
    return _bind()


def reader(sock: zmq.Socket, prefer_c: bool = True) -> Read:
    """read(n, max_bytes): up to n messages, stopping once max_bytes (of every part)
    are in hand, so that a round of the largest frames stays small; [] when none wait.
    A zmq error other than 'nothing waiting' is raised as zmq.ZMQError."""
    if prefer_c and _bind():
        handle, c_read = sock.underlying, _fastrecv.read

        def read(n: int, max_bytes: int) -> list[Message]:
            if sock.closed:  # its handle is freed: pyzmq checks this, C cannot
                raise zmq.ZMQError(errno.ENOTSOCK)
            got, err = c_read(handle, n, max_bytes)
            if err and err != errno.EAGAIN:
                if got:
                    return got  # the error comes back on the next call
                raise zmq.ContextTerminated() if err == zmq.ETERM else zmq.ZMQError(err)
            return got

        return read
    return _python_reader(sock)


def _python_reader(sock: zmq.Socket) -> Read:
    recv, NB = sock.recv, zmq.NOBLOCK

    def read(n: int, max_bytes: int) -> list[Message]:
        out, size = [], 0
        for _ in range(n):
            try:
                ident = recv(NB)
            except zmq.Again:
                break
            # A ROUTER message arrives whole, so its parts are here. The payload comes
            # as a Frame only because Frame.more is far cheaper than getsockopt.
            frame = recv(NB, copy=False)
            extra, more = 0, frame.more
            size += len(ident) + len(frame)
            while more:
                part = recv(NB, copy=False)
                more, size, extra = part.more, size + len(part), extra + 1
            out.append((ident, frame.bytes, extra, frame))
            if size >= max_bytes:
                break
        return out

    return read


def fd_of(where: object) -> int:
    """The fd a message came on, from what `read` gave for it."""
    return where if isinstance(where, int) else where.get(zmq.SRCFD)
