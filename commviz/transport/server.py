"""Watcher side of the wire: a zmq ROUTER that receives batches from any number of
ranks on a background thread. Nothing from the wire is trusted: frames are size
limited by zmq, decoded with the typed schema, and failures are counted and named
by peer, never raised."""

from __future__ import annotations

import os
import socket
import stat
import threading
from typing import Callable

import zmq

from commviz.events import Batch, FrameError, decode_batch
from commviz.transport.address import AddressError, check_private_dir, parse

MAX_FRAME = 16 * 1024 * 1024  # peers sending more are disconnected by zmq
RCVHWM = 10000


def _ipc_in_use(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Server:
    def __init__(
        self,
        addr: str,
        on_batch: Callable[[Batch, bytes], None],
        on_error: Callable[[str, str], None],
    ) -> None:
        kind, rest = parse(addr)
        self.addr = addr
        self.on_batch = on_batch
        self.on_error = on_error
        self.frames = 0
        self.bad_frames = 0
        self.peers: set[bytes] = set()
        self._ipc_path = rest if kind == "ipc" else None
        if self._ipc_path:
            self._prepare_ipc(self._ipc_path)
        self._ctx = zmq.Context(io_threads=1)
        s = self._ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        s.setsockopt(zmq.RCVHWM, RCVHWM)
        s.setsockopt(zmq.LINGER, 0)
        old = os.umask(0o077)  # the socket file is created user-only
        try:
            s.bind(addr)
        except zmq.ZMQError as exc:
            s.close()
            self._ctx.term()
            raise AddressError(f"cannot listen on {addr}: {exc}") from None
        finally:
            os.umask(old)
        if self._ipc_path:
            os.chmod(self._ipc_path, 0o600)
        if kind == "tcp" and rest.endswith(":0"):
            self.addr = s.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._sock = s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="commviz-server", daemon=True)

    @staticmethod
    def _prepare_ipc(path: str) -> None:
        d = os.path.dirname(path) or "."
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise AddressError(f"{d} is writable by everyone; put the socket in a private directory")
        if os.path.basename(d).startswith("commviz-"):
            check_private_dir(d)
        if os.path.exists(path):
            if _ipc_in_use(path):
                raise AddressError(
                    f"another commviz watcher is listening on ipc://{path}; stop it, "
                    "or give this one its own address with --listen"
                )
            os.unlink(path)  # stale socket from a watcher that died

    def start(self) -> "Server":
        self.thread.start()
        return self

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(100):
                    continue
                while True:
                    try:
                        parts = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    self._handle(parts)
            except zmq.ZMQError:
                if self._stop.is_set():
                    break
            except Exception as exc:  # a bug in a consumer must not kill the watcher
                self.on_error("watcher", f"internal error: {type(exc).__name__}: {exc}")

    def _handle(self, parts: list[bytes]) -> None:
        peer = parts[0].decode("utf-8", "replace") if parts else "?"
        self.peers.add(parts[0])
        if len(parts) != 2:
            self.bad_frames += 1
            self.on_error(peer, f"message of {len(parts)} parts, expected one frame")
            return
        payload = parts[1]
        try:
            batch = decode_batch(payload)
        except FrameError as exc:
            self.bad_frames += 1
            self.on_error(peer, str(exc))
            return
        self.frames += 1
        self.on_batch(batch, payload)

    def close(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(2)
        self._sock.close()
        self._ctx.term()
        if self._ipc_path and os.path.exists(self._ipc_path):
            try:
                os.unlink(self._ipc_path)
            except OSError:
                pass
