"""DDP's constructor talks to the group through two C++ functions torch.distributed
exports, not through the public collectives: `_verify_params_across_processes` (every
rank's parameter shapes, all-gathered) and `_broadcast_coalesced` (rank 0's initial
weights and buffers to everyone, in buckets). The broadcast of the initial weights is
the first thing a DDP job sends; these wrappers make it an event like any other."""

from __future__ import annotations

from commviz.probe import calls
from commviz.probe.core import dtype_name


def install(probe, patched: list) -> None:
    import torch.distributed as dist

    for name, start in (("_broadcast_coalesced", _start_broadcast), ("_verify_params_across_processes", _start_verify)):
        orig = getattr(dist, name, None)
        if orig is None or getattr(orig, "_commviz_original", None) is not None:
            continue
        w = calls.guarded(probe, name, orig, lambda a, k, s=start: s(probe, a, k),
                          lambda rec, result: probe.complete(rec, result, None))
        # A pybind builtin pickles by its own reduce; a Python function only by name,
        # and the builtin's (a pybind record's qualname) names nothing: this one is
        # named where it lives, so pickling it still works, and gives torch's builtin
        # back where commviz is not.
        w.__module__, w.__qualname__ = dist.__name__, name
        setattr(dist, name, w)
        patched.append((dist, name, orig, w))


def _arg(args, kwargs, i: int, name: str, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _start_broadcast(probe, args, kwargs):
    """(process_group, tensors, buffer_size, src=0): the total of the tensors, from the
    group's rank `src`."""
    pg, tensors = _arg(args, kwargs, 0, "process_group"), list(_arg(args, kwargs, 1, "tensors", ()))
    if not tensors:
        return None
    src = int(_arg(args, kwargs, 3, "src", 0))
    g = probe.group_info(pg)
    root = g.ranks[src] if g is not None and 0 <= src < len(g.ranks) else -1
    t = tensors[0]
    return calls.begin(probe, "_broadcast_coalesced", pg, sum(x.nbytes for x in tensors), dtype_name(t.dtype),
                       [len(tensors)], t, root=root)


def _start_verify(probe, args, kwargs):
    """(process_group, params, logger): torch all-gathers 2 int64 (size, stride) per
    dimension of every parameter; bytes are the gathered total."""
    pg, params = _arg(args, kwargs, 0, "process_group"), list(_arg(args, kwargs, 1, "params", ()))
    if not params:
        return None
    g = probe.group_info(pg)
    n = g.size if g is not None else 1
    per_rank = 8 * sum(2 * p.dim() for p in params)
    return calls.begin(probe, "_verify_params_across_processes", pg, per_rank * n, "int64", [per_rank // 8 * n],
                       params[0])
