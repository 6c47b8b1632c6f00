"""The backend for machines with no NVIDIA driver: no GPUs, every item not available.

NVML absent is a normal state (CPU jobs, gloo, CI), so this is an ordinary backend,
not an error path; ``reason`` says why, for the one line `commviz topo` prints.
"""

from __future__ import annotations

import socket

from commviz.topo.backend import Counter


def _not_available(self, *args: object) -> None:
    return None


class NullNvml:
    source = "none"
    available = False

    def __init__(self, reason: str = "NVML is not available") -> None:
        self.reason = reason
        self.host = socket.gethostname()
        self.notes: list[str] = []

    def device_count(self) -> int:
        return 0

    # Every per-GPU item is not available: there are no GPUs (see backend.NvmlBackend).
    name = uuid = bus_id = arch = numa_node = nvlink_count = _not_available
    nvlink_state = nvlink_version = nvlink_remote_bus_id = nvlink_remote_type = _not_available
    pair_level = p2p_read = utilization = memory = pcie_throughput = nvlink_rates = _not_available

    def pcie_link(self, i: int) -> tuple[int | None, int | None, int | None, int | None]:
        return (None, None, None, None)

    def counters(self, i: int, links: list[int]) -> dict[str, Counter | None]:
        return {}

    def close(self) -> None:
        pass
