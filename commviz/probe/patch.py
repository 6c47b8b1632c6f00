"""Wrapping torch.distributed: every catalogued function, in both namespaces
(`torch.distributed` and `torch.distributed.distributed_c10d`), once.

A call torch implements through other public calls (send → isend, object
collectives → tensor collectives) is one event: a thread-local depth guard makes
nested calls pass straight through, adding their bytes to the outer call when its
bytes rule is `inner`. A user's exception passes through unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time

from commviz import ops as opcat
from commviz.probe.config import ProbeConfig
from commviz.probe.core import _DTYPE_NAMES, Rec, dtype_name, reduce_name
from commviz.probe.sender import END, START
from commviz.trace import ring as _ring

_lock = threading.Lock()
_probe = None
_patched: list[tuple[object, str, object, object]] = []  # (module, name, original, wrapper)


class ArgMap:
    """Reads a call's arguments by parameter name without binding a signature on
    the hot path: positions are worked out once, at patch time."""

    def __init__(self, fn, spec: opcat.OpSpec) -> None:
        self.spec = spec
        names = list(inspect.signature(fn).parameters)
        self._pos = {n: i for i, n in enumerate(names)}
        self._defaults = {
            n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not inspect.Parameter.empty
        }

    def get(self, args, kwargs, name):
        i = self._pos.get(name)
        if i is not None and i < len(args):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return self._defaults.get(name)

    def group(self, args, kwargs):
        return self.get(args, kwargs, "group")

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
        """(bytes, dtype, shape, on_cuda) by the op's bytes rule."""
        rule = self.spec.bytes_rule
        if rule in (opcat.NONE, opcat.INNER):
            return 0, "", [], False
        x = self.get(args, kwargs, self.spec.bytes_arg)
        if rule == opcat.TENSOR_LIST or rule == opcat.TENSOR_LIST_TIMES_N:
            if not x:
                return 0, "", [], False
            t = x[0]
            nbytes = sum(e.nbytes for e in x)
            if rule == opcat.TENSOR_LIST_TIMES_N:
                nbytes *= n
            return nbytes, dtype_name(t.dtype), [len(x), *t.shape], t.is_cuda
        if x is None:
            return 0, "", [], False
        nbytes = x.nbytes
        if rule == opcat.TENSOR_TIMES_N:
            nbytes *= n
        return nbytes, dtype_name(x.dtype), list(x.shape), x.is_cuda


