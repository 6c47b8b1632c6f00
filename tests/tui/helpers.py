"""Small traces built from the real event classes, shared by the TUI tests."""

from __future__ import annotations

from commviz.events import SCHEMA_VERSION, Batch, GroupDef, Hello, OpEnd, OpStart
from tests.helpers import FakeClock  # noqa: F401  (the TUI's and the trace's tests take it from here)

WALL0 = 1_700_000_000_000_000_000  # trace wall-clock origin (ns)
MS = 1_000_000
S = 1_000_000_000


def hello(rank: int, mono_ns: int, wall_ns: int, world_size: int = 2) -> Hello:
    return Hello(
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        host=f"node{rank // 8}",
        pid=1000 + rank,
        backend="gloo",
        device="cpu",
        torch_version="2.5.0",
        commviz_version="0.1.0",
        job="job-1",
        mono_ns=mono_ns,
        wall_ns=wall_ns,
    )


def two_rank_trace(n_ops: int = 3, nbytes: int = 4096) -> list[Batch]:
    """Two ranks whose monotonic clocks differ wildly; in wall time rank 0 says hello
    at WALL0, rank 1 at WALL0 + 5 ms. Op i starts at WALL0 + (10 + 10 i) ms on rank 0,
    1 ms later on rank 1, and ends on both at WALL0 + (10 + 10 i + 4) ms."""
    mono = {0: 50 * S, 1: 7 * S}  # arbitrary per-host monotonic origins
    hello_at = {0: 0, 1: 5 * MS}
    batches = []
    for rank in (0, 1):
        off = WALL0 - mono[rank]  # wall = mono + off
        evs: list = [hello(rank, mono[rank] + hello_at[rank], WALL0 + hello_at[rank])]
        evs.append(GroupDef("g0", [0, 1], "gloo"))
        for i in range(n_ops):
            t0 = WALL0 + (10 + 10 * i) * MS + rank * MS
            t1 = WALL0 + (10 + 10 * i + 4) * MS
            evs.append(OpStart(id=i, t=t0 - off, op="all_reduce", group="g0", seq=i, bytes=nbytes))
            evs.append(OpEnd(id=i, t=t1 - off))
        # Split each rank's stream over two batches, as the sender would.
        half = len(evs) // 2
        batches.append(Batch(SCHEMA_VERSION, rank, evs[:half]))
        batches.append(Batch(SCHEMA_VERSION, rank, evs[half:]))
    return batches
