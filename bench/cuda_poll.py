"""What the probe's CUDA poller costs with many ops in flight: CUDA queries and Python
time per poll, and timing events created per op. Run against the fake `torch.cuda`
of the tests (tests/probe/fake_cuda.py), which counts every query and every event
it is asked to make: the counts are exact, the times are the poller's own Python
(a real `cudaEventQuery` adds ~1-3 µs each, so fewer queries is the figure that
carries over to a GPU).

Scenario: `--ops` ops in flight over `--comms` communicators (a DDP backward's
buckets, tensor- and pipeline-parallel groups), the oldest of each still running,
polled `--polls` times; then `--ops` blocking ops, one after another, each polled
to completion (the event pool's case).

    python bench/cuda_poll.py [--ops 1000] [--comms 8] [--polls 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.probe.cuda import CudaPoller, CudaSide, Pending  # noqa: E402
from commviz.probe.health import Health  # noqa: E402
from tests.probe.fake_cuda import FakeCuda, FakeWork  # noqa: E402


def in_flight(ops: int, comms: int, polls: int) -> tuple[float, float]:
    fc = FakeCuda(1)
    fc.set_device(0)
    poller = CudaPoller(CudaSide(fc, lambda rec: None, Health()))
    for i in range(ops):
        poller.add(Pending(i, 0, None, None, FakeWork(fc, 0, future=False), -1, 0, (f"g{i % comms}", -1)))
    fc.queries = 0
    t0 = time.perf_counter()
    for _ in range(polls):
        poller.poll_once()
    dt = time.perf_counter() - t0
    return fc.queries / polls, dt / polls * 1e6


def sequential(ops: int) -> float:
    fc = FakeCuda(1)
    fc.set_device(0)
    side = CudaSide(fc, lambda rec: None, Health())
    poller = CudaPoller(side)
    made = fc.events_made
    for i in range(ops):
        start = side.event(0)
        start.record(fc.default[0])
        end = side.event(0)
        end.record(fc.default[0])
        poller.add(Pending(i, 0, start, end, None, -1, 0, ("g", -1)))
        fc.default[0].run(float(i))
        poller.poll_once()
    return (fc.events_made - made) / ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--comms", type=int, default=8)
    ap.add_argument("--polls", type=int, default=200)
    a = ap.parse_args()
    q, us = in_flight(a.ops, a.comms, a.polls)
    print(f"{a.ops} ops in flight on {a.comms} communicators: {q:.0f} CUDA queries per poll, "
          f"{us:.1f} µs of Python per poll")
    print(f"{a.ops} blocking ops one after another: {sequential(a.ops):.3f} timing events created per op")


if __name__ == "__main__":
    main()
