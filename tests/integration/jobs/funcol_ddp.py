"""DDP's start-up sync and parameter check, every kind of functional collective, and a
DTensor Shard→Replicate redistribution, under commviz (`--direct`: also ProcessGroup
methods called directly, which commviz cannot see and the audit must count)."""

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main() -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.BatchNorm1d(20), torch.nn.Linear(20, 3))
    torch.nn.parallel.DistributedDataParallel(model)  # verify shapes, broadcast rank 0's state
    x = torch.ones(8)
    w = dist.group.WORLD
    assert funcol.all_reduce(x, "sum", w).sum().item() == 8 * world
    assert funcol.all_gather_tensor(x, 0, w).shape == (8 * world,)
    assert funcol.reduce_scatter_tensor(torch.ones(8 * world), "sum", 0, w).sum().item() == 8 * world
    assert funcol.all_to_all_single(torch.ones(4 * world), None, None, w).shape == (4 * world,)
    funcol.all_reduce(x, "sum", w)  # never used: ends when freed
    mesh = init_device_mesh("cpu", (world,))
    d = distribute_tensor(torch.ones(4 * world, 3), mesh, [Shard(0)])
    assert d.redistribute(mesh, [Replicate()]).to_local().shape == (4 * world, 3)
    if "--direct" in sys.argv:
        pg = dist.distributed_c10d._get_default_group()
        pg.allreduce([torch.ones(4)]).wait()
        pg.allreduce([torch.ones(4)]).wait()
        pg.broadcast([torch.ones(4)]).wait()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
