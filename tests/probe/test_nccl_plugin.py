"""commviz's NCCL profiler plugin, driven as NCCL drives it (issue 51).

A ctypes harness plays NCCL, in NCCL's order (tests/fake_nccl.py). Each test loads
its own copy of the library, so its ring, counters and attachment are its own.
"""

from __future__ import annotations

import ctypes as C
import shutil
import threading

import pytest

from commviz import native
from commviz.events import NcclComm, NcclOp
from commviz.probe import nccl_plugin
from commviz.probe.nccl_ops import RECORD, Assembler, parse
from tests.fake_nccl import (COLL, COLL_API, KERNEL_CH, P2P, P2P_API, Descr, FakeNccl, Profiler, _CollApi, _Coll,
                             _KernelCh, _P2p, _P2pApi)

pytestmark = pytest.mark.native

@pytest.fixture
def lib(tmp_path):
    """A private copy of the plugin, attached as the probe attaches it."""
    path = native.library(nccl_plugin.PART)
    assert path, "the plugin is not built"
    mine = tmp_path / "libnccl-profiler-commviz.so"
    shutil.copy(path, mine)
    return C.CDLL(str(mine))


def _attach(lib) -> nccl_plugin.Reader:
    lib.cvz_drain.argtypes = (C.c_void_p, C.c_int)
    lib.cvz_stats.argtypes = (C.POINTER(C.c_uint64), C.c_int)
    assert lib.cvz_attach() == RECORD.size
    return nccl_plugin.Reader(nccl_plugin.Plugin(nccl_plugin.PluginState.LOADED, lib=lib), Assembler())


def _ops(events) -> list[NcclOp]:
    return [e for e in events if isinstance(e, NcclOp)]


def test_the_plugin_lays_out_nccls_descriptor_as_nccl_documents_it(lib):
    got = (C.c_int64 * 12)()
    assert lib.cvz_abi_offsets(got, 12) == 12
    want = [C.sizeof(Descr), Descr.rank.offset,
            Descr.u.offset + _Coll.seqNumber.offset, Descr.u.offset + _Coll.count.offset,
            Descr.u.offset + _Coll.nChannels.offset, Descr.u.offset + _Coll.algo.offset,
            Descr.u.offset + _P2p.peer.offset, Descr.u.offset + _P2p.nChannels.offset,
            Descr.u.offset + _CollApi.graphCaptured.offset, Descr.u.offset + _P2pApi.graphCaptured.offset,
            Descr.u.offset + _KernelCh.pTimer.offset, Profiler.finalize.offset]
    # the plugin's descriptor also holds v6's larger copy-engine member: only its size may differ
    assert list(got)[1:] == want[1:]
    assert got[0] >= want[0]


def test_without_a_reader_init_refuses_once_so_nccl_unloads_it(lib):
    nccl = FakeNccl(lib)
    rc1, _ = nccl.init(0x1234)
    rc2, _ = nccl.init(0x5678)
    assert rc1 != 0 and rc2 != 0  # NCCL disables a plugin whose init fails
    assert len(nccl.logged) == 1 and b"no commviz probe" in nccl.logged[0]


@pytest.mark.parametrize("version", [5, 6])
def test_a_collective_is_one_op_with_ncclss_view_and_its_gpu_time(lib, version):
    reader = _attach(lib)
    nccl = FakeNccl(lib, version)
    rc, ctx = nccl.init(0xABCDEF0123456789, rank=1, nranks=4, name=b"tp")
    assert rc == 0
    assert nccl.mask.value & (COLL | P2P | KERNEL_CH | COLL_API | P2P_API) == COLL | P2P | KERNEL_CH | COLL_API | P2P_API
    task = nccl.collective(ctx, seq=7, rank=1)
    before = reader.poll()
    [comm] = before
    assert comm == NcclComm(comm.t, "abcdef0123456789", 1, 4, 1, "tp")
    assert _ops(before) == []  # enqueued, not done: its channels have not stopped
    nccl.kernel(ctx, task, 0, 1_000, 5_000)
    assert _ops(reader.poll()) == []
    nccl.kernel(ctx, task, 1, 1_200, 5_600)
    [op] = _ops(reader.poll())
    assert (op.func, op.comm, op.seq, op.count, op.dtype, op.bytes) == (
        "AllReduce", "abcdef0123456789", 7, 1024, "ncclFloat32", 4096)
    assert (op.algo, op.proto, op.channels, op.device_ns, op.root, op.captured) == ("RING", "SIMPLE", 2, 4_600,
                                                                                     -1, False)
    assert 0 <= op.enqueue_ns and op.done_t >= op.t
    assert reader.stats()["version"] == version
    nccl.finalize(ctx)
    [end] = reader.poll()
    assert end.ended and end.comm == "abcdef0123456789"


