"""A stand-in for NCCL, for driving commviz's profiler plugin as NCCL drives it
(tests/probe/test_nccl_plugin.py, and a job under the probe in tests/integration).

It looks the plugin up by NCCL's symbol names, calls init per communicator, then for
each op the calls NCCL 2.28-2.29 makes, in its order (src/plugin/profiler.cc,
src/enqueue.cc): the API event, the task event (collective or p2p) with its parent,
the task's stop at enqueue, then, as NCCL's proxy thread does, each channel's
KernelCh start, its KernelChStop state with the GPU timer, and its stop. The
descriptor is laid out here from NCCL's documentation (plugins/profiler/README.md),
apart from the plugin's own header, so a layout slip in either shows."""

from __future__ import annotations

import ctypes as C

COLL_API, P2P_API, COLL, P2P, KERNEL_CH = 1 << 9, 1 << 10, 1 << 1, 1 << 2, 1 << 6
KERNEL_CH_STOP = 22


class _GroupApi(C.Structure):
    _fields_ = [("graphCaptured", C.c_bool), ("groupDepth", C.c_int)]


class _CollApi(C.Structure):
    _fields_ = [("func", C.c_char_p), ("count", C.c_size_t), ("datatype", C.c_char_p), ("root", C.c_int),
                ("stream", C.c_void_p), ("graphCaptured", C.c_bool)]


class _P2pApi(C.Structure):
    _fields_ = [("func", C.c_char_p), ("count", C.c_size_t), ("datatype", C.c_char_p), ("stream", C.c_void_p),
                ("graphCaptured", C.c_bool)]


class _Coll(C.Structure):
    _fields_ = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p),
                ("recvBuff", C.c_void_p), ("count", C.c_size_t), ("root", C.c_int), ("datatype", C.c_char_p),
                ("nChannels", C.c_uint8), ("nWarps", C.c_uint8), ("algo", C.c_char_p), ("proto", C.c_char_p),
                ("parentGroup", C.c_void_p)]


class _P2p(C.Structure):
    _fields_ = [("func", C.c_char_p), ("buff", C.c_void_p), ("datatype", C.c_char_p), ("count", C.c_size_t),
                ("peer", C.c_int), ("nChannels", C.c_uint8), ("parentGroup", C.c_void_p)]


class _KernelCh(C.Structure):
    _fields_ = [("channelId", C.c_uint8), ("pTimer", C.c_uint64)]


class _U(C.Union):
    _fields_ = [("groupApi", _GroupApi), ("collApi", _CollApi), ("p2pApi", _P2pApi), ("coll", _Coll),
                ("p2p", _P2p), ("kernelCh", _KernelCh)]


class Descr(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", C.c_uint64), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", _U)]


LOGGER = C.CFUNCTYPE(None, C.c_int, C.c_ulong, C.c_char_p, C.c_int, C.c_char_p)
INIT = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_uint64, C.POINTER(C.c_int), C.c_char_p, C.c_int, C.c_int,
                   C.c_int, LOGGER)
START = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(Descr))
STOP = C.CFUNCTYPE(C.c_int, C.c_void_p)


class _KchArgs(C.Union):
    _fields_ = [("pTimer", C.c_uint64), ("transSize", C.c_size_t)]


STATE = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(_KchArgs))


class Profiler(C.Structure):
    _fields_ = [("name", C.c_char_p), ("init", INIT), ("startEvent", START), ("stopEvent", STOP),
                ("recordEventState", STATE), ("finalize", STOP)]


class FakeNccl:
    """The calls NCCL makes, in its order, on one loaded copy of the plugin."""

    def __init__(self, lib, version: int = 5) -> None:
        self.lib = lib
        self.prof = Profiler.in_dll(lib, f"ncclProfiler_v{version}")
        self.mask = C.c_int(0)
        self.logged: list[bytes] = []
        self._logger = LOGGER(lambda level, flags, file, line, fmt: self.logged.append(fmt))

    def init(self, comm: int, rank: int = 0, nranks: int = 2, name: bytes | None = None):
        ctx = C.c_void_p()
        rc = self.prof.init(C.byref(ctx), comm, C.byref(self.mask), name, 1, nranks, rank, self._logger)
        return rc, ctx

    def start(self, ctx, d: Descr) -> C.c_void_p:
        h = C.c_void_p()
        assert self.prof.startEvent(ctx, C.byref(h), C.byref(d)) == 0
        return h

    def stop(self, h) -> None:
        assert self.prof.stopEvent(h) == 0

    def collective(self, ctx, func=b"AllReduce", count=1024, dtype=b"ncclFloat32", seq=0, channels=2,
                   captured=False, root=0, rank=0):
        """A collective up to its enqueue; returns its task handle (the KernelCh parent)."""
        api = Descr(type=COLL_API, rank=rank)
        api.collApi.func, api.collApi.count, api.collApi.datatype = func, count, dtype
        api.collApi.graphCaptured = captured
        h_api = self.start(ctx, api)
        task = Descr(type=COLL, parentObj=h_api, rank=rank)
        c = task.coll
        c.seqNumber, c.func, c.count, c.root, c.datatype = seq, func, count, root, dtype
        c.nChannels, c.nWarps, c.algo, c.proto = channels, 16, b"RING", b"SIMPLE"
        h_task = self.start(ctx, task)
        self.stop(h_api)
        self.stop(h_task)
        return h_task

    def p2p(self, ctx, func=b"Send", peer=1, count=256, dtype=b"ncclBfloat16", channels=1, rank=0):
        api = Descr(type=P2P_API, rank=rank)
        api.p2pApi.func, api.p2pApi.count, api.p2pApi.datatype = func, count, dtype
        h_api = self.start(ctx, api)
        task = Descr(type=P2P, parentObj=h_api, rank=rank)
        task.p2p.func, task.p2p.count, task.p2p.datatype, task.p2p.peer = func, count, dtype, peer
        task.p2p.nChannels = channels
        h_task = self.start(ctx, task)
        self.stop(h_api)
        self.stop(h_task)
        return h_task

    def kernel(self, ctx, parent, channel: int, gpu_start: int, gpu_stop: int) -> None:
        """What NCCL's proxy thread does when a channel's kernel reports its end."""
        d = Descr(type=KERNEL_CH, parentObj=parent)
        d.kernelCh.channelId, d.kernelCh.pTimer = channel, gpu_start
        h = self.start(ctx, d)
        assert self.prof.recordEventState(h, KERNEL_CH_STOP, C.byref(_KchArgs(pTimer=gpu_stop))) == 0
        self.stop(h)

    def finalize(self, ctx) -> None:
        assert self.prof.finalize(ctx) == 0
