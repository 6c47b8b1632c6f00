"""Every op family at any world size, NCCL on the GPU or gloo on the CPU (--backend),
for bench/nccl_world.py's `every_op` check (issue 50): run under `commviz record`,
several ranks sharing one GPU through bench/gpushare.py. tests/gpu/jobs/every_op_nccl.py
is its world-size-1 sibling (CUDA graphs, capture modes, sync debug mode).

Each rank writes what it did to --expect DIR/rank-<R>.json: per op, the count and bytes
(DESIGN.md's rules, worked out here by hand, not by commviz), the ops only host-timed,
and notes. The checker compares them with `commviz summary --json`, times each CUDA op
on the device against the host, runs the flight-recorder audit (TORCH_FR_BUFFER_SIZE
set by the checker) and reads the NVML samples taken during the traffic at the end.
--fr-dump DIR: each rank also writes torch's flight-recorder dump there, as it stands
before the process group is destroyed (a fixture for the CPU tests)."""

import argparse
import io
import json
import os
import pickle
import time

import torch
import torch.distributed as dist

import commviz

p = argparse.ArgumentParser()
p.add_argument("--expect", required=True, help="directory: rank-<R>.json per rank")
p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl" if torch.cuda.is_available() else "gloo")
p.add_argument("--fr-dump", help="directory for each rank's flight-recorder dump")
p.add_argument("--traffic", type=int, default=40, help="all_reduces of 4 MiB at the end, for NVML samples")
args = p.parse_args()

commviz.instrument()
dist.init_process_group(args.backend)  # torchrun's env
rank, n = dist.get_rank(), dist.get_world_size()
assert n >= 2, "run it at world size >= 2 (every_op_nccl.py is world size 1)"
cuda = args.backend == "nccl"
# one GPU shared by every rank (bench/gpushare.py), or one each: never set_device
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()) if cuda else torch.device("cpu")
sync = torch.cuda.synchronize if cuda else (lambda: None)
nxt, prv = (rank + 1) % n, (rank - 1) % n
expected: dict[str, dict[str, int]] = {}
notes: dict[str, str] = {}


def did(op: str, nbytes: int) -> None:
    e = expected.setdefault(op, {"count": 0, "bytes": 0})
    e["count"] += 1
    e["bytes"] += nbytes


def t(numel: int = 1024, value: float = 1.0) -> torch.Tensor:
    return torch.full((numel,), float(value), device=dev)


B = 4 * 1024  # bytes of t()

# --- all_reduce, blocking and async, checked
x = t(1024, rank + 1)
dist.all_reduce(x)
did("all_reduce", B)
w = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
did("all_reduce", B)
w.wait()
sync()
assert float(x[0]) == n * (n + 1) / 2, float(x[0])

# --- rooted
dist.broadcast(x, src=0)
did("broadcast", B)
dist.reduce(x, dst=n - 1)
did("reduce", B)
dist.gather(t(), [t() for _ in range(n)] if rank == 0 else None, dst=0)
did("gather", n * B)
dist.scatter(t(), [t(1024, i) for i in range(n)] if rank == n - 1 else None, src=n - 1)
did("scatter", n * B)

# --- everyone to everyone
dist.all_gather([t() for _ in range(n)], x)
did("all_gather", n * B)
dist.all_gather_into_tensor(t(1024 * n), x)
did("all_gather_into_tensor", n * B)
dist.reduce_scatter(t(), [t() for _ in range(n)])
did("reduce_scatter", n * B)
dist.reduce_scatter_tensor(t(), t(1024 * n))
did("reduce_scatter_tensor", n * B)
try:  # torch 2.11's gloo has no list-form alltoall: the event records the error
    dist.all_to_all([t() for _ in range(n)], [t() for _ in range(n)])
except RuntimeError as exc:
    if cuda or "does not support alltoall" not in str(exc):
        raise
    notes["all_to_all"] = f"{args.backend}: {exc}"[:200]