def _wrap(orig, spec: opcat.OpSpec, probe):
    am = ArgMap(orig, spec)
    tls = probe.tls
    health = probe.health
    name = spec.name
    inner_rule = spec.bytes_rule == opcat.INNER
    # Fast path (most calls in real jobs): one tensor, no root — all_reduce,
    # all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, send/recv …
    # Argument positions are resolved here, once; the call does index lookups only.
    fast = spec.bytes_rule == opcat.TENSOR and not (spec.kind == opcat.COLLECTIVE and spec.root_arg)
    p2p = spec.kind == opcat.P2P
    pos = am._pos
    bi = pos.get(spec.bytes_arg, 99)
    gi = pos.get("group", 99)
    ai = pos.get("async_op", 99)
    ri = pos.get(spec.reduce_arg, 99) if spec.reduce_arg else 99
    red_default = am._defaults.get(spec.reduce_arg) if spec.reduce_arg else None
    red_default_name = reduce_name(red_default) if red_default is not None else ""
    pi = pos.get(spec.root_arg, 99) if p2p else 99
    always_async = name in ("isend", "irecv")
    seq_key = (0 if spec.direction == "send" else 1) if p2p else 0
    q = probe.queue
    cap = probe.cfg.queue_cap
    ids = probe.ids
    groups = probe.groups
    clock = time.monotonic_ns
    dtypes = _DTYPE_NAMES
    end_head, ring_hs, ring_ss, ring_mask = _ring.END_HEAD.pack_into, _ring.HEADER_SIZE, _ring.SLOT_SIZE, _ring.SLOTS - 1
    slot_head, ring_head, ring_pmax = _ring.SLOT_HEAD.pack_into, _ring.SLOT_HEAD.size, _ring.PAYLOAD_MAX

    def nested(args, kwargs, depth):
        # Only the outer call's direct children count towards its bytes: send
        # inside send_object_list adds its tensor once, not again for its isend.
        if depth == 1 and tls.want_inner:
            try:
                g = probe.group_info(am.group(args, kwargs))
                tls.inner_bytes += am.payload(args, kwargs, g.size if g else 1)[0]
            except Exception as exc:
                health.internal(name + " (nested)", exc)
        tls.depth = depth + 1
        try:
            return orig(*args, **kwargs)
        finally:
            tls.depth = depth

    def wrapper(*args, **kwargs):
        depth = tls.depth
        if depth:
            if tls.want_inner:
                return nested(args, kwargs, depth)
            return orig(*args, **kwargs)  # inside another wrapped call: not an event
        try:
            if not probe.started and not probe.ensure_started():
                return orig(*args, **kwargs)
            if fast:  # inlined: this is the per-op cost every user pays
                n = len(args)
                group = args[gi] if n > gi else kwargs.get("group")
                if group is None:
                    g = probe.default_group or probe.group_info(None)
                else:
                    g = groups.get(id(group))
                    if g is None or g.pg is not group:
                        g = probe.group_info(group)
                if g is None:
                    rec = None
                else:
                    x = args[bi] if n > bi else kwargs[spec.bytes_arg]
                    dt = x.dtype
                    dtype = dtypes.get(dt) or dtype_name(dt)
                    if p2p:
                        peer = args[pi] if n > pi else kwargs.get(spec.root_arg)
                        if peer is None:
                            peer = am.rooted(args, kwargs, g)
                        key = (seq_key, peer)
                        seq = g.p2p_seq.get(key, 0)
                        g.p2p_seq[key] = seq + 1
                        is_async = always_async
                        red = ""
                    else:
                        peer = -1
                        seq = g.seq
                        g.seq = seq + 1
                        is_async = bool(args[ai] if n > ai else kwargs.get("async_op", False))
                        if ri == 99:
                            red = ""
                        else:
                            r = args[ri] if n > ri else kwargs.get(spec.reduce_arg, red_default)
                            red = red_default_name if r is red_default else reduce_name(r)
                    op_id = next(ids)
                    t0 = clock()
                    start = (START, op_id, t0, name, g.gid, seq, x.nbytes, dtype, x.shape, peer, -1, is_async, red)
                    if len(q) < cap:
                        q.append(start)
                    else:
                        health.dropped += 1
                    rm = probe.ring_m
                    if rm is not None:  # the crash ring, inlined (see trace/ring.py)
                        payload = probe.ring_encode(start)
                        k = len(payload)
                        if k <= ring_pmax:
                            off = ring_hs + (op_id & ring_mask) * ring_ss
                            rm[off + ring_head : off + ring_head + k] = payload
                            slot_head(rm, off, 0, 1, k, op_id)
                    cuda = x.is_cuda
                    rec = True  # the Rec object is only built when needed (async, error, CUDA)
            else:
                rec = probe.begin(spec, am, args, kwargs)
                if rec is not None:
                    op_id, t0, peer, cuda, g = rec.id, rec.t0, rec.peer, rec.cuda, None
        except Exception as exc:
            # If torch rejects the call too, the arguments were bad: the user gets
            # torch's own exception and it is not our internal error.
            result = orig(*args, **kwargs)
            health.internal(name, exc)
            return result
        if rec is None:
            return orig(*args, **kwargs)
        tls.depth = 1
        if inner_rule:
            tls.want_inner = True
            tls.inner_bytes = 0
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            tls.depth = 0
            tls.want_inner = False
            try:
                probe.push((END, op_id, clock(), f"{type(exc).__name__}: {exc}"[:500], -1, -1))
            except Exception as exc2:
                health.internal(name, exc2)
            raise
        tls.depth = 0
        if result is None and not cuda and not inner_rule and tls.coalesced is None:
            # a blocking CPU op that is done now (the common case)
            t1 = clock()
            if len(q) < cap:
                q.append((END, op_id, t1, "", -1, -1))
            else:
                health.dropped += 1
            ring = probe.ring_m
            if ring is not None:
                end_head(ring, ring_hs + (op_id & ring_mask) * ring_ss, t1, 2)
            return result
        try:
            if rec is True:
                rec = Rec(op_id, name, t0, peer, cuda, g.backend)
            if inner_rule:
                tls.want_inner = False
            probe.complete(rec, result, tls.inner_bytes if inner_rule else None)
        except Exception as exc:
            health.internal(name, exc)
        return result

    functools.update_wrapper(wrapper, orig)
    wrapper._commviz_original = orig
    probe.wrapper_codes.add(wrapper.__code__)
    return wrapper


def _wrap_destroy(orig, probe):
    """Forget cached groups when torch destroys them: ids can be reused and a new
    default group starts its sequence numbers afresh on every rank."""

    def destroy_process_group(group=None):
        try:
            if group is None:
                probe.groups.clear()
                probe.default_group = None
            else:
                probe.groups.pop(id(group), None)
        except Exception as exc:
            probe.health.internal("destroy_process_group", exc)
        return orig(group)

    functools.update_wrapper(destroy_process_group, orig)
    destroy_process_group._commviz_original = orig
    return destroy_process_group


