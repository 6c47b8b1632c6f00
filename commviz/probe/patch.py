"""Wrapping torch.distributed: every catalogued function, in both namespaces
(`torch.distributed` and `torch.distributed.distributed_c10d`), once.

A call torch implements through other public calls (send → isend, object
collectives → tensor collectives) is one event: a thread-local depth guard makes
nested calls pass straight through, adding their bytes to the outer call when its
bytes rule is `inner`. A user's exception passes through unchanged.

Per op, the caller's thread does only what must happen there: the sequence number
(in call order, per group, whatever thread calls), the op id, the clock reads and
two appends. Encoding and I/O happen on the probe's thread, and so does reading the
tensor's bytes, dtype and shape where that is safe: with the crash ring off (its
slot needs them at once), before CUDA is up (so no GPU buffer is ever held, not even
briefly) and for plain tensors (no subclass code runs on another thread). The
queued record then holds the tensor until the next drain, one flush interval.
No CUDA tensor exists before torch.cuda initialises, so a CPU job never reads
`is_cuda`; a CUDA op gets its device, capture state and start event on the caller's
thread (probe/cuda.py).
"""

from __future__ import annotations

import _thread
import contextlib
import inspect
import threading
import time

from commviz import native
from commviz import ops as opcat
from commviz.probe.config import ProbeConfig
from commviz import events
from commviz.events import END, S_T, START, end_record
from commviz.probe.core import COALESCED, DEPTH, INNER_BYTES, WANT_INNER, GroupInfo, Rec, thread_state
from commviz.probe import transparent
from commviz.probe.names import _DTYPE_NAMES, dtype_name, reduce_name, tensor_nbytes

# the common case of the fast wrapper, in C (commviz/native.py); without it, Python does all
_CFastWrapper = getattr(native.load("commviz.probe._fastwrap"), "FastWrapper", None)

_lock = threading.Lock()
_probe = None
_patched: list[tuple[object, str, object, object]] = []  # (module, name, original, wrapper)


class ArgMap:
    """Reads a call's arguments by parameter name without binding a signature on
    the hot path: positions are worked out once, at patch time."""

    def __init__(self, fn, spec: opcat.OpSpec) -> None:
        self.spec = spec
        params = inspect.signature(fn).parameters
        self._pos = {n: i for i, n in enumerate(params)}
        self._defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}

    def pos(self, name: str) -> int:
        """Where `name` sits among the positional arguments (NOWHERE if it cannot)."""
        return self._pos.get(name, NOWHERE) if name else NOWHERE

    def default(self, name: str):
        return self._defaults.get(name) if name else None

    def get(self, args, kwargs, name):
        i = self._pos.get(name)
        if i is not None and i < len(args):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return self._defaults.get(name)

    def group(self, args, kwargs):
        return self.get(args, kwargs, "group")

    def fast_positions(self) -> tuple:
        """What the fast wrapper reads by position: (p2p, always async, p2p seq key,
        tensor, group, async_op, reduce op, peer positions, the reduce op's default
        and its name)."""
        s = self.spec
        p2p = s.kind == opcat.P2P
        red_default = self.default(s.reduce_arg)
        return (p2p, s.name in ("isend", "irecv"), (0 if s.direction == "send" else 1) if p2p else 0,
                self.pos(s.bytes_arg), self.pos("group"),
                NOWHERE if p2p else self.pos("async_op"), self.pos(s.reduce_arg),
                self.pos(s.root_arg) if p2p else NOWHERE, red_default,
                reduce_name(red_default) if red_default is not None else "")

    def keyword_fields(self, args, kwargs) -> tuple:
        """(tensor, group, peer or None, is_async, reduce op name) of a call that
        passes keywords, for the fast wrapper."""
        s = self.spec
        x = self.get(args, kwargs, s.bytes_arg)
        if x is None:
            raise TypeError(f"{s.name}: no tensor")
        peer = self.get(args, kwargs, s.root_arg) if s.kind == opcat.P2P else -1
        r = self.reduce_op(args, kwargs)
        red = "" if r is None else reduce_name(r)
        return x, self.group(args, kwargs), peer, self.is_async(args, kwargs), red

    def is_async(self, args, kwargs) -> bool:
        if self.spec.name in ("isend", "irecv"):
            return True
        return bool(self.get(args, kwargs, "async_op"))

    def reduce_op(self, args, kwargs):
        if not self.spec.reduce_arg:
            return None
        return self.get(args, kwargs, self.spec.reduce_arg)

    def rooted(self, args, kwargs, g) -> int:
        """The global rank of the peer (p2p) or root (rooted collectives); -1 if none."""
        s = self.spec
        r = self.get(args, kwargs, s.root_arg)
        if r is not None:
            return int(r)
        gr = self.get(args, kwargs, s.group_root_arg)
        if gr is not None and 0 <= int(gr) < len(g.ranks):
            return g.ranks[int(gr)]
        return -1 if s.kind == opcat.P2P else (g.ranks[0] if g.ranks else -1)

    def payload(self, args, kwargs, n: int):
        """(bytes, dtype, shape, the tensor if it is a CUDA one else None) by the op's
        bytes rule."""
        rule = self.spec.bytes_rule
        if rule in (opcat.NONE, opcat.INNER):
            return 0, "", [], None
        x = self.get(args, kwargs, self.spec.bytes_arg)
        if rule == opcat.TENSOR_LIST or rule == opcat.TENSOR_LIST_TIMES_N:
            # len(), not truth: `not x` on a one-tensor list asks the tensor for its
            # truth value, which on a GPU synchronizes the device.
            if x is None or len(x) == 0:
                return 0, "", [], None
            t = x[0]
            nbytes = sum(map(tensor_nbytes, x))
            if rule == opcat.TENSOR_LIST_TIMES_N:
                nbytes *= n
            return nbytes, dtype_name(t.dtype), [len(x), *t.shape], t if t.is_cuda else None
        if x is None:
            return 0, "", [], None
        try:
            nbytes = x.nbytes
        except RuntimeError:  # sparse
            nbytes = tensor_nbytes(x)
        if rule == opcat.TENSOR_TIMES_N:
            nbytes *= n
        return nbytes, dtype_name(x.dtype), list(x.shape), x if x.is_cuda else None


