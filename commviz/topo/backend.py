"""What every NVML backend answers: the real one (pynvml), the fake one (fixtures,
presets) and the null one (no driver).

Each question is about one item and answers None when that item is not available —
unsupported on this GPU, not in this driver, no permission, no NVML at all. Callers
never see an NVML exception, so one missing figure never hides the others.

Counters come back cumulative in bytes with NVML's per-value timestamp (microseconds),
keyed ``"nvlink<L>.tx"``/``"nvlink<L>.rx"``/``"pcie.tx"``/``"pcie.rx"``; turning them
into rates is `commviz.topo.rates`' job.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

# (cumulative bytes, timestamp in microseconds[, the counter's modulus in bytes when
# known: it wraps to 0 there])
Counter = tuple


@runtime_checkable
class NvmlBackend(Protocol):
    source: str  # "nvml" | "preset:<name>" | "fixture:<file>" | "none"
    host: str
    available: bool
    reason: str  # why not available; "" when available
    notes: list[str]  # one line per item that was not available, each said once

    def device_count(self) -> int: ...

    def name(self, i: int) -> str | None: ...

    def uuid(self, i: int) -> str | None: ...

    def bus_id(self, i: int) -> str | None:
        """Normalized (``0000:18:00.0``)."""

    def arch(self, i: int) -> str | None:
        """``"hopper"``, ``"ampere"`` …"""

    def numa_node(self, i: int) -> int | None: ...

    def pcie_link(self, i: int) -> tuple[int | None, int | None, int | None, int | None]:
        """(current gen, current width, max gen, max width); current drops when idle."""

    def nvlink_count(self, i: int) -> int | None:
        """From NVML's link-count field, not a hard-coded maximum."""

    def nvlink_state(self, i: int, link: int) -> bool | None: ...

    def nvlink_version(self, i: int, link: int) -> int | None:
        """NVLink generation (1..5), already decoded from NVML's enum."""

    def nvlink_remote_bus_id(self, i: int, link: int) -> str | None: ...

    def nvlink_remote_type(self, i: int, link: int) -> str | None:
        """``"gpu"``, ``"nvswitch"`` or ``"other"``."""

    def pair_level(self, i: int, j: int) -> str | None:
        """PCIe/NUMA relationship: PIX, PXB, PHB, NODE or SYS."""

    def p2p_read(self, i: int, j: int) -> str | None:
        """P2P read status label: OK, CNS, GNS, TNS, DR, NS, U."""

    def utilization(self, i: int) -> tuple[float, float] | None:
        """(GPU busy %, memory controller busy %)."""

    def memory(self, i: int) -> tuple[int, int] | None:
        """(used bytes, total bytes)."""

    def counters(self, i: int, links: list[int]) -> dict[str, Counter | None]:
        """NVLink data TX/RX per link and PCIe TX/RX, one NVML call for the GPU."""

    def pcie_throughput(self, i: int) -> tuple[float, float] | None:
        """(TX, RX) bytes/s over NVML's own 20 ms window; blocks for about 40 ms."""

    def nvlink_rates(self, i: int, links: list[int]) -> dict[str, float | None] | None:
        """Per-link bytes/s from GPM (Hopper and later), keyed like `counters`; None when
        GPM is not available. The first call primes and returns {}."""

    def close(self) -> None: ...


def open_backend() -> NvmlBackend:
    """The real NVML backend when NVML starts here, else the null one carrying the
    reason. Importing and initialising NVML happens now, not at module import."""
    from commviz.topo.null import NullNvml
    from commviz.topo.real import RealNvml

    real = RealNvml()
    if real.available:
        return real
    return NullNvml(real.reason)