did("all_to_all", n * B)
dist.all_to_all_single(t(1024 * n), t(1024 * n))
did("all_to_all_single", n * B)
w = dist.all_gather_into_tensor(t(1024 * n), t(), async_op=True)
did("all_gather_into_tensor", n * B)
w.wait()

# --- point to point: a ring, blocking (even ranks send first), then batched
a = t(256, rank)
if rank % 2 == 0:
    dist.send(a, nxt)
    dist.recv(a, prv)
else:
    dist.recv(a, prv)
    dist.send(a, nxt)
did("send", 1024)
did("recv", 1024)
got = t(512, -1)
for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, t(512, rank), nxt), dist.P2POp(dist.irecv, got, prv)]):
    w.wait()
did("isend", 2048)
did("irecv", 2048)
sync()
assert float(got[0]) == prv, float(got[0])

# --- coalesced
with dist._coalescing_manager():  # blocking
    dist.all_reduce(t())
    dist.all_reduce(t())
did("all_reduce", B)
did("all_reduce", B)
if cuda:  # gloo has no async coalescing
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(t())
        dist.all_reduce(t())
    cm.wait()
    did("all_reduce", B)
    did("all_reduce", B)

# --- host-timed ones
dist.barrier()
did("barrier", 0)
payload = {"weights": list(range(100))}
f = io.BytesIO()
pickle.Pickler(f).dump(payload)
objs = [payload if rank == 0 else None]
dist.broadcast_object_list(objs, src=0)
did("broadcast_object_list", 8 + len(f.getvalue()))
assert objs[0] == payload

# --- a sub-group of ranks 0 and 1
sub = dist.new_group([0, 1])
if rank in (0, 1):
    dist.all_reduce(t(), group=sub)
    did("all_reduce", B)

# --- DDP: its constructor's shape check (2 int64 per dimension per parameter, all
# gathered) and broadcast of the weights, the reducer's rebuild after the first step
# (an int32 per parameter and the bucket count, then one per bucket), one bucket a step
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64).to(dev), device_ids=[dev.index] if cuda else None)
params = list(model.parameters())
param_bytes = sum(q.numel() * q.element_size() for q in params)
did("_verify_params_across_processes", n * 8 * sum(2 * q.dim() for q in params))
did("_broadcast_coalesced", param_bytes)
did("ddp_rebuild_broadcast", 4 * (len(params) + 1))
did("ddp_rebuild_broadcast", 4 * 1)
for _ in range(3):
    model(torch.randn(8, 64, device=dev)).sum().backward()
    did("ddp_bucket", param_bytes)
sync()

# --- traffic while the probe's samplers run (local rank 0 samples NVML every 0.25 s)
big = t(1 << 20)
sync()
t0 = time.perf_counter()
for _ in range(args.traffic):
    dist.all_reduce(big)
    did("all_reduce", 4 << 20)
sync()
traffic_s = time.perf_counter() - t0
if traffic_s < 0.6:  # the samplers need a few intervals of it
    time.sleep(0.6 - traffic_s)

if args.fr_dump:
    import torch._C._distributed_c10d as c10d

    try:
        dump = (c10d._dump_nccl_trace_json(True, False) if cuda and hasattr(c10d, "_dump_nccl_trace_json")
                else c10d._dump_fr_trace_json(True, False))
        os.makedirs(args.fr_dump, exist_ok=True)
        with open(os.path.join(args.fr_dump, f"fr_rank{rank}.json"), "w") as fh:
            fh.write(dump if isinstance(dump, str) else dump.decode())
    except Exception as exc:
        notes["fr_dump"] = f"{type(exc).__name__}: {exc}"[:300]

os.makedirs(args.expect, exist_ok=True)
with open(os.path.join(args.expect, f"rank-{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "world": n, "backend": args.backend, "device": str(dev), "ops": expected,
               "host_timed": ["barrier", "broadcast_object_list"], "notes": notes,
               "traffic": {"all_reduces": args.traffic, "bytes": 4 << 20, "seconds": round(traffic_s, 3)}}, fh, indent=1)
dist.destroy_process_group()
