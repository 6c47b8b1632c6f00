"""Every op family on NCCL, world size 1, one GPU (run under torchrun by
tests/gpu/test_nccl_path.py). Writes what it did to --expect: per op, the count and
bytes (DESIGN.md's rules, worked out here by hand, not by commviz), the CUDA-graph
outcome, and any synchronizing call torch's sync debug mode saw, with the frame it came
from. Nothing here synchronizes the device inside the checked block."""

import argparse
import io
import json
import pickle
import warnings

import torch
import torch.distributed as dist

import commviz

p = argparse.ArgumentParser()
p.add_argument("--expect", required=True)
args = p.parse_args()

commviz.instrument()
dist.init_process_group("nccl")  # torchrun's env; one rank
rank, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", 0)  # never set_device: the probe must name the tensor's GPU
expected: dict[str, dict[str, int]] = {}
notes: dict[str, str] = {}


def did(op: str, nbytes: int) -> None:
    e = expected.setdefault(op, {"count": 0, "bytes": 0})
    e["count"] += 1
    e["bytes"] += nbytes


def t(numel: int = 1024) -> torch.Tensor:
    return torch.ones(numel, device=dev)


B = 4 * 1024  # bytes of t()

sync_seen: list[dict] = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")  # any synchronizing call in this block warns
    x = t()
    dist.all_reduce(x)
    did("all_reduce", B)
    dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True).wait()
    did("all_reduce", B)
    dist.broadcast(x, src=0)
    did("broadcast", B)
    dist.reduce(x, dst=0)
    did("reduce", B)
    dist.all_gather([t() for _ in range(n)], x)
    did("all_gather", n * B)
    dist.all_gather_into_tensor(t(1024 * n), x)
    did("all_gather_into_tensor", n * B)
    dist.reduce_scatter(t(), [t() for _ in range(n)])
    did("reduce_scatter", n * B)
    dist.reduce_scatter_tensor(t(), t(1024 * n))
    did("reduce_scatter_tensor", n * B)
    dist.all_to_all([t() for _ in range(n)], [t() for _ in range(n)])
    did("all_to_all", n * B)
    dist.all_to_all_single(t(1024 * n), t(1024 * n))
    did("all_to_all_single", n * B)
    dist.gather(x, [t() for _ in range(n)], dst=0)
    did("gather", n * B)
    dist.scatter(x, [t() for _ in range(n)], src=0)
    did("scatter", n * B)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(t())
        dist.all_reduce(t())
    cm.wait()
    did("all_reduce", B)
    did("all_reduce", B)
    with dist._coalescing_manager():  # blocking: ends on the device, not at host time
        dist.all_reduce(t())
        dist.all_reduce(t())
    did("all_reduce", B)
    did("all_reduce", B)
    ops = [dist.P2POp(dist.isend, t(), 0), dist.P2POp(dist.irecv, t(), 0)]
    did("isend", B)  # events whether or not torch refuses the batch
    did("irecv", B)
    try:  # NCCL allows a rank to send to itself inside a batch; torch may refuse it
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    except Exception as exc:
        notes["p2p"] = f"batch_isend_irecv to self: {type(exc).__name__}: {exc}"[:300]
    torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message).lower():
            sync_seen.append({"file": w.filename, "line": w.lineno, "message": str(w.message)[:200]})

dist.barrier()
did("barrier", 0)
payload = {"weights": list(range(100))}
f = io.BytesIO()
pickle.Pickler(f).dump(payload)
dist.broadcast_object_list([payload], src=0)
did("broadcast_object_list", 8 + len(f.getvalue()))

# A collective captured into a CUDA graph: one event, marked captured (it runs at replays).
graph = "not tried"
try:
    y = t()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(y)  # warm-up outside the capture
        did("all_reduce", B)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(y)
        did("all_reduce", B)
    g.replay()
    graph = "captured"
except Exception as exc:
    graph = f"{type(exc).__name__}: {exc}"[:300]

