"""Watcher side of the wire: a zmq ROUTER that receives batches from any number of
ranks on a background thread. Nothing from the wire is trusted: frames are size
limited by zmq, decoded with the typed schema, and failures are counted and named
by peer, never raised."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from typing import Callable

import zmq

from commviz.events import Batch, FrameError, decode_batch
from commviz.transport.address import AddressError, check_private_dir, parse

MAX_FRAME = 16 * 1024 * 1024  # peers sending more are disconnected by zmq
RCVHWM = 10000
# A rank sends ~50 batches a second; far beyond that is a bug or an attack.
FLOOD_FRAMES_PER_S = 2000
# Each rank holds two connections at most (sender, flight); far more is not a job.
MAX_PEERS = 16384
PEER_IDLE_S = 60.0
TOKEN_USER = "commviz"


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


class _AuthLog:
    """Counts the connections the authenticator turns away (pyzmq logs them at debug)."""

    def __init__(self) -> None:
        self.denied = 0

    def debug(self, msg, *args) -> None:
        if str(msg).startswith("DENIED"):
            self.denied += 1

    def error(self, msg, *args) -> None:
        self.denied += 1

    info = warning = lambda self, *a: None  # noqa: E731


class Server:
    def __init__(
        self,
        addr: str,
        on_batch: Callable[[Batch, bytes], None],
        on_error: Callable[[str, str], None],
        token: str | None = None,
        flood_frames_per_s: int = FLOOD_FRAMES_PER_S,
        max_peers: int = MAX_PEERS,
    ) -> None:
        kind, rest = parse(addr)
        self.addr = addr
        self.on_batch = on_batch
        self.on_error = on_error
        self.frames = 0
        self.bad_frames = 0
        self.peers: dict[bytes, float] = {}  # identity -> when last heard (monotonic s)
        self.flood_limit = flood_frames_per_s
        self.max_peers = max_peers
        self.refused = 0  # frames from peers beyond max_peers, ignored
        self.flooded: dict[bytes, int] = {}  # peer -> frames ignored while over the limit
        self._rate: dict[bytes, list] = {}  # peer -> [window start, frames in window]
        self._auth = None
        self._auth_log = _AuthLog()
        self._ipc_path = rest if kind == "ipc" else None
        if self._ipc_path:
            self._prepare_ipc(self._ipc_path)
        self._ctx = zmq.Context(io_threads=1)
        s = self._ctx.socket(zmq.ROUTER)
        if token:
            # ZAP/PLAIN: a peer without the token never completes the handshake, so
            # none of its frames reach us. Turned-away peers are counted.
            from zmq.auth.thread import ThreadAuthenticator

            self._auth = ThreadAuthenticator(self._ctx, log=self._auth_log)
            self._auth.start()
            self._auth.configure_plain(domain="commviz", passwords={TOKEN_USER: token})
            s.setsockopt(zmq.PLAIN_SERVER, 1)
            s.setsockopt(zmq.ZAP_DOMAIN, b"commviz")
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

    @property
    def denied(self) -> int:
        return self._auth_log.denied

    def _over_limit(self, ident: bytes) -> bool:
        """A peer sending more than the limit in one second is ignored for the rest
        of that second (counted), so it cannot starve the other ranks."""
        now = time.monotonic()
        w = self._rate.get(ident)
        if w is None or now - w[0] >= 1.0:
            w = self._rate[ident] = [now, 0]
        w[1] += 1
        if w[1] > self.flood_limit:
            n = self.flooded.get(ident, 0)
            if n == 0:
                self.on_error(ident.decode("utf-8", "replace"), f"over {self.flood_limit} frames/s: ignoring it for now")
            self.flooded[ident] = n + 1
            return True
        return False

    def _handle(self, parts: list[bytes]) -> None:
        peer = parts[0].decode("utf-8", "replace") if parts else "?"
        ident = parts[0]
        now = time.monotonic()
        if ident not in self.peers:
            if len(self.peers) >= self.max_peers:
                # forget peers silent for a minute (ranks of finished jobs) first
                self.peers = {k: t for k, t in self.peers.items() if now - t < PEER_IDLE_S}
            if len(self.peers) >= self.max_peers:
                # Past the cap new peers are ignored (and counted) so that a storm of
                # connections cannot crowd out the ranks already talking to us.
                self.refused += 1
                if self.refused == 1:
                    self.on_error(peer, f"more than {self.max_peers} peers: ignoring new ones")
                return
        self.peers[ident] = now
        if self._over_limit(ident):
            return
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
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        if self._ipc_path and os.path.exists(self._ipc_path):
            try:
                os.unlink(self._ipc_path)
            except OSError:
                pass
