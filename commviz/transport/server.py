"""Watcher side of the wire: a zmq ROUTER that receives batches from any number of
ranks. Nothing from the wire is trusted: frames are size limited by zmq, decoded with
the typed schema, and failures are counted and named by peer, never raised.

Memory for the wire is bounded in four places: a peer that follows the protocol keeps
at most its credit window of frames unacknowledged (credit.py; every frame taken is
acked once the model has it, or once it was shed); zmq holds at most RCVHWM frames of
at most MAX_FRAME per connection (then it stops reading that connection and the
kernel pushes back on the sender); at most MAX_CONNECTIONS connections are open
(conns.py, refused by the ZAP handler past that); and decoded frames wait for the
model in one queue sized in bytes across all peers (inbox.py). The reader thread
never takes the model's lock, so bad frames are turned away as fast as zmq hands them
over, and a flood drains instead of queueing — except while that queue is full: then
the socket is read only every FULL_PAUSE_S, and meanwhile the flood waits in zmq
(RCVHWM a connection) or at its senders, who count what they cannot send."""

from __future__ import annotations

import collections
import ctypes
import os
import socket
import stat
import threading
import time
from typing import Callable

import zmq

from commviz.events import MAX_WIRE_FRAME, Batch, FrameError, batch_len, decode_batch
from commviz.transport import reader
from commviz.transport import token as tokens
from commviz.transport.conns import Connections
from commviz.transport.credit import ack_frame
from commviz.transport.address import AddressError, check_private_dir, parse
from commviz.transport.inbox import Inbox, cost
from commviz.transport.tally import Tally

MAX_FRAME = MAX_WIRE_FRAME  # peers sending more are disconnected by zmq, unread
# Frames zmq queues per connection. The reader drains far faster than a rank sends
# (~50 frames/s); a rank whose frames are not taken keeps them in its own backlog.
# (1 would do for ranks, but zmq 4.3 then delivers nothing on a PLAIN connection.)
# zmq tells its io thread to read on each time half the queue was taken: with 2
# that is a command, often a syscall, on the reader's thread per frame, with 4 one
# per 2 frames (bench/flood.py: ~30% more bad frames turned away per CPU-second).
RCVHWM = 4
# Connections open at once. What zmq holds for the wire is at most about this many
# times (RCVHWM + 2) frames (the queue, the frame being read, one waiting to be
# queued): 128 × 6 × 128 KiB = 96 MiB, whatever peers do with frames of one part
# (zmq does not limit a message's parts: docs/PROMISES.md, Known gaps). A node's ranks are one
# connection each; many nodes go through relays, one connection per node (128 nodes
# of 8 GPUs: 1,024 ranks).
MAX_CONNECTIONS = 128
QUEUE_BYTES = 64 * 1024 * 1024  # decoded frames waiting for the model, all peers together
# A rank sends ~50 batches a second; far beyond that is a bug or an attack.
FLOOD_FRAMES_PER_S = 2000
# Each rank holds two connections at most (sender, flight); far more is not a job.
MAX_PEERS = 16384
PEER_IDLE_S = 60.0
# While the inbox is full the socket is read only this often: what comes then is
# shed (and counted per peer), and in between zmq stops reading the connections, so
# the frames a flood brings wait or are refused at their senders, who count them,
# instead of costing the watcher a read each only to be shed. (bench/ingest.py flat
# out at 1,024 ranks: two frames in three read were shed, a third of the watcher's CPU.)
FULL_PAUSE_S = 0.05
ROUND = 4096  # frames read per turn before the clock is read again
ROUND_BYTES = 4 * 1024 * 1024  # ...or fewer: a round of the largest frames stays small
BATCH_HEAD = 0x93  # every valid frame is a 3-element msgpack array (schema, rank, events)


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


def _why_bad(payload) -> str:
    """The reason a frame is bad, worked out only when it is described."""
    if not payload:
        return "empty frame"
    try:
        decode_batch(payload)
    except FrameError as exc:
        return str(exc)
    return f"undecodable frame ({len(payload)} bytes)"


