"""A process group that is neither gloo nor NCCL: a small Python backend over mpi4py,
registered with `dist.Backend.register_backend` and launched by `mpiexec` (no
torchrun: rank and size come from MPI, the local rank from MPI's environment). The
seed's third backend, as a user without torch's MPI build would write it."""

import os
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

COMM = MPI.COMM_WORLD
OPS = {dist.ReduceOp.SUM: MPI.SUM, dist.ReduceOp.MAX: MPI.MAX, dist.ReduceOp.MIN: MPI.MIN}


class Done(dist.Work):
    """MPI's calls below block: the op is complete when the Work is made."""

    def __init__(self, result) -> None:
        super().__init__()
        self.result_ = result

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self.result_)
        return fut


class MPIGroup(dist.ProcessGroup):
    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "mpi4py"

    def allreduce(self, tensors, opts):
        for t in tensors:
            COMM.Allreduce(MPI.IN_PLACE, t.numpy(), op=OPS[opts.reduceOp.op])
        return Done(tensors)

    def broadcast(self, tensors, opts):
        for t in tensors:
            COMM.Bcast(t.numpy(), root=opts.rootRank)
        return Done(tensors)

    def allgather(self, outputs, inputs, opts):
        for outs, x in zip(outputs, inputs):
            got = COMM.allgather(x.numpy().copy())
            for o, g in zip(outs, got):
                o.copy_(torch.from_numpy(g))
        return Done(outputs)

    def barrier(self, opts):
        COMM.Barrier()
        return Done([])

    def send(self, tensors, dst, tag):
        COMM.Send(tensors[0].numpy(), dest=dst, tag=tag)
        return Done(tensors)

    def recv(self, tensors, src, tag):
        COMM.Recv(tensors[0].numpy(), source=src, tag=tag)
        return Done(tensors)


dist.Backend.register_backend("mpi4py", lambda store, rank, size, timeout: MPIGroup(rank, size), devices=["cpu"])
rank, world = COMM.Get_rank(), COMM.Get_size()
dist.init_process_group("mpi4py", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=rank, world_size=world)
t = torch.full((256,), float(rank))
for _ in range(10):
    dist.all_reduce(t)
dist.broadcast(t, src=0)
out = [torch.empty(256) for _ in range(world)]
dist.all_gather(out, t)
if rank % 2 == 0:
    dist.send(t, rank + 1)
else:
    dist.recv(t, rank - 1)
dist.barrier()
expect = sum(range(world)) * world ** 9
assert t[0].item() == expect, (t[0].item(), expect)
print(f"rank {rank} of {world} ok (local {os.environ.get('MPI_LOCALRANKID', os.environ.get('PMI_RANK'))})")
dist.destroy_process_group()
