"""Event builders and waits shared by the unit tests."""

import socket
import threading
import time

import zmq

from commviz.events import GroupDef, Hello, OpEnd, OpStart
from commviz.transport.conns import stop_monitor

WALL0 = 1_700_000_000_000_000_000


def hello(rank: int, world: int = 2, pid: int | None = None, job: str = "job", mono: int = 0, host: str = "h", wall: int | None = None) -> Hello:
    return Hello(
        rank=rank, local_rank=rank, world_size=world, host=host, pid=pid if pid is not None else 1000 + rank,
        backend="gloo", device="cpu", torch_version="2.13.0", commviz_version="0.1.0", job=job,
        mono_ns=mono, wall_ns=WALL0 + mono if wall is None else wall,
    )


def group(gid: str = "0", ranks=(0, 1)) -> GroupDef:
    return GroupDef(gid, list(ranks), "gloo")


def op(op_id: int, t0: int, t1: int, name: str = "all_reduce", gid: str = "0", seq: int = 0, nbytes: int = 4096, **kw):
    return [OpStart(op_id, t0, name, gid, seq, nbytes, "float32", [nbytes // 4], **kw), OpEnd(op_id, t1)]


class FakeClock:
    """Time that passes only when told: by the test (`tick`), or by the code under
    test through `sleep`, so a timer is stepped past instead of outlasted in real
    time, however loaded the machine. Give it as `clock=` and `sleep` as `sleep=`."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t
        self._lock = threading.Lock()  # a test and the code's thread may both move it

    def __call__(self) -> float:
        return self.t

    def tick(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds

    def sleep(self, seconds: float) -> None:
        self.tick(seconds)
        time.sleep(0)  # a deadline loop on another thread leaves this one the GIL


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def settled(value, quiet_s=0.3) -> bool:
    """True once `value()` has not changed for `quiet_s`."""
    v = value()
    time.sleep(quiet_s)
    return value() == v


class Handshakes:
    """How many connections a zmq socket has made (watched from before it connects):
    zmq connects a peer again after the watcher closed it, and a test waits for that
    instead of sleeping through the reconnect interval. Close it before the context."""

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.n = 0

    def __call__(self) -> int:
        while self._mon.poll(0):
            self._mon.recv_multipart()
            self.n += 1
        return self.n

    def close(self) -> None:
        stop_monitor(self._sock, self._mon)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
