"""A 4-stage pipeline (blocking send/recv, stage r receives from r-1 and sends to
r+1) where stage 2 stalls in plain Python before its third send: no op in flight, no
collective, just a slow function of the job. Stage 3 waits for it in recv; stages 0
and 1 block behind it. The line at fault is in `load_next_shard`."""

import os
import time

import torch
import torch.distributed as dist


def load_next_shard():
    mark = os.environ.get("STALL_MARK")  # tests wait for it instead of guessing a sleep
    if mark:
        open(mark, "w").close()
    time.sleep(600)  # the stall: a data loader, a checkpoint write, an .item()


def about_to(call: str, step: int) -> None:
    """Where this rank goes next, in `STALL_MARK.RANK`: where it blocks, once it stops."""
    mark = os.environ.get("STALL_MARK")
    if mark:
        with open(f"{mark}.{rank}", "w") as f:
            f.write(f"{call} {step}")


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(256)
for step in range(5):
    if rank > 0:
        about_to("recv", step)
        dist.recv(x, rank - 1)
    if rank == 2 and step == 2:
        load_next_shard()
    if rank < world - 1:
        about_to("send", step)
        dist.send(x, rank + 1)
dist.destroy_process_group()