# A raw global-mode capture by "another library" (the driver's cuStreamBeginCapture on a
# stream of its own, not torch.cuda.CUDAGraph, so the probe does not count it) while the
# probe's CUDA thread polls an all_reduce queued behind ~0.2 s of matmuls. This thread
# makes no CUDA call until the capture ends, so only the probe's queries could
# invalidate it; 901 is CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
raw_capture = "not tried"
try:
    import ctypes
    import threading
    import time as _time

    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuStreamBeginCapture_v2.argtypes = [ctypes.c_void_p, ctypes.c_int]
    cu.cuStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    cu.cuGraphDestroy.argtypes = [ctypes.c_void_p]
    a = torch.randn(4096, 4096, device=dev)
    cap_stream = torch.cuda.Stream(device=dev)
    torch.cuda.synchronize()
    result = {}
    from commviz.probe import patch as _patch

    _side = _patch._probe.cuda_side if _patch._probe is not None else None

    def other_library():
        torch.cuda.set_device(dev)  # the stream's context current on this thread, before the capture
        h = ctypes.c_void_p(cap_stream.cuda_stream)  # captures nothing: only its validity counts
        rc = cu.cuStreamBeginCapture_v2(h, 0)  # CU_STREAM_CAPTURE_MODE_GLOBAL
        result["begin"] = rc
        poller = _side.poller if _side is not None else None
        result["pending"] = len(poller.pending) if poller is not None else -1  # ops it polls during the capture
        if rc == 0:
            _time.sleep(0.2)  # the probe polls the pending all_reduce meanwhile
            graph = ctypes.c_void_p()
            result["end"] = cu.cuStreamEndCapture(h, ctypes.byref(graph))
            if graph.value:
                cu.cuGraphDestroy(graph)

    y = t()
    for _ in range(80):
        a = a @ a / 4096.0  # keeps the GPU busy into the capture (allocations before it begins)
    dist.all_reduce(y)  # its end event completes only after the matmuls
    did("all_reduce", B)
    th = threading.Thread(target=other_library)
    th.start()
    th.join(10)
    if result.get("pending", 0) <= 0:
        raw_capture = "not tried: the all_reduce was done before the capture began (a faster GPU: more matmuls)"
    else:
        raw_capture = ("valid" if result.get("end") == 0 else
                       f"begin {result.get('begin')}, end {result.get('end')} (901: invalidated)")
    torch.cuda.synchronize()
except Exception as exc:
    raw_capture = f"not tried: {type(exc).__name__}: {exc}"[:300]

from commviz.probe import patch as _patch  # noqa: E402  (what the probe's CUDA thread runs in)

side = _patch._probe.cuda_side if _patch._probe is not None else None
capture_mode = side.poller.capture_mode if side is not None and side.poller is not None else "no poller"

# Device time that host timing cannot pass for: an all_reduce (of QUEUED floats, to
# find it) issued behind ~0.1-0.2 s of matmuls on the current stream. Its start event
# completes after them, so its device time is the op's own (well under the matmuls);
# the host's time from the call to the end seen includes them. The job times the
# matmuls with events of its own.
QUEUED = 12345
queued = torch.ones(QUEUED, device=dev)
a = torch.randn(4096, 4096, device=dev)
torch.cuda.synchronize()
m0, m1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
m0.record()
for _ in range(80):
    a = a @ a / 4096.0
m1.record()
dist.all_reduce(queued)
did("all_reduce", 4 * QUEUED)
torch.cuda.synchronize()
queued_ms = m0.elapsed_time(m1)

# DDP: its constructor's shape check (2 int64 per dimension per parameter) and
# broadcast of the weights, one bucket per step for a model this small, and the
# reducer's rebuild after the first step (an int32 per parameter and the bucket
# count, then one per bucket), as on gloo.
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64).to(dev), device_ids=[0])
params = list(model.parameters())
param_bytes = sum(q.numel() * q.element_size() for q in params)
did("_verify_params_across_processes", 8 * sum(2 * q.dim() for q in params))
did("_broadcast_coalesced", param_bytes)
did("ddp_rebuild_broadcast", 4 * (len(params) + 1))
did("ddp_rebuild_broadcast", 4 * 1)
for _ in range(3):
    model(torch.randn(8, 64, device=dev)).sum().backward()
    did("ddp_bucket", param_bytes)

torch.cuda.synchronize()  # the job's own, after everything: the trace must not depend on it
props = torch.cuda.get_device_properties(0)
with open(args.expect, "w") as fh:
    json.dump({"ops": expected, "sync_warnings": sync_seen, "graph": graph, "notes": notes,
               "raw_capture": raw_capture, "capture_mode": capture_mode,
               "queued": {"floats": QUEUED, "behind_ms": queued_ms},
               "uuid": f"GPU-{props.uuid}", "device": "cuda:0"}, fh, indent=1)
dist.destroy_process_group()
