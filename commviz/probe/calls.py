"""Events for calls the generic wrapper cannot read by signature (C++ builtins, the
functional collectives): the caller works out the payload, this starts the event in
the group's sequence like any collective."""

from __future__ import annotations

import time

from commviz.events import start_record
from commviz.probe import transparent
from commviz.probe.core import DEPTH, Rec, thread_state
from commviz.probe.names import dtype_name


def begin(probe, name: str, pg, nbytes: int, dtype: str, shape: list, tensor=None, root: int = -1,
          is_async: bool = False, reduce_op: str = "") -> Rec | None:
    """Start an event for a collective on `pg`; None when this rank is not in the group
    or the probe is not running (the call then runs unobserved, as torch runs it).
    `tensor`: one the op reads, when its end goes through probe.complete; a CUDA one
    gets its device, capture state and start event here (probe/cuda.py)."""
    if not probe.started and not probe.ensure_started():
        return None
    g = probe.group_info(pg)
    if g is None:
        return None
    seq = probe.next_seq(g)
    cuda = probe.cuda_side.begin(tensor, g) if tensor is not None and tensor.is_cuda else False
    op_id = next(probe.ids)
    t0 = time.monotonic_ns()
    probe.push(start_record(op_id, t0, name, g.gid, seq, nbytes, dtype, shape, -1, root, is_async, reduce_op))
    return Rec(op_id, name, t0, -1, cuda, g.backend)


def begin_functional(probe, name: str, pg, tensors: list, gathered: bool, src: int | None = None,
                     reduce_op="") -> Rec | None:
    """Start the event of a functional collective, eager (probe/funcol.py) or run by
    a compiled graph (probe/kernels.py): async, `tensors` its inputs (× the group's
    size when `gathered`), `src` broadcast's root as a rank of the group. A CUDA
    input gets its start event here; the op ends at its wait_tensor (probe/kernels.py
    `Pending`), not on a Work: torch keeps the Work in C++."""
    g = probe.group_info(pg)
    if g is None:
        return None
    t = tensors[0]
    nbytes = sum(e.nbytes for e in tensors) * (g.size if gathered else 1)
    root = -1
    if src is not None:
        root = g.ranks[src] if 0 <= src < g.size else -1
    return begin(probe, name, pg, nbytes, dtype_name(t.dtype), list(t.shape), t if t.is_cuda else None,
                 root=root, is_async=True, reduce_op=str(reduce_op).upper() if reduce_op else "")


def guarded(probe, name: str, orig, start, finish):
    """A wrapper around `orig`: `start(args, kwargs) -> Rec | None` before the call,
    `finish(rec, result)` after it; nested public calls inside are no events, a user's
    exception passes through unchanged (and ends the event with it), and anything
    failing in commviz is reported once and costs the call nothing."""
    tls, health = probe.tls, probe.health

    def wrapper(*args, **kwargs):
        st = thread_state(tls)
        if st[DEPTH]:
            return orig(*args, **kwargs)
        try:
            rec = start(args, kwargs)
        except Exception as exc:
            result = orig(*args, **kwargs)  # torch rejects bad arguments itself
            health.internal(name, exc)
            return result
        if rec is None:
            return orig(*args, **kwargs)
        st[DEPTH] = 1
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            st[DEPTH] = 0
            probe.fail(rec, exc)
            raise
        st[DEPTH] = 0
        try:
            finish(rec, result)
        except Exception as exc:
            health.internal(name, exc)
        return result

    transparent.mark(wrapper, orig)
    probe.wrapper_codes.add(wrapper.__code__)
    return wrapper
