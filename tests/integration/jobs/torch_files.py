"""Writes torch's own files for `commviz summary` to open: each rank's profiler trace
of a few known ops, then flight-recorder dumps (JSON and pickle) of a hang: rank 3
never joins the last all_reduce, ranks 0-2 wait in it. Run with TORCH_FR_BUFFER_SIZE.

  torchrun --nproc-per-node 4 torch_files.py OUT_DIR
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as c10d
from torch.profiler import ProfilerActivity, profile

STEPS = 5


def profiled(rank: int, world: int, out: str) -> None:
    x = torch.ones(1000)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(STEPS):
            dist.all_reduce(x)
        dist.broadcast(x, 0)
        dist.all_gather_into_tensor(torch.zeros(1000 * world), x)
        dist.reduce_scatter_tensor(torch.zeros(250), torch.ones(250 * world))
        dist.barrier()
        if rank % 2 == 0:
            dist.send(torch.ones(7), rank + 1)
        else:
            dist.recv(torch.ones(7), rank - 1)
    ext = ".json.gz" if rank % 2 else ".json"  # export_chrome_trace gzips a .gz name
    p.export_chrome_trace(os.path.join(out, "prof", f"trace_rank{rank}{ext}"))


def dump_later(rank: int, out: str) -> None:
    """What an operator does to a hung job: dump every rank's recorder (JSON, and the
    pickle dump-on-timeout writes as TORCH_FR_DUMP_TEMP_FILE + rank), then stop."""
    time.sleep(2.0)
    js = c10d._dump_fr_trace_json()
    with open(os.path.join(out, "fr_json", f"fr_trace_{rank}.json"), "wb") as f:
        f.write(js if isinstance(js, bytes) else js.encode())
    with open(os.path.join(out, "fr_pickle", f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(c10d._dump_fr_trace())
    os._exit(0)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    profiled(rank, world, out)
    pair = dist.new_group([0, 1])
    if rank < 2:
        dist.all_reduce(torch.ones(8), group=pair)
    dist.barrier()
    threading.Thread(target=dump_later, args=(rank, out), daemon=True).start()
    if rank == 3:
        time.sleep(600)
    dist.all_reduce(torch.ones(16))  # rank 3 never comes
    time.sleep(600)


if __name__ == "__main__":
    main()
