"""What a program can see of torch.distributed, written to --out as JSON by rank 0:
run once plainly and once under commviz, the two must be equal (tests/integration/
test_invisible.py). Three gloo ranks under torchrun: at a world size that is not a
power of two, a gradient scaled by 1/size and one divided by size differ in the last
bit, and DDP's weights must come out the same to the bit.

Phase 1 is a plain DDP job that never imports the functional collectives nor DDP's
hook modules, and lists the torch modules loaded after it. Phase 2 then imports them
and looks at torch's functions and the objects that hold them every way a program
can: pickle, deepcopy, torch.save, identity, inspect and help()."""

import argparse
import copy
import functools
import gc
import hashlib
import inspect
import io
import json
import pickle
import pydoc
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
seen: dict = {}

# Phase 1: collectives, then a DDP job as users write it.
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
dist.barrier()
seen["torch_modules_collectives"] = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
seen["functional_collectives_attribute"] = hasattr(dist, "_functional_collectives")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def step(m, o):
    loss = m(torch.full((4, 8), 0.1 * (dist.get_rank() + 1))).square().sum()
    loss.backward()
    o.step()
    o.zero_grad()
    return loss.item()


seen["losses"] = [step(model, opt) for _ in range(3)]
seen["weights_sha256"] = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
seen["torch_modules"] = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
seen["ddp_attributes"] = sorted(vars(model))
seen["ddp_comm_hooks"] = len(model._comm_hooks)
seen["ddp_logging_comm_hook"] = model._get_ddp_logging_data().get("comm_hook")

# torch.save of the whole model (torch's test_DistributedDataParallelCPU does this),
# and the copy trains on
buf = io.BytesIO()
torch.save(model, buf)
loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
seen["loaded_trains"] = step(loaded, torch.optim.SGD(loaded.parameters(), lr=0.1))
twin = copy.deepcopy(model)
seen["deepcopy_trains"] = step(twin, torch.optim.SGD(twin.parameters(), lr=0.1))
seen["deepcopy_attributes"] = sorted(vars(twin))

# Phase 2: torch's functions, and objects that hold them.
import torch.distributed._functional_collectives as funcol  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402

hooked = DDP(torch.nn.Linear(8, 2))
hooked.register_comm_hook(None, default_hooks.allreduce_hook)
seen["hooked_losses"] = [step(hooked, torch.optim.SGD(hooked.parameters(), lr=0.1)) for _ in range(2)]
seen["hook_is_torchs"] = hooked._comm_hooks[0][0] is default_hooks.allreduce_hook
seen["hooked_pickle"] = len(pickle.dumps(hooked)) > 0
hooked_twin = copy.deepcopy(hooked)  # torch gives the copy's reducer no hook: it runs DDP's C++ default
seen["hooked_copy_trains"] = step(hooked_twin, torch.optim.SGD(hooked_twin.parameters(), lr=0.1))
seen["hooked_logging_comm_hook"] = hooked._get_ddp_logging_data().get("comm_hook")


def on_step(fn, optimizer, a, kw):
    return None


opt.register_step_post_hook(functools.partial(on_step, dist.all_reduce))
seen["optimizer_hooks_pickle"] = pickle.dumps(list(opt._optimizer_step_post_hooks.values())).hex()

FUNCTIONS = {
    "dist.all_reduce": dist.all_reduce, "dist.broadcast": dist.broadcast, "dist.send": dist.send,
    "dist.batch_isend_irecv": dist.batch_isend_irecv, "dist.barrier": dist.barrier,
    "dist.init_process_group": dist.init_process_group, "dist._coalescing_manager": dist.distributed_c10d._coalescing_manager,
    "funcol.all_reduce": funcol.all_reduce, "funcol.wait_tensor": funcol.wait_tensor,
    "DDP.register_comm_hook": DDP.register_comm_hook, "DDP._pre_forward": DDP._pre_forward,
}
faces = {}
for name, fn in FUNCTIONS.items():
    face = {}
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        face[attr] = getattr(fn, attr, None)
    face["unwrapped"] = f"{inspect.unwrap(fn).__module__}.{inspect.unwrap(fn).__qualname__}"
    try:
        face["signature"] = str(inspect.signature(fn))
    except ValueError as exc:
        face["signature"] = f"ValueError: {exc}"[:40]
    try:
        face["pickle"] = pickle.dumps(fn).hex()
        face["partial_pickle"] = pickle.dumps(functools.partial(fn)).hex()
    except Exception as exc:
        face["pickle"] = f"{type(exc).__name__}"
    face["help"] = pydoc.render_doc(fn)
    faces[name] = face
seen["faces"] = faces
# C++ builtins DDP's constructor calls: under commviz these are Python functions, named
# where they live; pickling one still gives torch's builtin back
seen["builtins"] = {name: [pickle.loads(pickle.dumps(fn)) in (fn, inspect.unwrap(fn)), inspect.unwrap(fn).__name__]
                    for name, fn in (("_broadcast_coalesced", dist._broadcast_coalesced),
                                     ("_verify_params_across_processes", dist._verify_params_across_processes))}
seen["same_objects"] = [dist.all_reduce is dist.distributed_c10d.all_reduce, dist.isend is dist.P2POp(
    dist.isend, torch.ones(1), 0).op]

if dist.get_rank() == 0:
    with open(args.out, "w") as f:
        json.dump(seen, f, indent=1, sort_keys=True)
dist.barrier()
# Each DDP model's reducer holds a reference to the group: free them while the
# interpreter is whole, so that destroying the group ends it here and not in the
# interpreter's finalization, where gloo now and then aborted plain torch
# ("terminate called without an active exception", pytorch/pytorch#190489).
del model, loaded, twin, hooked, hooked_twin
gc.collect()
dist.destroy_process_group()
