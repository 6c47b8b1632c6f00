"""The backend for machines with no NVIDIA driver: no GPUs, every item not available.

NVML absent is a normal state (CPU jobs, gloo, CI), so this is an ordinary backend,
not an error path; ``reason`` says why, for the one line `commviz topo` prints.
"""

from __future__ import annotations

import socket

from commviz.topo.backend import Counter


class NullNvml:
    source = "none"
    available = False

    def __init__(self, reason: str = "NVML is not available") -> None:
        self.reason = reason
        self.host = socket.gethostname()
        self.notes: list[str] = []

    def device_count(self) -> int:
        return 0

    def name(self, i: int) -> str | None:
        return None

    def uuid(self, i: int) -> str | None:
        return None

    def bus_id(self, i: int) -> str | None:
        return None

    def arch(self, i: int) -> str | None:
        return None

    def numa_node(self, i: int) -> int | None:
        return None

    def pcie_link(self, i: int) -> tuple[int | None, int | None, int | None, int | None]:
        return (None, None, None, None)

    def nvlink_count(self, i: int) -> int | None:
        return None

    def nvlink_state(self, i: int, link: int) -> bool | None:
        return None

    def nvlink_version(self, i: int, link: int) -> int | None:
        return None

    def nvlink_remote_bus_id(self, i: int, link: int) -> str | None:
        return None

    def nvlink_remote_type(self, i: int, link: int) -> str | None:
        return None

    def pair_level(self, i: int, j: int) -> str | None:
        return None

    def p2p_read(self, i: int, j: int) -> str | None:
        return None

    def utilization(self, i: int) -> tuple[float, float] | None:
        return None

    def memory(self, i: int) -> tuple[int, int] | None:
        return None

    def counters(self, i: int, links: list[int]) -> dict[str, Counter | None]:
        return {}

    def pcie_throughput(self, i: int) -> tuple[float, float] | None:
        return None

    def nvlink_rates(self, i: int, links: list[int]) -> dict[str, float | None] | None:
        return None

    def close(self) -> None:
        pass