NOWHERE = 1 << 30  # a position no call reaches: `len(args) > NOWHERE` is never true


def _wrap(orig, spec: opcat.OpSpec, probe):
    am = ArgMap(orig, spec)
    # Most calls in real jobs pass one tensor and no root: all_reduce,
    # all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, send/recv…
    # They get a wrapper specialised at patch time; the rest go through Probe.begin.
    fast = spec.bytes_rule == opcat.TENSOR and not (spec.kind == opcat.COLLECTIVE and spec.root_arg)
    wrapper = (_fast_wrapper if fast else _generic_wrapper)(orig, spec, am, probe)
    transparent.mark(wrapper, orig)
    probe.wrapper_codes.add(wrapper.__code__)
    # The C wrapper caches each thread's state by thread: only for a plain
    # threading.local (gevent's greenlet-local would share it between greenlets).
    if fast and _CFastWrapper is not None and type(probe.tls) is _thread._local:
        try:
            c_wrapper = _c_wrapper(orig, spec, am, probe, wrapper)
        except Exception as exc:  # a layout it does not know: the Python wrapper does it all
            probe.health.internal(f"{spec.name} (C wrapper)", exc)
            return wrapper
        # The C wrapper leaves no frame of its own: its thread is found by torch's
        # own function's code (unique per op) on its stack. Not skipped in stacks.
        code = getattr(inspect.unwrap(orig), "__code__", None)
        if code is not None:
            probe.find_codes.add(code)
        front = transparent.shim(c_wrapper)  # what dynamo can see through
        front._commviz_fast = c_wrapper
        probe.wrapper_codes.add(front.__code__)
        wrapper = transparent.mark(front, orig)
    return wrapper


def _c_wrapper(orig, spec: opcat.OpSpec, am: ArgMap, probe, slow):
    """The C wrapper (probe/_fastwrap.c): the common case of `_fast_wrapper` (`slow`,
    which it calls for every other case, untouched)."""
    import torch

    p2p, always_async, seq_key, bi, gi, ai, ri, pi, red_default, red_default_name = am.fast_positions()
    name = spec.name

    def complete(op_id, t0, peer, g, result):
        _hand_on(probe, Rec(op_id, name, t0, peer, False, g.backend), result)

    return _CFastWrapper(orig, slow, probe, probe.tls, name, probe.queue, probe.cfg.queue_cap, probe.ids,
                         probe.groups, probe.health, p2p, always_async, seq_key, bi, gi, ai, ri, pi, red_default,
                         red_default_name, START, END, torch.cuda, torch.Tensor, _failed, complete, _unprobed,
                         GroupInfo, _DTYPE_NAMES, fold=events.FOLDED if events.FOLDS else None)


