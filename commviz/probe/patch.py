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

from commviz import ops as opcat
from commviz.probe.config import ProbeConfig
from commviz.probe.core import dtype_name

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
        if rule == opcat.TENSOR_LIST:
            if not x:
                return 0, "", [], False
            t = x[0]
            nbytes = sum(e.nbytes for e in x)
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
    inner_rule = spec.bytes_rule == opcat.INNER

    def wrapper(*args, **kwargs):
        if tls.depth:
            if tls.want_inner:
                try:
                    g = probe.group_info(am.group(args, kwargs))
                    tls.inner_bytes += am.payload(args, kwargs, g.size if g else 1)[0]
                except Exception as exc:
                    health.internal(spec.name + " (nested)", exc)
            return orig(*args, **kwargs)
        try:
            rec = probe.begin(spec, am, args, kwargs)
        except Exception as exc:
            # If torch rejects the call too, the arguments were bad: the user gets
            # torch's own exception and it is not our internal error.
            result = orig(*args, **kwargs)
            health.internal(spec.name, exc)
            return result
        if rec is None:
            return orig(*args, **kwargs)
        tls.depth = 1
        tls.want_inner = inner_rule
        tls.inner_bytes = 0
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            tls.depth = 0
            try:
                probe.fail(rec, exc)
            except Exception as exc2:
                health.internal(spec.name, exc2)
            raise
        tls.depth = 0
        try:
            probe.complete(rec, result, tls.inner_bytes if inner_rule else None)
        except Exception as exc:
            health.internal(spec.name, exc)
        return result

    functools.update_wrapper(wrapper, orig)
    wrapper._commviz_original = orig
    return wrapper


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
        _probe = probe
        if dist.is_available() and dist.is_initialized():
            probe.ensure_started()
        return probe


def current():
    return _probe