# glibc's mallopt parameters: M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD.
KEEP_HEAP = ((-1, 256 << 20), (-2, 64 << 20), (-3, 32 << 20))
KEEP_HEAP_ENV = "COMMVIZ_KEEP_HEAP"  # "0": leave glibc's defaults
_heap_kept: bool | None = None  # None: not asked yet (once per process)


def keep_heap() -> bool:
    """Have glibc keep freed heap at hand while the watcher runs. Behind a flood the
    reader decodes frames into fresh memory that the model frees a drain (~1,500
    frames) later; by default glibc gives the heap's top back at each such free and
    takes the pages again, zeroed, for the next frames: that doubled a frame's decode
    (bench/ingest.py shows it by thread; COMMVIZ_KEEP_HEAP=0 to compare). Freed memory
    up to 256 MB stays mapped until the flood ends, when the reader's malloc_trim
    hands it back. True where it took (glibc)."""
    global _heap_kept
    if _heap_kept is None:
        _heap_kept = False
        mallopt = _glibc("mallopt") if os.environ.get(KEEP_HEAP_ENV, "1") != "0" else None
        if mallopt is not None:
            _heap_kept = all(mallopt(param, value) == 1 for param, value in KEEP_HEAP)
    return _heap_kept


def _malloc_trim():
    """glibc keeps freed memory in its arenas (zmq's io thread has its own); after a
    flood, hand it back to the system so the watcher's RSS comes down again."""
    return _glibc("malloc_trim")


