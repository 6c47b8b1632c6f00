"""torch.distributed._functional_collectives: what DTensor, tensor parallelism and
compiled models call. Each public function that issues a collective is one event
("funcol.<name>"); the calls they make of each other (all_gather_tensor →
all_gather_single, permute_tensor → all_to_all_single) are not events of their own.

These functions return an AsyncCollectiveTensor at once and torch offers no hook on
the completion of the work behind it, so the event ends when that tensor is complete
as Python sees it: when its wait returns (the user's first use of it, DTensor's own
wait, or an explicit `.wait()`), or when it is freed unwaited — never because commviz
waited on it."""

from __future__ import annotations

import inspect
import time

from commviz import ops as opcat
from commviz.probe import calls, transparent

# function -> (bytes: "tensor" | "gathered" | "list" | "list_gathered")
FUNCTIONS = {
    "broadcast": "tensor", "all_reduce": "tensor", "all_reduce_coalesced": "list",
    "all_gather_single": "gathered", "all_gather_single_autograd": "gathered",
    "all_gather_tensor": "gathered", "all_gather_tensor_autograd": "gathered",
    "all_gather_single_coalesced": "list_gathered", "all_gather_into_tensor_coalesced": "list_gathered",
    "reduce_scatter_single": "tensor", "reduce_scatter_single_autograd": "tensor",
    "reduce_scatter_tensor": "tensor", "reduce_scatter_tensor_autograd": "tensor",
    "reduce_scatter_single_coalesced": "list", "reduce_scatter_tensor_coalesced": "list",
    "all_to_all_single": "tensor", "all_to_all_single_autograd": "tensor", "permute_tensor": "tensor",
}


MODULE = "torch.distributed._functional_collectives"


def install(probe, patched: list, pending, funcol) -> None:
    """Patch the module `funcol`, just imported by the program (`transparent.when_imported`).
    `pending`: the kernels' (probe/kernels.py), so either side may see the wait."""
    for fname, rule in FUNCTIONS.items():
        orig = getattr(funcol, fname, None)
        if orig is None or getattr(orig, "_commviz_original", None) is not None:
            continue
        name = "funcol." + fname
        params = list(inspect.signature(orig).parameters)
        start = _starter(probe, funcol, name, rule, params)
        w = calls.guarded(probe, name, orig, start, lambda rec, result: _finish(probe, funcol, pending, rec, result))
        setattr(funcol, fname, w)
        patched.append((funcol, fname, orig, w))
    wait = funcol.wait_tensor
    if getattr(wait, "_commviz_original", None) is None:
        def wait_tensor(tensor):
            out = wait(tensor)
            try:
                pending.waited(tensor)
            except Exception as exc:
                probe.health.internal("funcol.wait_tensor", exc)
            return out

        transparent.mark(wait_tensor, wait)
        funcol.wait_tensor = wait_tensor
        patched.append((funcol, "wait_tensor", wait, wait_tensor))


def _starter(probe, funcol, name: str, rule: str, params: list[str]):
    gi, ri = params.index("group"), params.index("tag") if "tag" in params else 99
    red = next((i for i, p in enumerate(params) if p == "reduceOp"), 99)
    spec = opcat.spec(name)

    def start(args, kwargs):
        group = args[gi] if len(args) > gi else kwargs["group"]
        tag = args[ri] if len(args) > ri else kwargs.get("tag", "")
        pg = _process_group(funcol, group, tag)
        x = args[0] if args else kwargs[params[0]]
        tensors = list(x) if rule.startswith("list") else [x]
        reduce_op = args[red] if len(args) > red else kwargs.get("reduceOp", "")
        src = None
        if spec is not None and spec.root_arg:  # broadcast
            src = int(args[1] if len(args) > 1 else kwargs.get("src", -1))
        return calls.begin_functional(probe, name, pg, tensors, rule.endswith("gathered"), src, reduce_op)

    return start


def _process_group(funcol, group, tag):
    """A ProcessGroup from any form funcol accepts (group, name, mesh, (mesh, dim), ranks)."""
    import torch.distributed.distributed_c10d as c10d

    resolve = getattr(funcol, "_resolve_group", None)  # torch 2.13; older torch only names the group
    g = resolve(group, tag) if resolve is not None else funcol._resolve_group_name(group, tag)
    return c10d._resolve_process_group(g) if isinstance(g, str) else g


def _finish(probe, funcol, pending, rec, result) -> None:
    outs = result if isinstance(result, (list, tuple)) else [result]
    acts = [t for t in outs if isinstance(t, funcol.AsyncCollectiveTensor) and not t.completed]
    if acts:
        pending.watch(rec, [(a.elem, a) for a in acts])
    else:
        pending.ended(rec, time.monotonic_ns() - rec.t0, waited=True)  # waited inside the call (tracing,
        # a gather on another dim)
