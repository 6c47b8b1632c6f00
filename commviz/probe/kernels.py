"""Collectives issued below Python, seen at torch's dispatcher.

A compiled graph calls `torch.ops._c10d_functional.*` directly: no Python function
of torch.distributed runs, so no wrapper can see it. Every such call goes through the
dispatcher, and the dispatcher runs a BackendSelect kernel, if one is registered, for
any real tensor before the backend's: ours records the event and redispatches to
torch's own kernel. Tracing never reaches it (fake and functional tensors are taken
by higher keys; the meta tensors a fake kernel may run are skipped), so graphs are
unchanged. The event ends at the op's `wait_tensor`, which every functional
collective's result goes through before use (or when its storage is filled again).

A call made inside a wrapped one (eager funcol, whose Python wrapper already
recorded it) passes straight through: one event per collective.

DDP's reducer rebuilds its buckets once, on the first forward after the first
backward, by two broadcasts from C++ (`sync_bucket_indices`). Each ends when the Work
the kernel passes back completes (`Work.unbox` of it), so on CUDA it is timed on the
device like any async broadcast. A permanent kernel on
`c10d::broadcast_` would tax every eager broadcast (~2 µs of Python per call), so it
is registered only around the forwards that can rebuild (`rebuild_window`), ~60 µs
each, and only until DDP says the buckets were rebuilt.
"""

from __future__ import annotations

import contextlib
import time
import weakref

from commviz.events import end_record
from commviz.probe import calls
from commviz.probe.core import DEPTH, thread_state
from commviz.probe.names import dtype_name

# op -> (how its bytes are counted, position of the reduce op or -1, of the group name)
#   tensor: nbytes of the input; gathered: × group size; list / list_gathered: over inputs
OPS = {
    "all_reduce": ("tensor", 1, 2),
    "all_reduce_": ("tensor", 1, 2),
    "all_reduce_coalesced": ("list", 1, 2),
    "all_reduce_coalesced_": ("list", 1, 2),
    "all_gather_into_tensor": ("gathered", -1, 2),
    "all_gather_into_tensor_out": ("gathered", -1, 2),
    "all_gather_into_tensor_coalesced": ("list_gathered", -1, 2),
    "reduce_scatter_tensor": ("tensor", 1, 3),
    "reduce_scatter_tensor_out": ("tensor", 1, 3),
    "reduce_scatter_tensor_coalesced": ("list", 1, 3),
    "all_to_all_single": ("tensor", -1, 3),
    "broadcast": ("tensor", -1, 2),
    "broadcast_": ("tensor", -1, 2),
}
REBUILD = "ddp_rebuild_broadcast"  # the event name of DDP's bucket-rebuild broadcasts
MAX_REBUILD_WINDOWS = 16  # forwards per model that may open one, at most
MAX_PENDING = 4096  # unwaited results tracked at once; the oldest is ended past it


def _unboxed_work(out):
    """The Work of a `c10d::broadcast_` result, `(tensors, work)`. A kernel gets it as
    a TorchScript object that has only `wait`; `Work.unbox` gives the Work itself."""
    try:
        from torch._C._distributed_c10d import Work

        w = out[1]
        return w if isinstance(w, Work) else Work.unbox(w)
    except Exception:
        return None


class Pending:
    """Ops whose results are not waited on yet, by the storage they fill. Shared by
    the eager funcol wrappers (probe/funcol.py) and these kernels: whichever sees the
    wait first ends the event, the other finds nothing."""

    def __init__(self, probe) -> None:
        self.probe = probe
        self.by_storage: dict[int, list] = {}  # data_ptr -> [Rec, storages still to wait, host ns to return]

    def watch(self, rec, pairs, freed: bool = True) -> None:
        """`pairs`: (tensor whose storage the wait will name, object whose death
        ends the wait unwaited). `freed=False`: no watch on their death (a weakref
        on a tensor costs ~10 µs over its life); the op then ends at its wait, or
        when its storage is filled again, or when it is the oldest of MAX_PENDING.
        A CUDA op's end, at its wait, is an event on the stream that waited (see
        `done`); ended unwaited, it is the host's time then."""
        entry = [rec, 0, time.monotonic_ns() - rec.t0]  # the op, storages to wait, its host time to return
        by = self.by_storage
        for t, owner in pairs:
            key = _storage(t)
            old = by.get(key)
            if old is entry:
                continue  # two results in one storage: one wait
            if old is not None:  # the storage was reused, so the op that filled it is over
                self.done(key, old)
            by[key] = entry
            entry[1] += 1
            if freed:
                weakref.finalize(owner, self.done, key, entry)
        if entry[1] == 0:
            self.ended(rec, entry[2], waited=True)  # waited inside the call
        while len(by) > MAX_PENDING:
            self.done(next(iter(by)))

    def done(self, key: int, entry: list | None = None, waited: bool = False) -> None:
        cur = self.by_storage.get(key)
        if cur is None or entry is not None and cur is not entry:
            return  # ended already, or the storage now belongs to a later op
        del self.by_storage[key]
        cur[1] -= 1
        if cur[1] == 0:
            self.ended(cur[0], cur[2], waited)

    def ended(self, rec, enqueue_ns: int, waited: bool) -> None:
        """The op's result is usable. After a wait on CUDA the current stream waits
        for the collective: an event recorded there now completes once it has (and
        once compute queued on that stream before the wait has: the device time is an
        upper bound of the collective's, probe/cuda.py). Otherwise: now, on the host."""
        if waited and rec.cuda:
            self.probe.cuda_side.end_sync(rec.id, rec.cuda, rec.t0, -1, enqueue_ns)
        else:
            self.probe.push(end_record(rec.id, time.monotonic_ns()))

    def waited(self, tensor) -> None:
        if self.by_storage:
            self.done(_storage(tensor), waited=True)


