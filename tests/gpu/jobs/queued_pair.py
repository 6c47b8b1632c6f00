"""The queued-op correction at world size >= 2 (issue 50), for bench/nccl_world.py's
`queued` check: two async all_reduces on one group, the second issued while the first
(--big floats) still runs on the device. Both are device-timed; the second waits on
NCCL's stream behind the first, so its host time includes the first's, and its device
time must not (docs/NUMBERS.md: counted from the later of its start and the previous
op's end on the communicator).

Before the pair, the big all_reduce runs alone (one float more, to tell it apart) and
is timed by the job, the device synchronized around it: how long the first op of the
pair runs. Rank 0 writes --expect: the sizes, that time, and how long after the first
the second was issued. Results are checked here (the sum of ones is the world size)."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--expect", required=True)
p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl" if torch.cuda.is_available() else "gloo")
p.add_argument("--big", type=int, default=16 << 20, help="floats in the first all_reduce (64 MiB)")
p.add_argument("--small", type=int, default=12345, help="floats in the second")
args = p.parse_args()

dist.init_process_group(args.backend)
rank, n = dist.get_rank(), dist.get_world_size()
cuda = args.backend == "nccl"
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()) if cuda else torch.device("cpu")
sync = torch.cuda.synchronize if cuda else (lambda: None)

warm = torch.ones(1024, device=dev)
dist.all_reduce(warm)  # the communicator is made here, not in the pair
sync()

alone = torch.ones(args.big + 1, device=dev)
sync()
t0 = time.perf_counter()
dist.all_reduce(alone)
sync()
alone_ms = (time.perf_counter() - t0) * 1e3

big, small = torch.ones(args.big, device=dev), torch.ones(args.small, device=dev)
dist.barrier()
sync()
t0 = time.perf_counter_ns()
w1 = dist.all_reduce(big, async_op=True)
t1 = time.perf_counter_ns()
w2 = dist.all_reduce(small, async_op=True)
w1.wait()
w2.wait()
sync()
pair_ms = (time.perf_counter_ns() - t0) / 1e6
bad = int((big[:: max(1, args.big // 4096)] != n).sum()) + int((small != n).sum())
assert bad == 0, f"rank {rank}: {bad} wrong elements"
if rank == 0:
    with open(args.expect, "w") as fh:
        json.dump({"world": n, "backend": args.backend, "big_bytes": 4 * args.big, "small_bytes": 4 * args.small,
                   "alone_bytes": 4 * (args.big + 1), "alone_ms": round(alone_ms, 3),
                   "second_issued_after_us": round((t1 - t0) / 1e3, 1), "pair_ms": round(pair_ms, 3)}, fh, indent=1)
dist.destroy_process_group()
