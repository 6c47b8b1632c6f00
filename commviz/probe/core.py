"""The probe's per-process state: op ids, per-group sequence numbers, the queue to
the sender thread, and turning a wrapped call into start/end records.

Hot path budget: the caller's thread does dictionary lookups, two clock reads and
two deque appends per op. Events are built, encoded and sent on the sender thread.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import socket
import threading
import time

from commviz import ops as opcat
from commviz.launchers import local_rank
from commviz.events import E_ERROR, E_ID, E_T, END, S_ID, GroupDef, Hello, Mark, end_record, start_record
from commviz.probe.config import ProbeConfig
from commviz.probe.health import Health
from commviz.probe.names import dtype_name, reduce_name, tensor_nbytes
from commviz.probe.sender import EXIT_GRACE_S, Sender
from commviz.probe.work import Outstanding, Waiters
from commviz.trace import ring as _ring

# Per-thread state of the wrappers, one list so a call reads the thread-local once:
# tls.s[DEPTH] … A plain threading.local, not a subclass: reading an attribute of a
# subclass's instance costs ~80 ns, of a plain one ~45; a thread's first read makes
# its list (thread_state).
DEPTH = 0  # > 0 while inside a wrapped call: nested public calls are not events
WANT_INNER = 1  # the outer call's bytes are its direct children's (object collectives)
INNER_BYTES = 2
COALESCED = 3  # list collecting ops issued inside _coalescing_manager, else None


def thread_state(tls) -> list:
    try:
        return tls.s
    except AttributeError:
        st = tls.s = [0, False, 0, None]
        return st


class GroupInfo:
    __slots__ = ("pg", "gid", "ranks", "size", "seq", "p2p_seq", "backend")

    def __init__(self, pg, gid: str, ranks: list[int], backend: str) -> None:
        self.pg = pg  # held so id(pg) is never reused while we know it
        self.gid = gid
        self.ranks = ranks
        self.size = len(ranks)
        self.seq = 0
        # per direction (0 send, 1 recv), peer -> next seq: an int key hashes and
        # compares in a few instructions, a (direction, peer) tuple in a few hundred
        self.p2p_seq: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self.backend = backend


class Rec:
    """An op between its start and its end."""

    __slots__ = ("id", "op", "t0", "peer", "cuda", "backend")

    def __init__(self, op_id, op, t0, peer, cuda, backend) -> None:
        self.id = op_id
        self.op = op
        self.t0 = t0
        self.peer = peer
        self.cuda = cuda
        self.backend = backend


def _backend_of(pg, dev: int):
    """The backend that runs `pg`'s ops on CUDA device `dev` (ProcessGroupNCCL: its
    get_error() says whether the watchdog found the communicator failed)."""
    import torch

    return pg._get_backend(torch.device("cuda", dev))


def _no_ring_end(op_id: int, t: int, failed: bool = False) -> None:
    pass


class Probe:
    def __init__(self, cfg: ProbeConfig) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self.cfg = cfg
        self.dist = dist
        self.c10d = c10d
        self.health = Health()
        self.queue: collections.deque = collections.deque()
        self.tls = threading.local()
        self.ids = itertools.count()
        self.groups: dict[int, GroupInfo] = {}
        self.started = False
        self.start_failed = False
        self.sender: Sender | None = None
        self.sampler = None  # SamplerThread on local rank 0
        self.hello: Hello | None = None
        self.rank = -1
        self._start_lock = threading.Lock()
        self._track_mode: dict[tuple[str, str], str] = {}
        self.late_patches: list = []  # run once torch is fully imported (probe start)
        self.kernels = None  # dispatcher kernels (probe/kernels.py), installed at start
        self.default_group: GroupInfo | None = None  # cleared when the default group is destroyed
        self.ring = None  # crash ring writer (trace/ring.py)
        self.ring_start = None  # its start/end writers while it is open, called by the hot path
        self.ring_end = _no_ring_end  # never None: an op that began with the ring may end after it closed
        self.cuda_side = None  # CudaSide (probe/cuda.py), made at start
        self.nccl_plugin = None  # nccl_plugin.Plugin, set at install, before NCCL initializes
        self.nccl_reader = None  # nccl_plugin.Reader, made at start
        self.cuda_module = None  # torch.cuda, or a stand-in that models it (tests)
        self.waiters = Waiters(self._work_done)
        self.outstanding = Outstanding()  # CPU completions on torch's threads, settled at exit
        self.wrapper_codes: set = set()  # code objects of our wrappers: find waiting threads by them
        # torch's own functions under the C wrapper (patch._c_wrapper), which leaves no
        # frame: threads are found by these too, but their frames are not skipped
        self.find_codes: set = set()
        from commviz.probe.audit import Auditor

        self.auditor = Auditor(self)  # reads torch's flight recorder at exit and on long ops
        try:
            self.waiters.install(c10d.Work)
            self.wrapper_codes.add(c10d.Work.wait.__code__)
        except Exception as exc:
            self.health.internal("Work.wait patch", exc)

    # ------------------------------------------------------------- lifecycle

    def ensure_started(self) -> bool:
        if self.started:
            return True
        if self.start_failed or not self.dist.is_initialized():
            return False
        with self._start_lock:
            if not self.started and not self.start_failed:
                try:
                    self._start()
                except Exception as exc:
                    # Said once; the job runs on uninstrumented rather than retrying per op.
                    self.start_failed = True
                    self.health.internal("start", exc)
        return self.started

    def _start(self) -> None:
        dist = self.dist
        rank = dist.get_rank()
        self.rank = rank
        ring_path = self._open_ring(rank)
        hello = self._hello(rank, dist.get_world_size(), str(dist.get_backend()))
        hello.ring = ring_path
        self.hello = hello  # the sender's too: a reconnecting watcher gets it as updated
        sampler = None
        from commviz.probe.samplers import HostSampler, SamplerThread, local_rank_from_env, should_sample

        if self.cfg.samples and should_sample(rank, local_rank_from_env()):
            sampler = SamplerThread(HostSampler(warn=self.health.warn_once), self.push, self.health, hello.host)
        from commviz.probe.cuda import CudaSide

        if self.cuda_side is None:  # one per process: CUDAGraph is patched once, for it
            self.cuda_side = CudaSide(self._cuda(), self.push, self.health, self._device_seen, _backend_of)
        else:
            self.cuda_side.resume()
        self.sender = Sender(rank, hello, self.cfg.addr, self.cfg.trace_dir, self.health, self.queue,
                             self.cfg.flush_interval_s, self.cfg.stack_after_s, self.capture_stack,
                             self.capture_quiet_stacks, sources=self._nccl_sources())
        self.sender.start()
        self.sampler = sampler
        if sampler is not None:
            sampler.start()
        self.started = True
        for patch in self.late_patches:
            try:
                patch()
            except Exception as exc:
                self.health.internal("late patch", exc)
        self.late_patches.clear()
        atexit.register(self.shutdown)

    def _open_ring(self, rank: int) -> str:
        if not self.cfg.ring:
            return ""
        try:
            if self.cfg.trace_dir:
                os.makedirs(self.cfg.trace_dir, exist_ok=True)
                path = os.path.join(self.cfg.trace_dir, f"rank-{rank}{_ring.SUFFIX}")
            elif os.environ.get("COMMVIZ_RING_DIR"):
                # set by `commviz record/watch -- CMD`: it reads what dead ranks left here
                path = os.path.join(os.environ["COMMVIZ_RING_DIR"], f"ring-{os.getpid()}{_ring.SUFFIX}")
            else:
                from commviz.transport.address import private_dir

                path = os.path.join(private_dir(), f"ring-{os.getpid()}{_ring.SUFFIX}")
            self.ring = _ring.RingWriter(path, rank)
        except Exception as exc:
            self.health.warn_once("ring", f"no crash ring ({exc}); a rank that aborts may lose its last ops")
            return ""
        self.ring_start, self.ring_end = self.ring.start, self.ring.end
        return path

    def _cuda(self):
        if self.cuda_module is None:
            import torch.cuda

            return torch.cuda
        return self.cuda_module

    def _hello(self, rank: int, world: int, backend: str) -> Hello:
        import torch

        import commviz

        # Which GPU is learnt from the first CUDA tensor (_device_seen): the current
        # device here is wrong for scripts that call set_device later or never, and
        # the backend string can be "undefined" or "cpu:gloo,cuda:nccl".
        device = "cpu"
        try:
            if ("nccl" in backend or backend == "undefined") and self._cuda().is_available():
                device = "cuda"  # which one: not seen yet
        except Exception as exc:
            self.health.internal("device info", exc)
        env = os.environ
        job = ":".join(
            [env.get("TORCHELASTIC_RUN_ID", ""), env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")]
        )
        return Hello(
            rank=rank,
            local_rank=local_rank(env) or 0,
            world_size=world,
            host=socket.gethostname(),
            pid=os.getpid(),
            backend=backend,
            device=device,
            torch_version=str(torch.__version__),
            commviz_version=commviz.__version__,
            job=job,
            mono_ns=time.monotonic_ns(),
            wall_ns=time.time_ns(),
        )

    def _device_seen(self, index: int) -> None:
        """The first CUDA tensor this rank passed (caller's thread, once per device):
        say hello again with its GPU. A rank using several GPUs names the first."""
        hello = self.hello
        if hello is None or hello.device.startswith("cuda:"):
            return
        props = self._cuda().get_device_properties(index)  # host-side, cached by torch
        hello.device = f"cuda:{index}"
        hello.cuda_uuid = f"GPU-{props.uuid}" if getattr(props, "uuid", None) else None
        if getattr(props, "pci_bus_id", None) is not None:
            hello.pci_bus_id = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        self.push(hello)

    def _nccl_sources(self) -> list:
        """NCCL's own view, where its profiler plugin was set up at install
        (probe/nccl_plugin.py); a user's own plugin is said once, and left alone."""
        from commviz.probe.nccl_plugin import PluginState, Reader

        plugin = self.nccl_plugin
        if plugin is None:
            return []
        if plugin.state is PluginState.USER_PLUGIN:
            self.health.warn_once("nccl plugin", f"NCCL's own events are not seen: {plugin.why}")
        if plugin.state is not PluginState.LOADED:
            return []
        if self.nccl_reader is None:  # one per process: the plugin's ring is
            self.nccl_reader = Reader(plugin)
        return [self.nccl_reader.poll]

    def shutdown(self, reason: str = "exit") -> None:
        s = self.sender
        if s is None:
            return
        left = self.outstanding.settle()
        if left:
            self.health.warn_once("exit", f"{left} async op(s) still in flight at exit; "
                                          "their ends are not recorded")
        try:
            self.auditor.now()  # before the last flush, which carries it
        except Exception as exc:
            self.health.internal("audit", exc)
        self.sender = None
        self.started = False
        try:
            if self.cuda_side is not None:
                self.cuda_side.stop(EXIT_GRACE_S)  # its last ends reach the final flush
            if self.sampler is not None:
                self.sampler.stop()
            s.stop(reason)
        except Exception as exc:
            self.health.internal("shutdown", exc)
        ring, self.ring, self.ring_start, self.ring_end = self.ring, None, None, _no_ring_end
        if ring is not None:
            ring.close(delete=True)  # everything reached the trace or the watcher

    # ------------------------------------------------------------ recording

    def push(self, rec) -> None:
        q = self.queue
        if len(q) < self.cfg.queue_cap:
            q.append(rec)
        else:
            self.health.dropped += 1
        if self.ring_start is not None and type(rec) is tuple:
            try:
                if rec[0] == END:
                    self.ring_end(rec[E_ID], rec[E_T], bool(rec[E_ERROR]))
                else:
                    self.ring_start(rec[S_ID], rec)
            except Exception as exc:
                self.health.internal("ring", exc)

    def group_info(self, pg) -> GroupInfo | None:
        if pg is None:
            info = self.default_group
            if info is not None:
                return info
            pg = self.c10d._get_default_group()
            info = self.default_group = self.group_info(pg)
            return info
        info = self.groups.get(id(pg))
        if info is not None and info.pg is pg:
            return info
        if pg is self.c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        ranks = list(self.dist.get_process_group_ranks(pg))
        try:
            backend = str(self.dist.get_backend(pg))
        except Exception:
            backend = ""
        gid = self._group_id(pg)
        info = GroupInfo(pg, gid, ranks, backend)
        self.groups[id(pg)] = info
        self.push(GroupDef(gid, ranks, backend, getattr(pg, "group_desc", "") or ""))
        return info

    def _group_id(self, pg) -> str:
        """torch's name for the group. A ProcessGroup written in Python (a custom
        backend registered with `dist.Backend.register_backend`) may have none set:
        `group_name` raises; torch's own table of names has it then."""
        try:
            return str(pg.group_name)
        except RuntimeError:
            pass
        name = getattr(getattr(self.c10d, "_world", None), "pg_names", {}).get(pg)
        return str(name) if name else f"pg{len(self.groups)}"

    def capture_stack(self, op_id: int):
        """The stack of the thread waiting inside a wrapped call (sender thread)."""
        from commviz.events import Stack
        from commviz.probe import stacks

        try:
            self.auditor.soon()
        except Exception as exc:
            self.health.internal("audit", exc)
        try:
            found = stacks.threads_inside(self.wrapper_codes | self.find_codes)
            if not found:
                # e.g. blocked in a C++ Work.wait() of an async collective: the main
                # thread is the best guess at who is waiting.
                import sys
                import threading

                main = threading.main_thread()
                frame = sys._current_frames().get(main.ident)
                if frame is None or main.ident == threading.get_ident():
                    return None
                found = [(main.name, frame)]
            thread, frame = found[0]
            return Stack(time.monotonic_ns(), op_id, thread, stacks.frames_of(frame, self.wrapper_codes),
                         stacks.lib_dirs())
        except Exception as exc:
            self.health.internal("stack capture", exc)
            return None

    def capture_quiet_stacks(self) -> list:
        """Every thread's stack but commviz's own (sender thread): the rank started no
        op for a while, so wherever it is, it may be what the others wait for."""
        from commviz.events import QUIET_OP, Stack
        from commviz.probe import stacks

        try:
            t = time.monotonic_ns()
            dirs = stacks.lib_dirs()
            return [Stack(t, QUIET_OP, name, stacks.frames_of(frame, self.wrapper_codes), dirs)
                    for name, frame in stacks.all_threads()]
        except Exception as exc:
            self.health.internal("stack capture", exc)
            return []

    def mark(self, text: str) -> None:
        if self.ensure_started():
            self.push(Mark(time.monotonic_ns(), str(text)))

    def begin(self, spec: opcat.OpSpec, am, args, kwargs) -> Rec | None:
        if not self.started and not self.ensure_started():
            return None
        g = self.group_info(am.group(args, kwargs))
        if g is None:
            return None  # this rank is not in the group: torch does nothing either
        nbytes, dtype, shape, x = am.payload(args, kwargs, g.size)
        peer = root = -1
        if spec.kind == opcat.P2P:
            peer = am.rooted(args, kwargs, g)
            seq = self.next_seq(g, spec.direction, peer)
        else:
            seq = self.next_seq(g)
            if spec.root_arg:
                root = am.rooted(args, kwargs, g)
        red = am.reduce_op(args, kwargs)
        is_async = am.is_async(args, kwargs)
        op_id = next(self.ids)
        t0 = time.monotonic_ns()
        self.push(start_record(op_id, t0, spec.name, g.gid, seq, nbytes, dtype, shape, peer, root, is_async,
                               reduce_name(red) if red is not None else ""))
        return Rec(op_id, spec.name, t0, peer, self.cuda_side.begin(x, g, peer) if x is not None else False,
                   g.backend)

    def next_seq(self, g: GroupInfo, direction: str = "", peer: int = -1) -> int:
        if direction:
            seqs = g.p2p_seq[0 if direction == "send" else 1]
            seq = seqs.get(peer, 0)
            seqs[peer] = seq + 1
            return seq
        seq = g.seq
        g.seq = seq + 1
        return seq

    def begin_p2pop(self, p2p) -> Rec | None:
        """One P2POp of a batch_isend_irecv: its own event, marked batched."""
        if not self.started and not self.ensure_started():
            return None
        g = self.group_info(p2p.group)
        if g is None:
            return None
        name = "isend" if getattr(p2p.op, "__name__", "") == "isend" else "irecv"
        t = p2p.tensor
        peer = int(p2p.peer)
        seq = self.next_seq(g, "send" if name == "isend" else "recv", peer)
        cuda = self.cuda_side.begin(t, g, peer) if t.is_cuda else False
        op_id = next(self.ids)
        t0 = time.monotonic_ns()
        self.push(start_record(op_id, t0, name, g.gid, seq, tensor_nbytes(t), dtype_name(t.dtype), list(t.shape), peer,
                               is_async=True, batched=True))
        return Rec(op_id, name, t0, peer, cuda, g.backend)

    def begin_bucket(self, pg, bucket) -> Rec | None:
        """A DDP gradient bucket about to be reduced by the comm hook."""
        if not self.started and not self.ensure_started():
            return None
        g = self.group_info(pg)
        if g is None:
            return None
        buf = bucket.buffer()
        nbytes = tensor_nbytes(buf)  # before the seq is taken: a fault here leaves no gap
        seq = self.next_seq(g)
        cuda = self.cuda_side.begin(buf, g) if buf.is_cuda else False
        op_id = next(self.ids)
        t0 = time.monotonic_ns()
        self.push(start_record(op_id, t0, "ddp_bucket", g.gid, seq, nbytes, dtype_name(buf.dtype), list(buf.shape),
                               is_async=True, reduce_op="SUM", bucket=bucket.index(), params=len(bucket.parameters())))
        return Rec(op_id, "ddp_bucket", t0, -1, cuda, g.backend)

    def end_now(self, rec: Rec, error: str = "") -> None:
        self.push(end_record(rec.id, time.monotonic_ns(), error))

    def fail(self, rec: Rec, exc: BaseException) -> None:
        self.push(end_record(rec.id, time.monotonic_ns(), f"{type(exc).__name__}: {exc}"[:500]))

    def complete(self, rec: Rec, result, inner_bytes: int | None) -> None:
        nbytes = inner_bytes if inner_bytes is not None else -1
        peer = -1
        if rec.peer < 0 and isinstance(result, int) and not isinstance(result, bool):
            peer = result  # recv from any source returns the sender's rank
        coalesced = thread_state(self.tls)[COALESCED]
        if coalesced is not None:
            coalesced.append(rec)  # torch only queued it; it runs when the manager exits
            return
        if result is not None and hasattr(result, "wait") and hasattr(result, "is_completed"):
            self.track(rec, result, nbytes)
            return
        if rec.cuda:
            self.cuda_side.end_sync(rec.id, rec.cuda, rec.t0, nbytes)
            return
        self.push(end_record(rec.id, time.monotonic_ns(), "", nbytes, peer))

    # ---------------------------------------------------- async completion

    def _work_done(self, op_id: int, t: int, err: str) -> None:
        self.push(end_record(op_id, t, err))
        self.outstanding.end(op_id)

    def track(self, rec: Rec, work, nbytes: int = -1, coalesced: bool = False) -> None:
        """Stamp the end of an async op when its Work completes, however the backend
        lets us learn that (see probe/work.py). CUDA work never takes the CPU modes:
        the waiter's C++ wait() on its own thread would leave the user's stream not
        waiting for the op. `coalesced`: the Work `_end_coalescing` returned, whose
        future older torch leaves unset (probe/cuda.py, `COALESCED_FUTURE_SINCE`)."""
        if rec.cuda:
            self.cuda_side.end_work(rec.id, rec.cuda, work, rec.t0, nbytes, coalesced)
            return
        key = (rec.backend, rec.op)
        mode = self._track_mode.get(key, "future")
        if mode == "future":
            try:
                fut = work.get_future()
            except RuntimeError:
                # gloo p2p: "Work::getFuture not implemented"
                self._track_mode[key] = "waiter"
            else:
                self._track_mode[key] = "future"
                self.track_future(rec, fut, nbytes)
                return
        self.outstanding.begin(rec.id)
        self.waiters.track(rec.id, work)

    def track_future(self, rec: Rec, fut, nbytes: int = -1) -> None:
        """A torch Future: on CPU its callback is the completion. A CUDA future's
        callback runs once the work is enqueued, on a stream that waits for it: see
        probe/cuda.py."""
        if rec.cuda:
            self.cuda_side.end_future(rec.id, rec.cuda, fut, time.monotonic_ns() - rec.t0, nbytes)
            return
        op_id, push, outstanding = rec.id, self.push, self.outstanding

        def done(f):
            t = time.monotonic_ns()
            err = ""
            try:
                f.value()
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"[:500]
            try:
                push(end_record(op_id, t, err, nbytes))
            finally:
                outstanding.end(op_id)

        outstanding.begin(op_id)
        fut.add_done_callback(done)