def _storage(t) -> int:
    return t.untyped_storage().data_ptr()


class Kernels:
    """The BackendSelect kernels on `_c10d_functional` (for good) and on
    `c10d::broadcast_` (only inside a rebuild window)."""

    def __init__(self, probe, pending: Pending) -> None:
        self.probe, self.pending = probe, pending
        self.lib = None
        self._resolve = None
        self._groups: dict = {}  # group name -> ProcessGroup, until a group is destroyed

    def install(self) -> None:
        import torch
        import torch.distributed.distributed_c10d as c10d

        ns = torch.ops._c10d_functional
        self._resolve = c10d._resolve_process_group
        lib = torch.library.Library("_c10d_functional", "IMPL")
        for name, (rule, ri, gi) in OPS.items():
            if not hasattr(ns, name):
                continue  # this torch lacks it
            op = getattr(ns, name).default
            lib.impl(name, self._collective(op, "funcol." + name, rule, ri, gi), "BackendSelect", with_keyset=True)
        lib.impl("wait_tensor", self._wait(ns.wait_tensor.default), "BackendSelect", with_keyset=True)
        self.lib = lib

    def uninstall(self) -> None:
        if self.lib is not None:
            self.lib._destroy()
            self.lib = None

    def _group(self, name):
        if not isinstance(name, str):
            return name
        pg = self._groups.get(name)
        if pg is None:
            pg = self._groups[name] = self._resolve(name)
        return pg

    def forget_groups(self) -> None:
        """A group was destroyed: its name may come back for a new one."""
        self._groups.clear()

    def _collective(self, op, name: str, rule: str, ri: int, gi: int):
        """The kernel: `calls.guarded` around torch's own (one event per call, none
        inside a wrapped call, a user's exception unchanged), by the op's schema."""
        import torch

        probe, pending = self.probe, self.pending
        listed, gathered, BS = rule.startswith("list"), rule.endswith("gathered"), torch._C.DispatchKey.BackendSelect

        def start(args, kwargs):  # args[0]: the keyset to redispatch with
            x = args[1]
            tensors = list(x) if listed else [x]
            if not tensors or tensors[0].is_meta:
                return None
            src = int(args[2]) if name.startswith("funcol.broadcast") else None
            return calls.begin_functional(probe, name, self._group(args[1 + gi]), tensors, gathered, src,
                                          args[1 + ri] if ri >= 0 else "")

        def finish(rec, out) -> None:
            pending.watch(rec, [(t, t) for t in (out if isinstance(out, (list, tuple)) else [out])], freed=False)

        guarded = calls.guarded(probe, name, op.redispatch, start, finish)

        def kernel(keyset, *args, **kwargs):
            return guarded(keyset.remove(BS), *args, **kwargs)

        return kernel

    def _wait(self, op):
        import torch

        pending, health = self.pending, self.probe.health
        redispatch, BS = op.redispatch, torch._C.DispatchKey.BackendSelect

        def wait_tensor(keyset, tensor):
            out = redispatch(keyset.remove(BS), tensor)
            try:
                pending.waited(tensor)
            except Exception as exc:
                health.internal("funcol.wait_tensor", exc)
            return out

        return wait_tensor

    @contextlib.contextmanager
    def rebuild_window(self, pg):
        """Record the broadcasts DDP's reducer issues on `pg` from C++ while this is open."""
        import torch

        probe, tls, health = self.probe, self.probe.tls, self.probe.health
        op = torch.ops.c10d.broadcast_.default
        redispatch, BS = op.redispatch, torch._C.DispatchKey.BackendSelect
        open_rec: list = []

        def end_open() -> None:
            while open_rec:
                probe.end_now(open_rec.pop())

        def broadcast_(keyset, tensors, process_group, root_rank, root_tensor, *rest):
            st = thread_state(tls)
            rec = None
            if not st[DEPTH]:
                try:
                    end_open()  # the reducer waits on each before the next
                    g = probe.group_info(pg)
                    if tensors and g is not None and not tensors[0].is_meta:
                        t = tensors[0]
                        root = g.ranks[root_rank] if 0 <= root_rank < g.size else -1
                        rec = calls.begin(probe, REBUILD, pg, sum(x.nbytes for x in tensors), dtype_name(t.dtype),
                                          list(t.shape), t, root=root)
                except Exception as exc:
                    health.internal(REBUILD, exc)
            try:
                out = redispatch(keyset.remove(BS), tensors, process_group, root_rank, root_tensor, *rest)
            except BaseException as exc:
                if rec is not None:
                    probe.fail(rec, exc)
                raise
            if rec is not None:
                work = _unboxed_work(out)
                if work is None:  # ended by the next broadcast (the reducer waits on each) or the window's end
                    open_rec.append(rec)
                else:
                    try:
                        probe.track(rec, work)  # on CUDA: timed on the device, as an async broadcast
                    except Exception as exc:
                        health.internal(REBUILD, exc)
                        open_rec.append(rec)
            return out

        lib = torch.library.Library("c10d", "IMPL")
        try:
            lib.impl("broadcast_", broadcast_, "BackendSelect", with_keyset=True)
            yield
        finally:
            lib._destroy()
            end_open()
