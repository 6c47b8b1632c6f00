"""NCCL's profiler plugin under a real NCCL, at one rank (issue 51). Run under
`commviz record` and torchrun by tests/gpu/test_nccl_plugin_real.py.

At one rank NCCL runs no collective kernel and reports no collective event, so the
ops that make it talk are sends and receives to itself, made as vLLM's PyNccl makes
them: through ctypes on the libnccl.so.2 torch loaded, on a communicator torch knows
nothing of. The probe sees none of them; only the plugin can. Writes to --expect what
it did: NCCL's name for each op and how many."""

import argparse
import ctypes
import json

import torch
import torch.distributed as dist

import commviz

p = argparse.ArgumentParser()
p.add_argument("--expect", required=True)
p.add_argument("--pairs", type=int, default=20)
args = p.parse_args()

commviz.instrument()
dist.init_process_group("nccl")
dev = torch.device("cuda", 0)
dist.all_reduce(torch.ones(4, device=dev))  # torch's own communicator: at one rank, a copy

nccl = ctypes.CDLL("libnccl.so.2")  # the one torch loaded


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


uid, comm = UniqueId(), ctypes.c_void_p()
assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
nccl.ncclCommInitRank.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int)
assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
for fn in (nccl.ncclSend, nccl.ncclRecv):
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
NCCL_FLOAT32 = 7
x = torch.ones(1024, device=dev)
y = torch.zeros(1024, device=dev)
stream = ctypes.c_void_p(torch.cuda.current_stream(dev).cuda_stream)
for _ in range(args.pairs):
    assert nccl.ncclGroupStart() == 0
    assert nccl.ncclSend(x.data_ptr(), 1024, NCCL_FLOAT32, 0, comm, stream) == 0
    assert nccl.ncclRecv(y.data_ptr(), 1024, NCCL_FLOAT32, 0, comm, stream) == 0
    assert nccl.ncclGroupEnd() == 0
torch.cuda.synchronize(dev)  # the job's own wait, before it checks what arrived
assert torch.equal(x, y)
assert nccl.ncclCommDestroy(comm) == 0
with open(args.expect, "w") as f:
    json.dump({"Send": args.pairs, "Recv": args.pairs, "bytes_each": 4096}, f)
dist.destroy_process_group()
