"""A compiled job: functional collectives and `dist.all_reduce` inside
`torch.compile(fullgraph=True)`, then DDP over a compiled model and a compiled DDP, three SGD steps each.
Reports its results and what dynamo made of it (graphs, breaks), so a run under
commviz can be compared with a plain one."""

import argparse
import json

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._dynamo.utils import counters


def chain(x):
    y = funcol.all_reduce(x, "sum", dist.group.WORLD)
    z = funcol.all_gather_tensor(y * 2, 0, dist.group.WORLD)
    w = funcol.reduce_scatter_tensor(z, "sum", 0, dist.group.WORLD)
    return w + 1


def inplace(x):
    dist.all_reduce(x)  # dynamo rewrites it to its functional form
    return x * 2


def explained(fn, x):
    e = torch._dynamo.explain(fn)(x)
    torch._dynamo.reset()
    return [e.graph_count, e.graph_break_count, sorted({str(b.reason).split("\n")[0] for b in e.break_reasons})]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.arange(8, dtype=torch.float32) + rank
    report = {"explain": {"chain": explained(chain, x.clone()), "inplace": explained(inplace, torch.ones(8))}}
    counters.clear()
    report["chain"] = torch.compile(chain, fullgraph=True, backend="aot_eager")(x.clone()).tolist()
    report["inplace"] = torch.compile(inplace, fullgraph=True, backend="aot_eager")(torch.ones(8)).tolist()
    # fullgraph=True on the module inside DDP (torch cannot trace DDP's own forward
    # whole, with or without commviz), and DDP compiled around (DDPOptimizer)
    for how in ("inner", "outer"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        if how == "inner":
            ddp = torch.nn.parallel.DistributedDataParallel(torch.compile(model, fullgraph=True, backend="aot_eager"))
            run = ddp
        else:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            run = torch.compile(ddp, backend="aot_eager")
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            inp = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + rank))
            loss = run(inp).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(round(loss.item(), 5))
        report[how] = {"losses": losses, "params": [round(float(p.sum()), 5) for p in model.parameters()]}
    report["graphs"] = counters["stats"]["unique_graphs"]
    report["breaks"] = {k.split("\n")[0][:120]: v for k, v in counters["graph_break"].items()}
    with open(f"{args.report}.{rank}", "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