def _glibc(name: str):
    """glibc's function `name`, or None where the C library is another."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


class Server:
    def __init__(
        self,
        addr: str,
        on_batch: Callable[[Batch, bytes], None],
        on_error: Callable[[str, str], None],
        token: str | None = None,
        flood_frames_per_s: int = FLOOD_FRAMES_PER_S,
        max_peers: int = MAX_PEERS,
        queue_bytes: int = QUEUE_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        decode: Callable[[bytes], Batch] = decode_batch,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        kind, rest = parse(addr)
        # What the reader's timers (flood rate, idle peers, describing a peer once a
        # second, the full inbox's pause) read and wait on, so a test steps time
        # instead of outlasting it. The pause waits on the stop event unless told
        # otherwise, so close() ends it at once.
        self._clock = clock
        self.addr = addr
        self.on_error = on_error
        self.frames = 0  # valid frames handed to the model
        self.rejected = Tally(max_peers)  # bad frames, per peer
        self.shed = Tally(max_peers)  # valid frames not ingested (over the rate, queue full), per peer
        self.behind_frames = 0  # of those, the frames the inbox had no room for: the model is behind
        self.paused = 0  # times reading waited for room in the inbox (FULL_PAUSE_S): frames wait or are refused
        self.peers: dict[bytes, float] = {}  # identity -> when last heard (monotonic s)
        self.flood_limit = flood_frames_per_s
        self.max_peers = max_peers
        self.refused = 0  # frames from peers beyond max_peers, ignored
        self.cpu_s = 0.0  # CPU time the reader thread used, for the flood bench
        self._rate: dict[bytes, list] = {}  # peer -> [window start, frames in window]
        self._on_batch = on_batch
        # The watcher's `model.store.decode_frame` reads frames into columns; a relay,
        # which re-encodes events, takes them as objects.
        self._decode = decode
        self._inbox = Inbox(queue_bytes, self._deliver, on_error)
        # Acks owed, one identity per frame dealt with. The ingest thread appends and
        # wakes the reader through a pipe (only the reader may use the zmq socket).
        self._acks: collections.deque = collections.deque()
        self._ack_woken = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._gate: tokens.Gate | None = None
        self.conns: Connections | None = None
        self._trim = _malloc_trim()
        self._ipc_path = rest if kind == "ipc" else None
        if self._ipc_path:
            self._prepare_ipc(self._ipc_path)
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._bind(addr, token)
        self.conns = Connections(self._sock, max_connections, count_failed=bool(token))
        self._gate.follow(self.conns).start()
        self._read = reader.reader(self._sock)
        self.reads_in_c = reader.fast()  # else pyzmq reads, a third as fast under a flood
        if kind == "tcp" and rest.endswith(":0"):
            self.addr = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._stop = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop.wait
        self.thread = threading.Thread(target=self._run, name="commviz-server", daemon=True)

    def _bind(self, addr: str, token: str | None) -> zmq.Socket:
        s = self._ctx.socket(zmq.ROUTER)
        # Every peer is asked about by our ZAP handler before zmq takes a frame from it:
        # one too many is refused there, and with a token (PLAIN) a peer without it;
        # none of their frames reach us, and each is counted.
        self._gate = tokens.Gate(self._ctx, token, room=self._room)  # started once it has the monitor
        tokens.serve(s, token)
        s.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        s.setsockopt(zmq.RCVHWM, RCVHWM)
        s.setsockopt(zmq.LINGER, 0)
        old = os.umask(0o077)  # the socket file is created user-only
        try:
            s.bind(addr)
        except zmq.ZMQError as exc:
            s.close()
            self._gate.close()
            self._ctx.term()
            raise AddressError(f"cannot listen on {addr}: {exc}") from None
        finally:
            os.umask(old)
        if self._ipc_path:
            os.chmod(self._ipc_path, 0o600)
        return s

    @property
    def bad_frames(self) -> int:
        return self.rejected.total

    @property
    def shed_frames(self) -> int:
        return self.shed.total

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
        keep_heap()
        self._inbox.start()
        self.thread.start()
        return self

    def _room(self) -> bool:
        return self.conns is None or self.conns.room()

    @property
    def denied(self) -> int:
        """Connections turned away for want of the token."""
        return self._gate.denied + self.conns.failed

    @property
    def turned_away(self) -> int:
        """Connections refused for being one too many."""
        return self._gate.turned_away

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        clock = self._clock
        dirty = False  # something was turned away since memory was last handed back
        read_at = 0.0  # when the socket was last read
        while not self._stop.is_set():
            try:
                wait = FULL_PAUSE_S - (clock() - read_at) if self._inbox.full() else 0.0
                if wait > 0:  # not woken per frame the model takes: that cost a syscall or two each
                    self.paused += 1
                    if self._acks:
                        self._send_acks()
                    self._sleep(wait)
                    continue
                ready = dict(poller.poll(100))
                if self._wake_r in ready:
                    self._woken()
                if self._sock in ready:
                    read_at = clock()
                    dirty |= self._drain()
                if self._acks:
                    self._send_acks()
                if not ready and dirty and self._trim is not None:
                    self._trim(0)  # the flood is over: give its memory back
                    dirty = False
            except zmq.ZMQError:
                if self._stop.is_set():
                    break
            except Exception as exc:  # a bug here must not kill the watcher
                self.on_error("watcher", f"internal error: {type(exc).__name__}: {exc}")
        self.cpu_s = time.thread_time()

    def _drain(self) -> bool:
        """Read up to ROUND messages (reader.py: in C where it was built). The hot path
        for a bad frame is a byte compare and a count: no lock, no message unless it
        is described. True when a frame was turned away."""
        now = self._clock()
        # Bad frames from a peer described less than a second ago are only counted,
        # here, inline: the common case under a flood, and no call is cheaper.
        bad, said, quiet_s = self.rejected.by_peer, self.rejected.said, self.rejected.say_every_s
        turned = False
        for ident, payload, extra, where in self._read(ROUND, ROUND_BYTES):
            if extra:
                turned = self._reject(ident, now, f"message of {1 + extra} parts, expected one frame", where)
                continue
            if not payload or payload[0] != BATCH_HEAD:
                n = bad.get(ident)
                if n is not None and now - said.get(ident, -quiet_s) < quiet_s:
                    bad[ident] = n + 1
                    turned = True
                else:
                    turned = self._reject(ident, now, payload, where)
                continue
            if ident in self.peers and self._inbox.full_for(payload):  # shed as it stands, not decoded first
                turned |= not self._accept(ident, None, payload, now)
                continue
            try:
                batch = self._decode(payload)
            except FrameError:
                turned = self._reject(ident, now, payload, where)
                continue
            turned |= not self._accept(ident, batch, payload, now)
        return turned

    def _deliver(self, batch: Batch, payload: bytes, ident: bytes) -> None:
        """On the ingest thread: the model has the frame, so its peer may send another."""
        try:
            self._on_batch(batch, payload)
        finally:
            self._acks.append(ident)
            if not self._ack_woken:
                self._ack_woken = True
                try:
                    os.write(self._wake_w, b"!")
                except OSError:  # the pipe is full: the reader is awake already
                    pass

    def _woken(self) -> None:
        self._ack_woken = False  # before the acks are taken: a later append wakes us again
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _send_acks(self) -> None:
        q, owed = self._acks, {}
        for _ in range(len(q)):
            ident = q.popleft()
            owed[ident] = owed.get(ident, 0) + 1
        for ident, n in owed.items():
            try:  # a ROUTER drops a frame for a peer that is gone; never blocks
                self._sock.send_multipart([ident, ack_frame(n)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _reject(self, ident: bytes, now: float, why, where: object) -> bool:
        """Count a bad frame; `why` (the frame itself, or a reason) becomes words only
        when the peer is described, and then its connection is closed too (it may come
        back: it is closed again the next time it is described)."""
        if self.rejected.add(ident, now):
            self.conns.evict(reader.fd_of(where))
            n = self.rejected.by_peer.get(ident, 0)
            reason = why if isinstance(why, str) else _why_bad(why)
            self.on_error(_name(ident), f"{reason} ({n} bad frames from it so far)")
        return True

    def _shed(self, ident: bytes, now: float, why: str) -> None:
        if self.shed.add(ident, now):
            n = self.shed.by_peer.get(ident, 0)
            self.on_error(_name(ident), f"{why}: its frames are shed ({n} so far)")

    def _accept(self, ident: bytes, batch: Batch | None, payload: bytes, now: float) -> bool:
        """A valid frame: to the model, unless its peer is one too many, sends too
        fast, or the model is too far behind (`batch` None: a known peer's frame the
        inbox had no room for, so it was not decoded; a frame from a new peer is always
        decoded first, so junk cannot take a peer's place). False when it was not taken."""
        if ident not in self.peers:
            if len(self.peers) >= self.max_peers:
                # forget peers silent for a minute (ranks of finished jobs) first
                self.peers = {k: t for k, t in self.peers.items() if now - t < PEER_IDLE_S}
            if len(self.peers) >= self.max_peers:
                # Past the cap new peers are ignored (and counted) so that a storm of
                # connections cannot crowd out the ranks already talking to us.
                self.refused += 1
                if self.refused == 1:
                    self.on_error(_name(ident), f"more than {self.max_peers} peers: ignoring new ones")
                self._acks.append(ident)  # dealt with: not taken, and the peer may go on
                return False
        self.peers[ident] = now
        if self._over_limit(ident, now):
            self._shed(ident, now, f"over {self.flood_limit} frames/s")
            self._acks.append(ident)
            return False
        if batch is None or not self._inbox.put((batch, payload, ident), cost(payload, batch_len(batch))):
            self.behind_frames += 1
            self._shed(ident, now, f"the model is {self._inbox.max_bytes >> 20} MB behind")
            self._acks.append(ident)
            return False
        self.frames += 1
        return True

    def _over_limit(self, ident: bytes, now: float) -> bool:
        """A peer sending more than the limit in one second is ignored for the rest
        of that second (counted), so it cannot starve the other ranks."""
        w = self._rate.get(ident)
        if w is None or now - w[0] >= 1.0:
            if len(self._rate) >= self.max_peers:
                self._rate.clear()
            w = self._rate[ident] = [now, 0]
        w[1] += 1
        return w[1] > self.flood_limit

    def close(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(2)
        reading = self.thread.is_alive()  # stuck in a callback: its socket stays open
        self._inbox.close()
        gate_stopped = self._gate.close()
        if gate_stopped:  # else its thread still polls the monitor: leave both open
            self.conns.close()
        if not reading and gate_stopped:  # closing a socket another thread reads frees what it reads
            self._sock.close()
            self._ctx.term()  # waits for every socket: none may be left open
        if not self._inbox.thread.is_alive():  # else it may still wake us: leave the pipe
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        if self._ipc_path and os.path.exists(self._ipc_path):
            try:
                os.unlink(self._ipc_path)
            except OSError:
                pass


def _name(ident: bytes) -> str:
    return ident.decode("utf-8", "replace")
