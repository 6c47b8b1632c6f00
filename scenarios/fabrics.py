"""fabrics: the same ring all_reduce on an NVSwitch DGX H100 and on a two-socket PCIe
box; a ring is only as fast as its slowest edge.

    commviz lesson fabrics --topology dgx-h100
    commviz lesson fabrics --topology pcie-4gpu-2socket
    commviz lesson fabrics --nproc 8 --topology pcie-4gpu-2socket

On a machine without those GPUs commviz places rank i on GPU i mod G of host i div G
of the preset (G its GPUs per host) and says "simulated" in the title: the bytes are
this job's (gloo on CPU), the links and their capacities are the preset's. A ring
all_reduce sends 2(n-1)/n·S over every edge of the ring, all edges at once, so it
ends when the slowest edge is done: busbw can be no more than that edge's bandwidth.

What to look for, in the Links panel (`l` on narrow terminals). On a CPU box the
rates are gloo's, megabytes a second, a sliver of either machine's links: compare
the util column from edge to edge, not its size.

- dgx-h100: every GPU reaches every other through the NVSwitches with all 18 of its
  NVLinks, so every ring edge is `NVLink×18` of 450 GB/s: the ring is even, and any
  rank order is as good as any other.
- pcie-4gpu-2socket: GPUs 0-1 and 2-3 are NVLink-bridged pairs (`NVLink×12`, 300
  GB/s), but edges 1→2 and 3→0 cross from one CPU socket to the other over PCIe
  (`PCIe SYS`, 31.5 GB/s for gen4 x16): the same bytes take ten times more of those
  links (0.1% where the pairs show 0.01%), and they set the pace of the whole ring.
- with 8 ranks the PCIe preset spans two hosts: edges 3→4 and 7→0 leave the box
  (`network`, a capacity the preset does not know), and the flow view draws them on
  the network bar.

Rank 0 prints, for both machines, the ring's edges by kind and the shortest time one
all_reduce of this size could take there (2(n-1)/n·S over the slowest edge).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import DTYPES, check, commviz, human, init, parser, pause, say

MACHINES = ("dgx-h100", "pcie-4gpu-2socket")


def ring_bound(preset: str, world: int, nbytes: int) -> str:
    """The ring's edges on `preset` by kind, and its slowest edge's time for one all_reduce."""
    from commviz.topo.discover import discover
    from commviz.model.placement import link_kind, simulated_place
    from commviz.topo.presets import load_preset

    topo = discover(load_preset(preset))
    edges: dict[str, list[str]] = {}
    caps = []
    for r in range(world):
        a, b = simulated_place(r, world, topo), simulated_place((r + 1) % world, world, topo)
        via, cap = link_kind(a, b, topo)
        edges.setdefault(f"{via} ({cap:.3g} GB/s)" if cap else via, []).append(f"{r}→{(r + 1) % world}")
        caps.append(cap)
    kinds = "; ".join(f"{k}: {' '.join(v)}" for k, v in edges.items())
    if any(c is None for c in caps):
        return f"{preset}: {kinds}; the slowest edge is the network, which the preset does not describe"
    moved = 2 * (world - 1) / world * nbytes
    return f"{preset}: {kinds}; at best {moved / (min(caps) * 1e9) * 1e6:.3g} µs per all_reduce"


def main() -> int:
    p = parser(__doc__, numel=1 << 20, iters=10)
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    t = torch.empty(args.numel, dtype=dtype, device=device)
    nbytes = t.numel() * t.element_size()
    say(rank, f"fabrics: ring all_reduce of {human(nbytes)} on {world} ranks")
    if rank == 0 and commviz is not None and world > 1:
        for preset in MACHINES:
            say(rank, "  " + ring_bound(preset, world, nbytes))
    expected = torch.full_like(t, world * (world + 1) / 2)
    for i in range(args.iters):
        t.fill_(rank + 1)
        dist.all_reduce(t)
        check(rank, f"step {i}: all_reduce sum", t, expected)
        pause(args)
    say(rank, "fabrics: ok, every rank has the sum")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
