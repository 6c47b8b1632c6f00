"""The op catalogue: the one table that says, per op, what kind it is, how its bytes
are counted and its bus-bandwidth factor. Probe, model and docs read it from here.

Bytes follow nccl-tests: `bytes` is the size S in algbw = S/t, taken from the tensors
this rank passed (see docs/ARCHITECTURE.md). busbw = algbw × factor(n), n = group size.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes rules: how the probe measures S from the call's arguments.
TENSOR = "tensor"  # nbytes of the tensor argument
TENSOR_LIST = "tensor_list"  # sum of nbytes over a list of tensors
TENSOR_TIMES_N = "tensor_times_n"  # nbytes of one chunk × group size (gathered/scattered total)
TENSOR_LIST_TIMES_N = "tensor_list_times_n"  # sum over a list of chunks × group size
INNER = "inner"  # sum of the public calls torch makes inside (object collectives)
NONE = "none"  # moves no payload (barrier)

# busbw factor families.
ALLREDUCE = "allreduce"  # 2(n-1)/n
SPREAD = "spread"  # (n-1)/n: all_gather, reduce_scatter, all_to_all, gather, scatter
ONE = "one"  # 1: broadcast, reduce, send, recv
ZERO = "zero"  # no payload

COLLECTIVE = "collective"
P2P = "p2p"


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str  # COLLECTIVE or P2P
    bytes_rule: str
    bytes_arg: str  # the torch parameter the bytes rule reads ("" for INNER/NONE)
    busbw: str
    root_arg: str = ""  # global-rank root parameter (src/dst) of rooted collectives
    group_root_arg: str = ""  # its group-rank twin (group_src/group_dst)
    direction: str = ""  # "send" or "recv" for point-to-point ops
    reduce_arg: str = ""  # parameter holding the ReduceOp


def _c(name, rule, arg, busbw, **kw) -> OpSpec:
    return OpSpec(name, COLLECTIVE, rule, arg, busbw, **kw)


def _p(name, rule, arg, direction) -> OpSpec:
    root = "dst" if direction == "send" else "src"
    return OpSpec(name, P2P, rule, arg, ONE, root_arg=root, group_root_arg="group_" + root, direction=direction)


CATALOGUE: dict[str, OpSpec] = {
    s.name: s
    for s in [
        _p("send", TENSOR, "tensor", "send"),
        _p("recv", TENSOR, "tensor", "recv"),
        _p("isend", TENSOR, "tensor", "send"),
        _p("irecv", TENSOR, "tensor", "recv"),
        _p("send_object_list", INNER, "", "send"),
        _p("recv_object_list", INNER, "", "recv"),
        _c("broadcast", TENSOR, "tensor", ONE, root_arg="src", group_root_arg="group_src"),
        _c("all_reduce", TENSOR, "tensor", ALLREDUCE, reduce_arg="op"),
        _c("all_reduce_coalesced", TENSOR_LIST, "tensors", ALLREDUCE, reduce_arg="op"),
        _c("reduce", TENSOR, "tensor", ONE, root_arg="dst", group_root_arg="group_dst", reduce_arg="op"),
        _c("all_gather", TENSOR_LIST, "tensor_list", SPREAD),
        _c("all_gather_into_tensor", TENSOR, "output_tensor", SPREAD),
        _c("all_gather_single", TENSOR, "output_tensor", SPREAD),
        _c("_all_gather_base", TENSOR, "output_tensor", SPREAD),
        _c("all_gather_coalesced", TENSOR_LIST_TIMES_N, "input_tensor_list", SPREAD),
        _c("gather", TENSOR_TIMES_N, "tensor", SPREAD, root_arg="dst", group_root_arg="group_dst"),
        _c("scatter", TENSOR_TIMES_N, "tensor", SPREAD, root_arg="src", group_root_arg="group_src"),
        _c("reduce_scatter", TENSOR_LIST, "input_list", SPREAD, reduce_arg="op"),
        _c("reduce_scatter_tensor", TENSOR, "input", SPREAD, reduce_arg="op"),
        _c("reduce_scatter_single", TENSOR, "input", SPREAD, reduce_arg="op"),
        _c("_reduce_scatter_base", TENSOR, "input", SPREAD, reduce_arg="op"),
        _c("all_to_all", TENSOR_LIST, "input_tensor_list", SPREAD),
        _c("all_to_all_single", TENSOR, "input", SPREAD),
        _c("barrier", NONE, "", ZERO),
        _c("monitored_barrier", NONE, "", ZERO),
        _c("broadcast_object_list", INNER, "", ONE, root_arg="src", group_root_arg="group_src"),
        _c("all_gather_object", INNER, "", SPREAD),
        _c("gather_object", INNER, "", SPREAD, root_arg="dst", group_root_arg="group_dst"),
        _c("scatter_object_list", INNER, "", SPREAD, root_arg="src", group_root_arg="group_src"),
        # DDP gradient buckets: an all_reduce issued by the C++ Reducer (comm hook).
        _c("ddp_bucket", TENSOR, "", ALLREDUCE),
        # DDP's constructor (torch.distributed.utils): the start-up broadcast of the
        # module's state (one event, however many buckets torch splits it into) and the
        # check that every rank's parameters have the same shapes (an all_gather of
        # 2 int64 per dimension per parameter).
        _c("_broadcast_coalesced", TENSOR_LIST, "tensors", ONE, root_arg="src"),
        _c("_verify_params_across_processes", TENSOR_LIST_TIMES_N, "params", SPREAD),
        # DDP's reducer, once, on the first forward after the first backward: the new
        # bucket layout from the group's first rank (two broadcasts, from C++).
        _c("ddp_rebuild_broadcast", TENSOR_LIST, "tensors", ONE, root_arg="root_rank"),
        # torch.distributed._functional_collectives (DTensor, tensor parallelism,
        # compiled models): named "funcol.<function>".
        _c("funcol.broadcast", TENSOR, "self", ONE, root_arg="src"),
        _c("funcol.all_reduce", TENSOR, "self", ALLREDUCE, reduce_arg="reduceOp"),
        _c("funcol.all_reduce_coalesced", TENSOR_LIST, "self", ALLREDUCE, reduce_arg="reduceOp"),
        _c("funcol.all_gather_single", TENSOR_TIMES_N, "self", SPREAD),
        _c("funcol.all_gather_single_autograd", TENSOR_TIMES_N, "self", SPREAD),
        _c("funcol.all_gather_tensor", TENSOR_TIMES_N, "self", SPREAD),
        _c("funcol.all_gather_tensor_autograd", TENSOR_TIMES_N, "self", SPREAD),
        _c("funcol.all_gather_single_coalesced", TENSOR_LIST_TIMES_N, "self", SPREAD),
        _c("funcol.all_gather_into_tensor_coalesced", TENSOR_LIST_TIMES_N, "self", SPREAD),
        _c("funcol.reduce_scatter_single", TENSOR, "self", SPREAD, reduce_arg="reduceOp"),
        _c("funcol.reduce_scatter_single_autograd", TENSOR, "self", SPREAD, reduce_arg="reduceOp"),
        _c("funcol.reduce_scatter_tensor", TENSOR, "self", SPREAD, reduce_arg="reduceOp"),
        _c("funcol.reduce_scatter_tensor_autograd", TENSOR, "self", SPREAD, reduce_arg="reduceOp"),
        _c("funcol.reduce_scatter_single_coalesced", TENSOR_LIST, "inputs", SPREAD, reduce_arg="reduceOp"),
        _c("funcol.reduce_scatter_tensor_coalesced", TENSOR_LIST, "inputs", SPREAD, reduce_arg="reduceOp"),
        _c("funcol.all_to_all_single", TENSOR, "self", SPREAD),
        _c("funcol.all_to_all_single_autograd", TENSOR, "self", SPREAD),
        _c("funcol.permute_tensor", TENSOR, "self", SPREAD),
        # The `_c10d_functional` ops a compiled graph calls (probe/kernels.py) where no
        # public function above shares their name and bytes rule.
        _c("funcol.all_reduce_", TENSOR, "input", ALLREDUCE, reduce_arg="reduce_op"),
        _c("funcol.all_reduce_coalesced_", TENSOR_LIST, "inputs", ALLREDUCE, reduce_arg="reduce_op"),
        _c("funcol.all_gather_into_tensor", TENSOR_TIMES_N, "input", SPREAD),
        _c("funcol.all_gather_into_tensor_out", TENSOR_TIMES_N, "input", SPREAD),
        _c("funcol.reduce_scatter_tensor_out", TENSOR, "input", SPREAD, reduce_arg="reduce_op"),
        _c("funcol.broadcast_", TENSOR, "input", ONE, root_arg="src"),
    ]
}


def spec(op: str) -> OpSpec | None:
    return CATALOGUE.get(op)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for `op` in a group of `n` ranks."""
    s = CATALOGUE.get(op)
    if s is None or n <= 0:
        return 0.0
    if s.busbw == ALLREDUCE:
        return 2.0 * (n - 1) / n
    if s.busbw == SPREAD:
        return (n - 1) / n
    if s.busbw == ONE:
        return 1.0
    return 0.0


def is_p2p(op: str) -> bool:
    s = CATALOGUE.get(op)
    return s is not None and s.kind == P2P
