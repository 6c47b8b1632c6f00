"""An unmodified script (it never imports commviz) exercising the spine's ops on
2 ranks; the integration tests check every event it causes, byte for byte."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2
peer = 1 - rank
t = torch.full((256,), float(rank))  # 1024 bytes

# blocking p2p: rank 0 sends twice, rank 1 receives twice
for _ in range(2):
    if rank == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)

# async p2p both ways, completed by wait()
out = torch.empty(128, dtype=torch.float64)  # 1024 bytes
reqs = [dist.isend(torch.zeros(128, dtype=torch.float64), peer), dist.irecv(out, peer)]
for r in reqs:
    r.wait()

# async p2p nobody waits on for a while: the probe times it anyway (gloo says a p2p
# work is completed only once someone waited: under commviz its helper thread did)
req = dist.isend(torch.zeros(10), peer) if rank == 0 else dist.irecv(torch.zeros(10), 0)
import time  # noqa: E402  (here, to keep the job reading in the order it runs)

deadline = time.monotonic() + 30
while not req.is_completed() and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.05)
print(f"waiting-from {rank} {time.monotonic_ns()}", flush=True)
req.wait()

dist.broadcast(t, src=1)
dist.barrier()
gathered = [torch.empty(256) for _ in range(world)]
dist.all_gather(gathered, t)
dist.reduce_scatter_tensor(torch.empty(128), torch.ones(256))
sub = dist.new_group([0, 1])
dist.all_reduce(torch.ones(64, dtype=torch.int32), group=sub)
w = dist.all_reduce(torch.ones(32), async_op=True)
w.wait()
dist.destroy_process_group()
