"""The faults of scenarios/hang.py, crash.py and desync.py on NCCL, at any world size,
for bench/nccl_world.py (issue 50): run under `commviz record --hang-timeout`, several
ranks sharing one GPU through bench/gpushare.py. NCCL returns from a collective at
launch, so after each one a rank waits for its result (`hold`) as a training step
does at a loss.item(); where a peer never comes, that is where the rank waits.

--kind hang      the members of a sub-group (all ranks but the last; all of them on 2)
                 all_reduce --iters times; the last member skips step 2 and goes to a
                 barrier on the default group, --late s after the members began to
                 wait (the non-members too). --pg-timeout S: NCCL's watchdog aborts
                 the waiting op after S s (the `watchdog` check runs it without a hang
                 timeout, so the watchdog acts first, on the members' op first).
--kind dead      the last rank exits abruptly (os._exit) at step 3 of all_reduces.
--kind desync    at the last step the last rank calls broadcast where the others call
                 all_reduce.

Rank 0 writes --expect before the fault: the diagnosis commviz must give (kind, op,
group is default or not, sequence number, waiting, missing and culprit ranks) and the
job's lines where the ranks wait, so the checker needs no knowledge of this file."""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--kind", choices=["hang", "dead", "desync"], required=True)
p.add_argument("--expect", required=True)
p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl" if torch.cuda.is_available() else "gloo")
p.add_argument("--pg-timeout", type=float, default=120.0, help="the process group's timeout (NCCL's watchdog)")
p.add_argument("--iters", type=int, default=5)
p.add_argument("--late", type=float, default=1.0, help="hang: seconds the victim and non-members sleep before the barrier")
args = p.parse_args()

dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.pg_timeout))
rank, n = dist.get_rank(), dist.get_world_size()
cuda = args.backend == "nccl"
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()) if cuda else torch.device("cpu")
NAME = os.path.basename(__file__)


with open(__file__) as _f:
    SOURCE = _f.read().splitlines()


def marked(tag: str) -> int:
    """The line of this file that ends with the comment `# @tag`."""
    return next(i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith(f"# @{tag}"))


def hold(x: torch.Tensor) -> float:
    return float(x[0])  # waits for the collective on the device (NCCL returns at launch)  # @hold


HOLD_LINE = marked("hold")
t = torch.ones(1024, device=dev)
expect: dict = {"kind": args.kind, "world": n, "backend": args.backend, "file": NAME}

if args.kind == "hang":
    members = list(range(max(2, n - 1)))
    victim = members[-1]
    sub = dist.new_group(members)
    expect.update(op="all_reduce", seq=2, default_group=False, waiting=members[:-1], missing=[victim],
                  culprit=[victim], instead="barrier", wait_lines=[marked("hang-wait"), HOLD_LINE],
                  culprit_line=marked("hang-culprit"))
    if rank == 0:
        with open(args.expect, "w") as fh:
            json.dump(expect, fh, indent=1)
    if rank in members:
        for i in range(args.iters):
            if rank == victim and i == 2:
                break  # the bug: this rank leaves the loop early
            dist.all_reduce(t, group=sub)  # @hang-wait
            hold(t)
    if rank not in members[:-1]:
        time.sleep(args.late)  # the members wait first: theirs is the hang, and the first op to time out
    dist.barrier()  # the victim (and non-members) wait here; the members never arrive  # @hang-culprit
elif args.kind == "dead":
    victim = n - 1
    expect.update(op="all_reduce", seq=3, default_group=True, waiting=list(range(n - 1)), missing=[victim],
                  culprit=[victim], wait_lines=[marked("dead-wait"), HOLD_LINE])
    if rank == 0:
        with open(args.expect, "w") as fh:
            json.dump(expect, fh, indent=1)
    for i in range(6):
        if rank == victim and i == 3:
            time.sleep(0.5)  # its last events reach the watcher, the others' starts too
            os._exit(17)  # no cleanup, no goodbye: like a segfault or an OOM kill
        dist.all_reduce(t)  # @dead-wait
        hold(t)
else:
    odd = n - 1
    expect.update(op="all_reduce", seq=args.iters - 1, default_group=True, culprit=[odd], instead="broadcast")
    if rank == 0:
        with open(args.expect, "w") as fh:
            json.dump(expect, fh, indent=1)
    for i in range(args.iters):
        if i == args.iters - 1 and rank == odd:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)
        hold(t)
print(f"fault_nccl {args.kind}: rank {rank} finished (no fault?)", flush=True)
dist.destroy_process_group()
