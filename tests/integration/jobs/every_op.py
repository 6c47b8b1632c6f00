"""Every public torch.distributed op, blocking and async, on 4 gloo ranks, in the
default group, a new_group and a DeviceMesh sub-group. Unmodified: it never imports
commviz. tests/integration/test_coverage.py checks every event it causes."""

import datetime
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh



def all_gather_single(*a, **k):  # torch 2.13's name; older torch has only the form it replaces
    return getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(*a, **k)


def reduce_scatter_single(*a, **k):
    return getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(*a, **k)


def all_to_all(*a, **k):
    """torch 2.11's gloo has no list-form alltoall: it raises in C++, the probe records
    the op with that error and its sequence number, and the job says so and goes on."""
    try:
        return dist.all_to_all(*a, **k)
    except RuntimeError as e:
        if "does not support alltoall" not in str(e):
            raise
        print(f"no-alltoall {rank}", flush=True)
        return None


captured_isend = dist.isend  # bound before anything else; may be torch's original

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 4
nxt, prv = (rank + 1) % world, (rank - 1) % world
f32 = lambda n, v=0.0: torch.full((n,), float(v))  # noqa: E731

# --- point to point: a ring, blocking (even ranks send first), async, batched
a = f32(100, rank)
if rank % 2 == 0:
    dist.send(a, nxt)
    dist.recv(a, prv)
else:
    dist.recv(a, prv)
    dist.send(a, nxt)
b_out, b_in = torch.zeros(200, dtype=torch.float64), torch.zeros(200, dtype=torch.float64)
reqs = [dist.isend(b_out, nxt), dist.irecv(b_in, prv)]
for r in reqs:
    r.wait()
c_out, c_in = torch.zeros(50, dtype=torch.int32), torch.zeros(50, dtype=torch.int32)
ops = [dist.P2POp(captured_isend, c_out, nxt), dist.P2POp(dist.irecv, c_in, prv)]
for r in dist.batch_isend_irecv(ops):
    r.wait()
if rank == 0:
    dist.send_object_list([{"k": list(range(10))}], dst=1)
elif rank == 1:
    objs = [None]
    dist.recv_object_list(objs, src=0)
    assert objs[0] == {"k": list(range(10))}

# --- rooted collectives
t = f32(256, rank)
dist.broadcast(t, src=1)
dist.reduce(t, dst=2, op=dist.ReduceOp.MAX)
g_in = f32(64, rank)
dist.gather(g_in, [f32(64) for _ in range(world)] if rank == 3 else None, dst=3)
s_out = f32(32)
dist.scatter(s_out, [f32(32, i) for i in range(world)] if rank == 0 else None, src=0)
dist.broadcast_object_list([{"weights": list(range(50))}], src=0)
dist.gather_object({"r": rank}, [None] * world if rank == 0 else None, dst=0)
out_obj = [None]
dist.scatter_object_list(out_obj, [{"i": i} for i in range(world)] if rank == 0 else None, src=0)
assert out_obj[0] == {"i": rank}

# --- gather/scatter-everything family
x = f32(64, rank)
dist.all_gather([f32(64) for _ in range(world)], x)
dist.all_gather_into_tensor(f32(64 * world), x)
all_gather_single(f32(64 * world), x)
dist.reduce_scatter(f32(64), [f32(64) for _ in range(world)])
dist.reduce_scatter_tensor(f32(64), f32(256))
reduce_scatter_single(f32(64), f32(256))
all_to_all([f32(16) for _ in range(world)], [f32(16) for _ in range(world)])
send_splits = [j + 1 for j in range(world)]  # uneven: rank r sends j+1 floats to rank j
recv_splits = [rank + 1] * world
dist.all_to_all_single(f32(sum(recv_splits)), f32(sum(send_splits)), recv_splits, send_splits)
dist.all_gather_object([None] * world, {"r": rank})

# --- all_reduce (every ReduceOp), async variants
for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.BAND):
    dist.all_reduce(torch.ones(8, dtype=torch.int64), op=op)
w1 = dist.all_reduce(f32(128, 1), async_op=True)
w2 = dist.broadcast(f32(128), src=0, async_op=True)
w3 = dist.all_gather_into_tensor(f32(32 * world), f32(32), async_op=True)
while not all(w.is_completed() for w in (w1, w2, w3)):  # nobody waits: the probe times them anyway
    time.sleep(0.01)
time.sleep(0.2)
print(f"waiting-from {rank} {time.monotonic_ns()}", flush=True)  # they ended before this
for w in (w1, w2, w3):
    w.wait()

# --- barriers, coalesced
dist.barrier()
dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
dist.all_reduce_coalesced([f32(10), f32(20)])
with dist.distributed_c10d._coalescing_manager():
    dist.all_reduce(f32(6))
    dist.all_reduce(f32(6))

# --- an op that fails: same exception to the user, event records it
try:
    dist.broadcast(f32(4), src=99)
except (ValueError, RuntimeError):  # gloo rejects the root in C++ (RuntimeError)
    pass
else:
    raise SystemExit("expected ValueError")

# --- sub-groups: new_group and a 2x2 DeviceMesh
sub = dist.new_group([0, 1])
if rank in (0, 1):
    dist.all_reduce(f32(16), group=sub)
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dist.all_reduce(f32(8), group=mesh.get_group("tp"))

# --- async forms of the rest, and all_gather_coalesced (default group, seq 30 on)
works = [
    dist.reduce(f32(16), dst=1, async_op=True),
    dist.gather(f32(8), [f32(8) for _ in range(world)] if rank == 2 else None, dst=2, async_op=True),
    dist.scatter(f32(8), [f32(8, i) for i in range(world)] if rank == 3 else None, src=3, async_op=True),
    dist.all_gather([f32(8) for _ in range(world)], f32(8), async_op=True),
    all_gather_single(f32(8 * world), f32(8), async_op=True),
    dist.reduce_scatter(f32(8), [f32(8) for _ in range(world)], async_op=True),
    dist.reduce_scatter_tensor(f32(8), f32(8 * world), async_op=True),
    all_to_all([f32(4) for _ in range(world)], [f32(4) for _ in range(world)], async_op=True),
    dist.all_to_all_single(f32(4 * world), f32(4 * world), async_op=True),
    dist.all_reduce_coalesced([f32(2), f32(3)], async_op=True),
    dist.all_gather_coalesced([[f32(5)] for _ in range(world)], [f32(5)], async_op=True),
    dist.barrier(async_op=True),
]
for w in works:
    if w is not None:
        w.wait()
dist.all_gather_coalesced([[f32(5)] for _ in range(world)], [f32(5)])
dist.destroy_process_group()