def _wrap_init(orig, probe):
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        try:
            probe.ensure_started()  # the watcher sees the rank as soon as it joins
        except Exception as exc:
            probe.health.internal("start", exc)
        return result

    functools.update_wrapper(init_process_group, orig)
    init_process_group._commviz_original = orig
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
    """Put torch's own functions back for the duration (benchmarks compare bare and
    instrumented calls in one process this way)."""
    for mod, name, orig, _ in _patched:
        setattr(mod, name, orig)
    try:
        yield
    finally:
        for mod, name, _, wrapped in _patched:
            setattr(mod, name, wrapped)


def _wrap_batch(orig, probe):
    """Each P2POp of the batch is its own event (marked batched); the isend/irecv
    torch issues for them run nested."""
    tls, health = probe.tls, probe.health

    def batch_isend_irecv(p2p_op_list):
        if tls.depth:
            return orig(p2p_op_list)
        try:
            recs = [r for r in (probe.begin_p2pop(p) for p in p2p_op_list) if r is not None]
        except Exception as exc:
            result = orig(p2p_op_list)  # torch rejects a bad list itself
            health.internal("batch_isend_irecv", exc)
            return result
        tls.depth = 1
        tls.want_inner = False
        try:
            works = orig(p2p_op_list)
        except BaseException as exc:
            tls.depth = 0
            for r in recs:
                probe.fail(r, exc)
            raise
        tls.depth = 0
        try:
            if works and len(works) == len(recs):
                for r, w in zip(recs, works):
                    probe.track(r, w)
            elif works:  # coalesced (NCCL): one work completes the whole batch
                for r in recs:
                    probe.track(r, works[-1])
            else:
                for r in recs:
                    probe.end_now(r)
        except Exception as exc:
            health.internal("batch_isend_irecv", exc)
        return works

    functools.update_wrapper(batch_isend_irecv, orig)
    batch_isend_irecv._commviz_original = orig
    probe.wrapper_codes.add(batch_isend_irecv.__code__)
    return batch_isend_irecv


def _wrap_coalescing(orig, probe):
    """Ops issued inside `_coalescing_manager` are queued by torch and run at exit:
    their events end when the coalesced work does."""
    tls = probe.tls

    @contextlib.contextmanager
    def _coalescing_manager(group=None, device=None, async_ops=False):
        outer = tls.coalesced
        recs: list = []
        with orig(group, device, async_ops) as cm:
            tls.coalesced = recs
            try:
                yield cm
            finally:
                tls.coalesced = outer
        try:
            works = getattr(cm, "works", None) or []
            for r in recs:
                if works:
                    probe.track(r, works[-1])
                else:
                    probe.end_now(r)
        except Exception as exc:
            probe.health.internal("_coalescing_manager", exc)

    functools.update_wrapper(_coalescing_manager, orig)
    _coalescing_manager._commviz_original = orig
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

    __init__._commviz_original = orig_init
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
        for name, spec in opcat.CATALOGUE.items():
            if hasattr(c10d, name):
                _patch(c10d, dist, name, lambda orig, spec=spec: _wrap(orig, spec, probe))
        _patch(c10d, dist, "init_process_group", lambda orig: _wrap_init(orig, probe))
        _patch(c10d, dist, "destroy_process_group", lambda orig: _wrap_destroy(orig, probe))
        _patch(c10d, dist, "batch_isend_irecv", lambda orig: _wrap_batch(orig, probe))
        _patch(c10d, dist, "_coalescing_manager", lambda orig: _wrap_coalescing(orig, probe))
        _canonical_p2p_ops(c10d, probe)
        _rebind_imported(c10d, dist)
        from commviz.probe import ddp

        # torch may still be importing itself here (the start-up hook fires on
        # `import torch.distributed`), so DDP is patched when the probe starts, at
        # init_process_group, before any DDP model can exist.
        probe.late_patches.append(lambda: ddp.install(probe, _patched))
        probe.late_patches.append(lambda: _install_more(probe))
        _probe = probe
        if dist.is_available() and dist.is_initialized():
            probe.ensure_started()
        return probe


def _install_more(probe) -> None:
    """What DDP's constructor and the functional collectives (DTensor) call: C++
    builtins and tensor-returning functions the generic wrapper cannot take."""
    from commviz.probe import ddp_start, funcol

    ddp_start.install(probe, _patched)
    funcol.install(probe, _patched)


def current():
    return _probe