def _nested(orig, am: ArgMap, probe):
    """A wrapped call made inside another: not an event. Only the outer call's
    direct children count towards its bytes (send inside send_object_list adds
    its tensor once, not again for its isend)."""
    name = am.spec.name

    def nested(st, args, kwargs):
        depth = st[DEPTH]
        if depth == 1:
            try:
                g = probe.group_info(am.group(args, kwargs))
                st[INNER_BYTES] += am.payload(args, kwargs, g.size if g else 1)[0]
            except Exception as exc:
                probe.health.internal(name + " (nested)", exc)
        st[DEPTH] = depth + 1
        try:
            return orig(*args, **kwargs)
        finally:
            st[DEPTH] = depth

    return nested


def _unprobed(orig, args, kwargs, probe, name: str, exc: Exception):
    """The probe failed before the call: run it unrecorded. If torch rejects the
    call too, the arguments were bad: the user gets torch's own exception and it is
    not our internal error."""
    result = orig(*args, **kwargs)
    probe.health.internal(name, exc)
    return result


def _failed(probe, name: str, op_id: int, exc: BaseException) -> None:
    try:
        probe.push(end_record(op_id, time.monotonic_ns(), f"{type(exc).__name__}: {exc}"[:500]))
    except Exception as exc2:
        probe.health.internal(name, exc2)


def _generic_wrapper(orig, spec: opcat.OpSpec, am: ArgMap, probe):
    """Lists, roots, object collectives, barriers: Probe.begin reads the arguments."""
    tls, health, name = probe.tls, probe.health, spec.name
    inner_rule = spec.bytes_rule == opcat.INNER
    nested = _nested(orig, am, probe)

    def wrapper(*args, **kwargs):
        st = thread_state(tls)
        if st[DEPTH]:
            if st[WANT_INNER]:
                return nested(st, args, kwargs)
            return orig(*args, **kwargs)  # inside another wrapped call: not an event
        try:
            rec = probe.begin(spec, am, args, kwargs)
        except Exception as exc:
            return _unprobed(orig, args, kwargs, probe, name, exc)
        if rec is None:
            return orig(*args, **kwargs)
        st[DEPTH] = 1
        st[WANT_INNER] = inner_rule
        st[INNER_BYTES] = 0
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            st[DEPTH] = 0
            st[WANT_INNER] = False
            _failed(probe, name, rec.id, exc)
            raise
        st[DEPTH] = 0
        st[WANT_INNER] = False
        try:
            probe.complete(rec, result, st[INNER_BYTES] if inner_rule else None)
        except Exception as exc:
            health.internal(name, exc)
        return result

    return wrapper


def _fast_wrapper(orig, spec: opcat.OpSpec, am: ArgMap, probe):
    """The per-op cost every user pays (see the module's docstring): one thread-local
    read, arguments by position (resolved here, once), group, seq, two clock reads,
    two appends; a Rec only when needed."""
    tls, health, name, q = probe.tls, probe.health, spec.name, probe.queue
    append, cap, clock = q.append, probe.cfg.queue_cap, time.monotonic_ns
    nested = _nested(orig, am, probe)
    begin = _fast_begin(spec, am, probe)

    def wrapper(*args, **kwargs):
        try:
            st = tls.s
        except AttributeError:  # this thread's first wrapped call
            st = thread_state(tls)
        if st[DEPTH]:
            return nested(st, args, kwargs) if st[WANT_INNER] else orig(*args, **kwargs)
        if not probe.started and not probe.ensure_started():
            return orig(*args, **kwargs)
        try:
            began = begin(args, kwargs)
        except Exception as exc:
            return _unprobed(orig, args, kwargs, probe, name, exc)
        if began is None:
            return orig(*args, **kwargs)  # this rank is not in the group: torch does nothing either
        op_id, t0, peer, on_cuda, g, ring = began
        st[DEPTH] = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            st[DEPTH] = 0
            _failed(probe, name, op_id, exc)
            raise
        st[DEPTH] = 0
        if result is None and not on_cuda and st[COALESCED] is None:  # a blocking CPU op, done now
            t1 = clock()
            if len(q) < cap:
                append((END, op_id, t1, "", -1, -1))
            else:
                health.dropped += 1
            if ring is not None:
                probe.ring_end(op_id, t1)  # never raises (trace/ring.py)
            return result
        _hand_on(probe, Rec(op_id, name, t0, peer, on_cuda, g.backend), result)
        return result

    return wrapper


