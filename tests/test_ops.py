"""The op catalogue's bytes rules and busbw factors (nccl-tests' conventions)."""

import pytest

from commviz import ops


@pytest.mark.parametrize(
    "op,n,factor",
    [
        ("all_reduce", 4, 1.5),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("all_gather_into_tensor", 8, 0.875),
        ("reduce_scatter_tensor", 4, 0.75),
        ("all_to_all_single", 2, 0.5),
        ("gather", 4, 0.75),
        ("scatter", 4, 0.75),
        ("broadcast", 4, 1.0),
        ("reduce", 4, 1.0),
        ("send", 2, 1.0),
        ("recv", 2, 1.0),
        ("isend", 2, 1.0),
        ("barrier", 4, 0.0),
        ("ddp_bucket", 4, 1.5),
    ],
)
def test_busbw_factor(op, n, factor):
    assert ops.busbw_factor(op, n) == pytest.approx(factor)


def test_unknown_op_and_empty_group_have_no_bandwidth():
    assert ops.busbw_factor("not_an_op", 4) == 0.0
    assert ops.busbw_factor("all_reduce", 0) == 0.0


def test_bytes_rules_follow_design():
    c = ops.CATALOGUE
    # gathered totals, total inputs, the tensor itself
    assert c["all_gather"].bytes_rule == ops.TENSOR_LIST and c["all_gather"].bytes_arg == "tensor_list"
    assert c["all_gather_into_tensor"].bytes_arg == "output_tensor"
    assert c["gather"].bytes_rule == ops.TENSOR_TIMES_N
    assert c["scatter"].bytes_rule == ops.TENSOR_TIMES_N
    assert c["reduce_scatter_tensor"].bytes_arg == "input"
    assert c["all_to_all"].bytes_arg == "input_tensor_list"
    assert c["broadcast_object_list"].bytes_rule == ops.INNER
    assert c["barrier"].bytes_rule == ops.NONE


def test_p2p_ops_know_their_direction_and_peer_parameter():
    for name, direction, root in [("send", "send", "dst"), ("isend", "send", "dst"), ("recv", "recv", "src"), ("irecv", "recv", "src")]:
        s = ops.CATALOGUE[name]
        assert ops.is_p2p(name)
        assert (s.direction, s.root_arg, s.group_root_arg) == (direction, root, "group_" + root)
    assert not ops.is_p2p("all_reduce")


def test_catalogue_names_exist_in_torch_signature_terms():
    """Every bytes/root parameter the catalogue names is a real parameter of the torch
    function, so the probe reads the right argument."""
    import inspect

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d

    for name, s in ops.CATALOGUE.items():
        if name.startswith("funcol."):
            base = name.removeprefix("funcol.")
            fn = getattr(funcol, base, None)
            if fn is None:  # a `_c10d_functional` op only compiled graphs call
                if not hasattr(torch.ops._c10d_functional, base):
                    continue  # a newer torch's op (all_gather_single: 2.13); older ones never call it
                schema = getattr(torch.ops._c10d_functional, base).default._schema
                names = {a.name for a in schema.arguments}
                for arg in (s.bytes_arg, s.root_arg, s.reduce_arg):
                    assert not arg or arg in names, (name, arg)
                continue
        else:
            fn = getattr(c10d, name, None)
        if fn is None:
            # DDP's bucket (a comm hook) and the C++ builtins DDP's constructor calls
            if name in ("all_gather_single", "reduce_scatter_single") and not hasattr(dist, name):
                continue  # torch 2.13's; on older torch the catalogue entry simply never fires
            assert name in ("ddp_bucket", "ddp_rebuild_broadcast") or callable(getattr(dist, name)), name
            continue
        params = inspect.signature(fn).parameters
        for arg in (s.bytes_arg, s.root_arg, s.group_root_arg, s.reduce_arg):
            if arg:
                assert arg in params, (name, arg)
