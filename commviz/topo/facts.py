"""Fixed facts about NVIDIA hardware and NVML's encodings, in one table each.

Kept apart from the backends so the fake, the real backend and the renderer agree on
what a level or a version number means.
"""

from __future__ import annotations

# nvmlGpuTopologyLevel_t -> the label `nvidia-smi topo -m` prints. INTERNAL (two GPUs
# on one board) has no label of its own there; it is closer than a single switch, so it
# reads as PIX.
TOPOLOGY_LEVELS: dict[int, str] = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# Closest first; used to validate fixtures and to order legend lines.
LEVEL_LABELS: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")

LEGEND: tuple[tuple[str, str], ...] = (
    ("X", "Self"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g. QPI/UPI)"),
    ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe host bridges within a NUMA node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe host bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe host bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks (directly or through NVSwitch)"),
)

# nvmlGpuP2PStatus_t -> the short labels of `nvidia-smi topo -p2p r`.
P2P_STATUS: dict[int, str] = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
P2P_LABELS: tuple[str, ...] = ("OK", "CNS", "GNS", "TNS", "DR", "NS", "U")

# nvmlDeviceArchitecture_t
ARCHITECTURES: dict[int, str] = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
    8: "ada", 9: "hopper", 10: "blackwell", 13: "rubin",
}

# The NVLink generation each architecture's data-centre parts carry.
NVLINK_MAJOR_BY_ARCH: dict[str, int] = {"pascal": 1, "volta": 2, "turing": 2, "ampere": 3, "hopper": 4, "blackwell": 5}

# nvmlNvlinkVersion_t: what nvmlDeviceGetNvLinkVersion returns on current drivers
# (1.0, 2.0, 2.2, 3.0, 3.1, 4.0, 5.0, 6.0) -> major generation.
NVLINK_VERSION_ENUM_MAJOR: dict[int, int] = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

# Nominal data rate of one link, one direction, GB/s (1e9 B/s), per generation, from
# NVIDIA's published per-GPU totals: P100 4 links 160 GB/s both ways; V100 6 links
# 300 GB/s; A100 12 links 600 GB/s; H100 18 links 900 GB/s; B200 18 links 1.8 TB/s.
# Workstation parts with narrower links (RTX A6000 bridges) run slower than this.
NVLINK_GBPS_PER_DIRECTION: dict[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}

# nvmlNvLinkDeviceType_t -> our remote kinds.
REMOTE_TYPES: dict[int, str] = {0: "gpu", 1: "other", 2: "nvswitch", 0xFF: "other"}
REMOTE_KINDS: tuple[str, ...] = ("gpu", "nvswitch", "other")


def nvlink_major(raw: int | None, arch: str | None = None) -> int | None:
    """NVLink generation from nvmlDeviceGetNvLinkVersion's raw value.

    Drivers since the nvmlNvlinkVersion_t enum return its code (H100 says 6 for NVLink
    4.0, A100 says 4 for 3.0); older drivers returned the plain generation (A100 said 3).
    The two readings disagree for 3..6, so the architecture decides: when the enum
    reading contradicts the GPU's generation and the plain reading matches it, the plain
    one wins. Without an architecture the enum reading is taken.
    """
    if raw is None or raw <= 0:
        return None
    enum_major = NVLINK_VERSION_ENUM_MAJOR.get(raw)
    expected = NVLINK_MAJOR_BY_ARCH.get(arch or "")
    if expected is not None and enum_major != expected and raw == expected:
        return raw
    return enum_major  # None for codes this table does not know yet


def link_gbps(version: int | None) -> float | None:
    """Nominal GB/s per direction of one link of this generation, None when unknown."""
    return NVLINK_GBPS_PER_DIRECTION.get(version) if version else None
