"""A plain job (it never imports commviz) for bench/nccl_world.py's `attach` check
(issue 50): all_reduces on NCCL (gloo on the CPU), each result waited for as a step
waits for its loss; at step 2 the last rank stalls in plain Python
(`load_next_shard`) before its all_reduce, and the others wait for it, on the device,
in the one they launched. `commviz attach` is pointed at it from outside: py-spy
stacks, NCCL's RAS service, flight-recorder dumps through the debug pipe where the
checker set TORCH_NCCL_DEBUG_INFO_PIPE_FILE. STALL_MARK: a file made when the stall
begins, so the checker waits for it instead of guessing a sleep."""

import os
import time

import torch
import torch.distributed as dist


def load_next_shard():
    mark = os.environ.get("STALL_MARK")
    if mark:
        open(mark, "w").close()
    time.sleep(600)  # the stall: a data loader, a checkpoint write, an .item()


backend = os.environ.get("STALL_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
cuda = backend == "nccl"
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()) if cuda else torch.device("cpu")
x = torch.ones(256, device=dev)
for step in range(5):
    if rank == world - 1 and step == 2:
        load_next_shard()
    dist.all_reduce(x)
    float(x[0])  # waits for it on the device (NCCL returns at launch)
dist.destroy_process_group()