def test_sends_and_a_rooted_collective_keep_peer_and_root(lib):
    reader = _attach(lib)
    nccl = FakeNccl(lib)
    _, ctx = nccl.init(7)
    send = nccl.p2p(ctx, b"Send", peer=3, count=256)
    recv = nccl.p2p(ctx, b"Recv", peer=2, count=100, dtype=b"ncclInt64")
    bcast = nccl.collective(ctx, b"Broadcast", count=10, dtype=b"ncclUint8", root=2, channels=1)
    for h in (send, recv, bcast):
        nccl.kernel(ctx, h, 0, 10, 20)
    ops = {o.func: o for o in _ops(reader.poll())}
    assert (ops["Send"].peer, ops["Send"].bytes, ops["Send"].seq) == (3, 512, -1)
    assert (ops["Recv"].peer, ops["Recv"].bytes) == (2, 800)
    assert (ops["Broadcast"].root, ops["Broadcast"].bytes, ops["Broadcast"].peer) == (2, 10, -1)


def test_a_captured_collective_counts_every_replay(lib):
    reader = _attach(lib)
    nccl = FakeNccl(lib)
    _, ctx = nccl.init(9)
    task = nccl.collective(ctx, captured=True, channels=2)
    [capture] = _ops(reader.poll())
    assert capture.captured and capture.replays == 0 and capture.device_ns == -1
    replays = []

    def replay(i):  # each replay: NCCL's host callback posts the graph's channels again
        nccl.kernel(ctx, task, 0, 1000 * i, 1000 * i + 300)
        nccl.kernel(ctx, task, 1, 1000 * i + 10, 1000 * i + 400)

    for i in range(50):
        replay(i)
    replays += [o for o in _ops(reader.poll()) if o.captured]
    # More ordinary ops than the plugin has ordinary slots: none takes the captured one's.
    for i in range(17_000):
        nccl.collective(ctx, seq=i, channels=0)
        if i % 5000 == 0:
            reader.poll()
    reader.poll()
    for i in range(50, 100):
        replay(i)
    replays += [o for o in _ops(reader.poll()) if o.captured]
    assert len(replays) == 100 and sum(o.replays for o in replays) == 100
    assert {o.device_ns for o in replays} == {400}
    assert reader.stats()["captured"] == 1 and reader.stats()["dropped"] == 0


def test_without_kernel_events_an_op_is_done_at_its_enqueue(lib, monkeypatch):
    monkeypatch.setenv("COMMVIZ_NCCL_KERNEL", "0")
    reader = nccl_plugin.Reader(_attach(lib).lib and nccl_plugin.Plugin(nccl_plugin.PluginState.LOADED, lib=lib))
    nccl = FakeNccl(lib)
    _, ctx = nccl.init(11)
    assert not nccl.mask.value & KERNEL_CH
    nccl.collective(ctx)
    [op] = _ops(reader.poll())
    assert op.device_ns == -1 and op.done_t == op.t + op.enqueue_ns


def test_many_threads_at_once_lose_nothing_and_a_full_ring_counts_what_it_drops(lib):
    reader = _attach(lib)
    nccl = FakeNccl(lib)
    ctxs = [nccl.init(100 + i)[1] for i in range(4)]
    per_thread = 1500
    got: list = []
    stop = threading.Event()

    def launch(ctx):
        for i in range(per_thread):
            nccl.kernel(ctx, nccl.collective(ctx, seq=i, channels=1), 0, i, i + 5)

    def drain():
        while not stop.is_set():
            got.extend(reader.poll())
        got.extend(reader.poll())

    d = threading.Thread(target=drain)
    d.start()
    threads = [threading.Thread(target=launch, args=(c,)) for c in ctxs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    d.join()
    ops = _ops(got)
    assert reader.stats()["dropped"] == 0
    assert len(ops) == 4 * per_thread
    by_comm: dict[str, list[int]] = {}
    for o in ops:
        by_comm.setdefault(o.comm, []).append(o.seq)
    assert all(sorted(seqs) == list(range(per_thread)) for seqs in by_comm.values())
    # Nobody drains: the ring fills, NCCL is never held up, and every record dropped is counted.
    cap = lib.cvz_ring_capacity()
    for i in range(cap):
        nccl.collective(ctxs[0], seq=i, channels=1)  # a start and an enqueue each
    stats = reader.stats()
    assert stats["dropped"] == 2 * cap - cap
    assert len(_ops(reader.poll())) == 0  # starts whose enqueue was dropped stay pending
    assert reader.stats()["records"] == stats["records"]


def test_ops_whose_channels_never_report_count_when_their_communicator_ends(lib):
    reader = _attach(lib)
    nccl = FakeNccl(lib)
    _, ctx = nccl.init(21)
    _, other = nccl.init(22)
    nccl.p2p(ctx, b"Send", peer=0, channels=1)  # as at one rank: no KernelCh ever comes
    nccl.p2p(other, b"Recv", peer=0, channels=1)
    assert _ops(reader.poll()) == []
    nccl.finalize(ctx)
    got = reader.poll()
    [send] = _ops(got)
    assert (send.func, send.device_ns, send.done_t) == ("Send", -1, -1)
    assert got[-1].ended and len(reader.assembler.pending) == 1  # the other communicator's op waits on


def test_records_parse_whatever_a_newer_plugin_adds():
    raw = RECORD.pack(99, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, b"", b"", b"", b"")
    assert parse(raw, 1) == []
