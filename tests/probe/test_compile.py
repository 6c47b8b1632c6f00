"""torch.compile with commviz on, on torch's `fake` backend: dynamo sees torch's own
functions (same graphs, no added break, fullgraph=True works), and what the compiled
graph runs is seen by the dispatcher kernels, once."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

from tests.probe.probing import installed_probe, ops_of  # noqa: E402

WORLD = 4


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with installed_probe(tmp_path_factory) as p:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
        p.ensure_started()
        yield p
        p.shutdown()
        dist.destroy_process_group()


def functional(x):
    return funcol.all_reduce(x, "sum", dist.group.WORLD) * 2


def inplace(x):
    dist.all_reduce(x)  # the C wrapper's shim; dynamo remaps torch's own to funcol
    return x + 1


def gathered(x):
    out = torch.empty(x.numel() * WORLD)
    dist.all_gather_into_tensor(out, x)
    return out + 1


def untraceable(x):
    dist.broadcast(x, 0)  # no functional form: a graph break in a plain run too
    return x + 1


def explain(fn):
    torch._dynamo.reset()
    e = torch._dynamo.explain(fn)(torch.ones(4))
    torch._dynamo.reset()
    return e.graph_count, e.graph_break_count, [str(b.reason).split("\n")[0] for b in e.break_reasons]


@pytest.mark.parametrize("fn, graphs", [(functional, 1), (inplace, 1), (gathered, 1), (untraceable, 1)])
def test_dynamo_sees_torchs_functions_not_ours(probe, fn, graphs):
    from commviz.probe.patch import suspended

    with suspended():
        plain = explain(fn)
    assert explain(fn) == plain
    assert plain[:2] == (graphs, 0)


@pytest.mark.parametrize("fn", [functional, inplace, gathered])
def test_fullgraph_compiles_and_gives_the_plain_result(probe, fn):
    from commviz.probe.patch import suspended

    with suspended():
        torch._dynamo.reset()
        want = torch.compile(fn, fullgraph=True, backend="aot_eager")(torch.arange(4.0))
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(torch.arange(4.0))
    torch._dynamo.reset()
    assert torch.equal(got, want)


def test_what_a_compiled_graph_runs_is_one_event_each_ended_at_its_wait(probe):
    compiled = torch.compile(lambda x: (functional(x), gathered(x)), fullgraph=True, backend="aot_eager")
    compiled(torch.ones(4))  # compiled (traced: no events from fake tensors), then run

    got = ops_of(probe, lambda: compiled(torch.ones(4)))
    torch._dynamo.reset()
    assert [(s.op, s.bytes, s.reduce_op) for s, _ in got] == [
        ("funcol.all_reduce", 16, "SUM"), ("funcol.all_gather_into_tensor", 16 * WORLD, "")]
    assert [s.seq for s, _ in got] == [got[0][0].seq, got[0][0].seq + 1]
    assert all(e is not None and e.error == "" for _, e in got)


def test_eager_funcol_is_one_event_not_two(probe):
    """The Python wrapper records it; the kernel under it passes the call through."""
    got = ops_of(probe, lambda: funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD).wait())
    assert [s.op for s, _ in got] == ["funcol.all_reduce"]
    assert got[0][1] is not None


def test_an_unwaited_result_ends_when_its_storage_is_filled_again(probe):
    from commviz.probe.kernels import Pending

    ended = []

    class Rec:
        def __init__(self, i):
            self.id, self.t0, self.cuda = i, 0, False

    class Probe:
        def push(self, rec):
            ended.append(rec[1])

    pending = Pending(Probe())
    t = torch.ones(4)
    pending.watch(Rec(1), [(t, t)], freed=False)
    pending.watch(Rec(2), [(t[:2], t)], freed=False)  # same storage, a later op
    assert ended == [1]
    pending.waited(t)
    assert ended == [1, 2] and not pending.by_storage
