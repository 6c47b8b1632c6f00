"""NCCL's profiler records, made into ops: pure logic, no ctypes, no clock.

The plugin (probe/_ncclprof.c) writes what NCCL tells it as it happens: a
communicator's init, an op's start (with NCCL's own name, count, datatype, algorithm,
protocol and channels), its enqueue, and each channel's kernel stop with the GPU
timer at both ends. An op is done when every one of its channels has stopped, or at
its enqueue when no kernel will report (kernel events off, or copy-engine ops). A
collective captured into a CUDA graph reports through the same handle at every
replay, so it stays known, and each full round of its channels is one replay.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

from commviz.events import NcclComm, NcclOp


class RecKind(IntEnum):
    INIT = 1
    FINI = 2
    START = 3
    ENQ = 4
    KSTOP = 5


# The plugin's cvz_rec, 128 bytes (probe/_ncclprof.c): kind, is_p2p, captured,
# nchannels, nwarps, serial, comm, t, a, b, rank, peer, func, dtype, algo, proto.
RECORD = struct.Struct("<I4BQQqQQii16s16s16s8s16x")
assert RECORD.size == 128

# NCCL's datatype names (ncclDatatypeToString) and their sizes in bytes.
DTYPE_BYTES = {
    "ncclInt8": 1, "ncclUint8": 1, "ncclInt32": 4, "ncclUint32": 4, "ncclInt64": 8, "ncclUint64": 8,
    "ncclFloat16": 2, "ncclFloat32": 4, "ncclFloat64": 8, "ncclBfloat16": 2,
    "ncclFloat8e4m3": 1, "ncclFloat8e5m2": 1,
}
ROOTED = frozenset({"Broadcast", "Reduce", "Gather", "Scatter"})  # NCCL's root means something only here
MAX_PENDING = 65536  # ops NCCL started whose end has not come; past this the oldest is let go, counted


@dataclass(frozen=True)
class Record:
    kind: RecKind
    is_p2p: bool
    captured: bool
    nchannels: int
    nwarps: int
    serial: int
    comm: int
    t: int
    a: int
    b: int
    rank: int
    peer: int
    func: str
    dtype: str
    algo: str
    proto: str


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse(buf: bytes | memoryview, n: int) -> list[Record]:
    """The first `n` records of `buf`; a record of a kind this reader does not know
    is skipped (a newer plugin beside an older probe)."""
    out = []
    for (kind, is_p2p, captured, nch, nwarps, serial, comm, t, a, b, rank, peer, func, dtype, algo,
         proto) in RECORD.iter_unpack(memoryview(buf)[: n * RECORD.size]):
        try:
            k = RecKind(kind)
        except ValueError:
            continue
        if k is RecKind.INIT:  # the comm's name fills the four text fields
            name = _text(func + dtype + algo + proto)
            out.append(Record(k, False, False, 0, 0, serial, comm, t, a, b, rank, peer, name, "", "", ""))
            continue
        out.append(Record(k, bool(is_p2p), bool(captured), nch, nwarps, serial, comm, t, a, b, rank, peer,
                          _text(func), _text(dtype), _text(algo), _text(proto)))
    return out


def comm_name(comm: int) -> str:
    return f"{comm:016x}"


@dataclass
class _Pending:
    start: Record
    enqueued_t: int = -1
    stopped: int = 0  # channels stopped in this round
    gpu_start: int = 0
    gpu_stop: int = 0
    last_t: int = -1
    emitted: bool = False  # a captured op's capture has been reported


@dataclass
class Assembler:
    """Records in, events out. `kernel_events`: whether the plugin asked NCCL for
    KernelCh events; without them an op is done at its enqueue."""

    kernel_events: bool = True
    pending: dict[int, _Pending] = field(default_factory=dict)
    let_go: int = 0  # pending ops dropped past MAX_PENDING
    orphans: int = 0  # enqueue or kernel records of an op whose start was lost

    def feed(self, records: list[Record]) -> list:
        out: list = []
        for r in records:
            kind = r.kind
            if kind is RecKind.START:
                if len(self.pending) >= MAX_PENDING:
                    del self.pending[next(iter(self.pending))]
                    self.let_go += 1
                self.pending[r.serial] = _Pending(r)
            elif kind is RecKind.ENQ:
                p = self.pending.get(r.serial)
                if p is None:
                    self.orphans += 1
                    continue
                p.enqueued_t = r.t
                if not self._kernel_will_report(p):
                    out.append(self._op(p, device_ns=-1, done_t=r.t, replays=0))
                    del self.pending[r.serial]
                elif p.start.captured:
                    out.append(self._op(p, device_ns=-1, done_t=-1, replays=0))  # the capture itself
                    p.emitted = True
                elif p.stopped >= p.start.nchannels:  # its channels beat its enqueue
                    out.append(self._done(p))
            elif kind is RecKind.KSTOP:
                p = self.pending.get(r.serial)
                if p is None:
                    self.orphans += 1
                    continue
                if p.stopped == 0 or r.a < p.gpu_start:
                    p.gpu_start = r.a
                p.gpu_stop = max(p.gpu_stop, r.b)
                p.stopped += 1
                p.last_t = r.t
                if p.stopped >= p.start.nchannels and (p.enqueued_t >= 0 or p.start.captured):
                    out.append(self._done(p))
            elif kind is RecKind.INIT:
                out.append(NcclComm(r.t, comm_name(r.comm), r.rank, r.a, r.b, r.func))
            elif kind is RecKind.FINI:
                out.extend(self._left_at_end(r.comm))
                out.append(NcclComm(r.t, comm_name(r.comm), r.rank, -1, ended=True))
        return out

    def _left_at_end(self, comm: int) -> list[NcclOp]:
        """A communicator's ops still waiting for their channels when it ends: NCCL
        enqueued them and will say no more, so each counts, with no GPU time (an op
        whose channels never all report, as at one rank, is still an op NCCL ran)."""
        out = []
        for serial, p in list(self.pending.items()):
            if p.start.comm != comm:
                continue
            del self.pending[serial]
            if p.enqueued_t >= 0 and not p.start.captured:
                out.append(self._op(p, device_ns=-1, done_t=-1, replays=0))
        return out

    def _kernel_will_report(self, p: _Pending) -> bool:
        return self.kernel_events and p.start.nchannels > 0

    def _done(self, p: _Pending) -> NcclOp:
        s = p.start
        replay = s.captured
        op = self._op(p, device_ns=max(0, p.gpu_stop - p.gpu_start), done_t=p.last_t, replays=int(replay))
        if replay:  # stays known for the next replay
            p.stopped, p.gpu_start, p.gpu_stop = 0, 0, 0
        else:
            del self.pending[s.serial]
        return op

    def _op(self, p: _Pending, device_ns: int, done_t: int, replays: int) -> NcclOp:
        s = p.start
        size = DTYPE_BYTES.get(s.dtype)
        return NcclOp(
            t=s.t, comm=comm_name(s.comm), func=s.func, count=s.b, dtype=s.dtype,
            bytes=s.b * size if size is not None else -1,
            seq=-1 if s.is_p2p else s.a, peer=s.peer if s.is_p2p else -1,
            root=s.peer if not s.is_p2p and s.func in ROOTED else -1,
            algo=s.algo, proto=s.proto, channels=s.nchannels,
            enqueue_ns=p.enqueued_t - s.t if p.enqueued_t >= 0 else -1,
            device_ns=device_ns, done_t=done_t, captured=s.captured, replays=replays,
        )