def _fast_begin(spec: opcat.OpSpec, am: ArgMap, probe):
    """`_fast_wrapper`'s start of an op: its fields read by position, its group's seq
    taken, its start queued (and put in the crash ring). Returns (op id, start time,
    peer, on CUDA, group, ring), or None where this rank is not in the group. Apart
    from the wrapper so each reads in one screen, at one more Python call per op
    (25–40 ns here), paid only where the C wrapper is not (COMMVIZ_PURE=1, no
    compiler, a thread-local that is not threading's)."""
    import torch

    health, name, q, ids, groups = probe.health, spec.name, probe.queue, probe.ids, probe.groups
    append, cap, clock, dtypes, cuda, Tensor = q.append, probe.cfg.queue_cap, time.monotonic_ns, _DTYPE_NAMES, torch.cuda, torch.Tensor
    p2p, always_async, seq_key, bi, gi, ai, ri, pi, red_default, red_default_name = am.fast_positions()

    def begin(args, kwargs):
        n = len(args)
        if kwargs:
            x, group, peer, is_async, red = am.keyword_fields(args, kwargs)
        else:
            x = args[bi]
            group = args[gi] if n > gi else None
            peer = (args[pi] if n > pi else None) if p2p else -1
            is_async = always_async or (n > ai and bool(args[ai]))
            red = red_default_name if n <= ri or args[ri] is red_default else reduce_name(args[ri])
        g = probe.default_group if group is None else groups.get(id(group))
        if g is None or group is not None and g.pg is not group:
            g = probe.group_info(group)  # None: this rank is not in the group
        if g is None:
            return None
        if p2p:
            peer = am.rooted(args, kwargs, g) if peer is None else peer
            seqs = g.p2p_seq[seq_key]
            seq = seqs.get(peer, 0)
            seqs[peer] = seq + 1
        else:
            seq = g.seq
            g.seq = seq + 1
        op_id = next(ids)
        ring = probe.ring_start
        if ring is None and type(x) is Tensor and not cuda._initialized:  # deferred (see above)
            start = [START, op_id, clock(), name, g.gid, seq, x, "", (), peer, -1, is_async, red]
            on_cuda = False
        else:
            dt = x.dtype
            try:
                nbytes = x.nbytes
            except RuntimeError:  # sparse
                nbytes = tensor_nbytes(x)
            start = (START, op_id, clock(), name, g.gid, seq, nbytes, dtypes.get(dt) or dtype_name(dt),
                     x.shape, peer, -1, is_async, red)
            on_cuda = cuda._initialized and x.is_cuda and probe.cuda_side.begin(x, g, peer)  # (module docstring)
        if len(q) < cap:
            append(start)
        else:
            health.dropped += 1  # the sender is stuck: drop, count, go on
        if ring is not None:  # the crash ring (trace/ring.py)
            try:
                ring(op_id, start)
            except Exception as exc:  # the op is recorded all the same: its start is queued
                health.internal("ring", exc)
        return op_id, start[S_T], peer, on_cuda, g, ring

    return begin


def _hand_on(probe, rec: Rec, result) -> None:
    """The op's record to the probe's completion path; a fault there is counted,
    never raised into the job."""
    try:
        probe.complete(rec, result, None)
    except Exception as exc:
        probe.health.internal(rec.op, exc)


def _wrap_destroy(orig, probe):
    """Forget cached groups when torch destroys them: ids can be reused and a new
    default group starts its sequence numbers afresh on every rank."""

    def destroy_process_group(group=None):
        try:
            if probe.kernels is not None:
                probe.kernels.forget_groups()
            if probe.cuda_side is not None:  # a new group's communicators are set up anew
                probe.cuda_side.comms.clear()
            if group is None:
                probe.auditor.remember()
                probe.groups.clear()
                probe.default_group = None
            else:
                probe.groups.pop(id(group), None)
        except Exception as exc:
            probe.health.internal("destroy_process_group", exc)
        return orig(group)

    transparent.mark(destroy_process_group, orig)
    return destroy_process_group


def _wrap_init(orig, probe):
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        try:
            probe.ensure_started()  # the watcher sees the rank as soon as it joins
        except Exception as exc:
            probe.health.internal("start", exc)
        return result

    transparent.mark(init_process_group, orig)
    return init_process_group


def _patch(c10d, dist, name: str, make) -> None:
    orig = getattr(c10d, name, None)
    if orig is None or getattr(orig, "_commviz_original", None) is not None:
        return
    wrapped = make(orig)
    setattr(c10d, name, wrapped)
    _patched.append((c10d, name, orig, wrapped))
    if getattr(dist, name, None) is orig:
        setattr(dist, name, wrapped)
        _patched.append((dist, name, orig, wrapped))


@contextlib.contextmanager
def suspended():
    """Put torch's own functions back, and take the dispatcher kernels out, for the
    duration (benchmarks compare bare and instrumented calls in one process this way)."""
    kernels = getattr(_probe, "kernels", None)
    kernels = kernels if kernels is not None and kernels.lib is not None else None
    for mod, name, orig, _ in _patched:
        setattr(mod, name, orig)
    if kernels is not None:
        kernels.uninstall()
    try:
        yield
    finally:
        for mod, name, _, wrapped in _patched:
            setattr(mod, name, wrapped)
        if kernels is not None:
            kernels.install()


def _wrap_batch(orig, probe):
    """Each P2POp of the batch is its own event (marked batched); the isend/irecv
    torch issues for them run nested."""
    tls, health = probe.tls, probe.health

    def batch_isend_irecv(p2p_op_list):
        st = thread_state(tls)
        if st[DEPTH]:
            return orig(p2p_op_list)
        try:
            recs = [r for r in (probe.begin_p2pop(p) for p in p2p_op_list) if r is not None]
        except Exception as exc:
            result = orig(p2p_op_list)  # torch rejects a bad list itself
            health.internal("batch_isend_irecv", exc)
            return result
        st[DEPTH] = 1
        st[WANT_INNER] = False
        try:
            works = orig(p2p_op_list)
        except BaseException as exc:
            st[DEPTH] = 0
            for r in recs:
                probe.fail(r, exc)
            raise
        st[DEPTH] = 0
        try:
            if works and len(works) == len(recs):
                for r, w in zip(recs, works):
                    probe.track(r, w)
            elif works:  # coalesced (NCCL): one work completes the whole batch
                for r in recs:
                    probe.track(r, works[-1], coalesced=True)
            else:
                for r in recs:
                    probe.end_now(r)
        except Exception as exc:
            health.internal("batch_isend_irecv", exc)
        return works

    transparent.mark(batch_isend_irecv, orig)
    probe.wrapper_codes.add(batch_isend_irecv.__code__)
    return batch_isend_irecv


def _wrap_coalescing(orig, probe):
    """Ops issued inside `_coalescing_manager` are queued by torch and run at exit:
    their events end when the coalesced work does."""
    tls = probe.tls

    @contextlib.contextmanager
    def _coalescing_manager(group=None, device=None, async_ops=False):
        st = thread_state(tls)
        outer = st[COALESCED]
        recs: list = []
        with orig(group, device, async_ops) as cm:
            st[COALESCED] = recs
            try:
                yield cm
            finally:
                st[COALESCED] = outer
        try:
            works = getattr(cm, "works", None) or []
            for r in recs:
                if works:
                    probe.track(r, works[-1], coalesced=True)
                elif r.cuda:
                    # blocking: torch's work.wait() made the current stream wait for
                    # the batch, so the end is on the device, not now
                    probe.cuda_side.end_sync(r.id, r.cuda, r.t0)
                else:
                    probe.end_now(r)
        except Exception as exc:
            probe.health.internal("_coalescing_manager", exc)

    transparent.mark(_coalescing_manager, orig)
    return _coalescing_manager


def _canonical_p2p_ops(c10d, probe) -> None:
    """P2POp checks `op in [isend, irecv]` and batch_isend_irecv tests `op.op is
    isend` against the (now wrapped) module globals: an `isend` captured before
    patching is swapped for the wrapper as the P2POp is built."""
    P = c10d.P2POp
    if getattr(P.__init__, "_commviz_original", None) is not None:
        return
    canon = {}
    for name in ("isend", "irecv"):
        w = getattr(c10d, name)
        canon[getattr(w, "_commviz_original", w)] = w
    orig_new, orig_init = P.__new__, P.__init__

    def _c(op):
        try:
            return canon.get(op, op)
        except TypeError:
            return op

    def __new__(cls, op, *args, **kwargs):
        return orig_new(cls, _c(op), *args, **kwargs)

    def __init__(self, op, *args, **kwargs):
        orig_init(self, _c(op), *args, **kwargs)

    transparent.mark_method(__init__, orig_init)
    P.__new__ = staticmethod(__new__)
    P.__init__ = __init__
    _patched.append((P, "__init__", orig_init, __init__))
    _patched.append((P, "__new__", staticmethod(orig_new), staticmethod(__new__)))


def _rebind_imported(c10d, dist) -> int:
    """Modules that did `from torch.distributed import broadcast` before we patched
    hold the originals; point those names at the wrappers too."""
    import sys

    by_id = {id(orig): (orig, wrapped) for mod, _, orig, wrapped in _patched if mod in (c10d, dist)}
    n = 0
    for mod in list(sys.modules.values()):
        if mod is c10d or mod is dist or mod is None:
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            hit = by_id.get(id(v))
            if hit is not None and hit[0] is v:
                d[k] = hit[1]
                _patched.append((mod, k, v, hit[1]))
                n += 1
    return n


def install(addr: str | None = None, trace_dir: str | None = None):
    """Patch torch.distributed once per process; returns the probe (or None when
    COMMVIZ=0). Safe to call before or after init_process_group."""
    global _probe
    with _lock:
        if _probe is not None:
            return _probe
        cfg = ProbeConfig.from_env(addr, trace_dir)
        if not cfg.enabled:
            return None
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from commviz.probe.core import Probe

        probe = Probe(cfg)
        from commviz.probe import nccl_plugin

        # Before the job's first NCCL communicator, which is when NCCL loads its plugin.
        probe.nccl_plugin = nccl_plugin.enable()
        for name, spec in opcat.CATALOGUE.items():
            if hasattr(c10d, name):
                _patch(c10d, dist, name, lambda orig, spec=spec: _wrap(orig, spec, probe))
        _patch(c10d, dist, "init_process_group", lambda orig: _wrap_init(orig, probe))
        _patch(c10d, dist, "destroy_process_group", lambda orig: _wrap_destroy(orig, probe))
        _patch(c10d, dist, "batch_isend_irecv", lambda orig: _wrap_batch(orig, probe))
        _patch(c10d, dist, "_coalescing_manager", lambda orig: _wrap_coalescing(orig, probe))
        _canonical_p2p_ops(c10d, probe)
        _rebind_imported(c10d, dist)
        transparent.skip_our_frames(lambda exc: probe.health.internal("dynamo skip list", exc))
        from commviz.probe import ddp

        # torch may still be importing itself here (the start-up hook fires on
        # `import torch.distributed`), so DDP is patched when the probe starts, at
        # init_process_group, before any DDP model can exist.
        probe.late_patches.append(lambda: ddp.install(probe, _patched))
        probe.late_patches.append(lambda: _install_more(probe))
        probe.late_patches.append(lambda: probe.cuda_side.patch_graphs(_patched))
        _probe = probe
        if dist.is_available() and dist.is_initialized():
            probe.ensure_started()
        return probe


def _install_more(probe) -> None:
    """What DDP's constructor and the functional collectives (DTensor) call: C++
    builtins and tensor-returning functions the generic wrapper cannot take. The
    functional collectives are patched when the program imports them: a plain job
    that never does must not find `torch.distributed._functional_collectives` loaded."""
    from commviz.probe import ddp_start, funcol, kernels

    ddp_start.install(probe, _patched)
    k = kernels.Kernels(probe, kernels.Pending(probe))
    transparent.when_imported(funcol.MODULE, lambda module: funcol.install(probe, _patched, k.pending, module),
                              lambda exc: probe.health.internal("functional collectives", exc))
    try:
        k.install()
    except Exception as exc:  # a torch without them: the audit names what goes unseen
        probe.health.internal("dispatcher kernels", exc)
    probe.kernels = k


def current():
    return _probe
