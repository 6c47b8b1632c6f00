"""The real NVML backend (nvidia-ml-py, ``import pynvml``).

Every call goes through `_call`: an NVML error, a function this driver lacks, or
anything else odd becomes None for that item and one note, said once. Items that
cannot start working later (not supported, no permission, function not found, GPU
lost) are not asked again, so the sampler's per-tick cost stays a handful of calls.

pynvml is imported when the backend is built, never at module import, so the probe
can import this module on machines with no driver and no cost.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from types import ModuleType
from typing import Any

from commviz.topo.backend import Counter
from commviz.topo.facts import ARCHITECTURES, P2P_STATUS, REMOTE_TYPES, TOPOLOGY_LEVELS, nvlink_major
from commviz.topo.ids import normalize_bus_id

# nvmlReturn_t codes after which asking again is pointless.
_PERMANENT = {3, 4, 13, 15, 26}  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, GPU_IS_LOST, DEPRECATED

# Field ids, with the numbers from nvml.h for pynvml builds that predate a name.
_FIELDS = {
    "NVML_FI_DEV_NVLINK_LINK_COUNT": 91,
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": 138,  # KiB, cumulative, scopeId = link
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": 139,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197,  # bytes, cumulative
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
}

# nvmlValueType_t -> the nvmlValue_t member holding it.
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# Widths of the unsigned value types: where a cumulative counter wraps. ulVal is a C
# unsigned long: 64 bits on the Linux hosts NVML runs on.
_VALUE_BITS = {1: 32, 2: 64, 3: 64, 6: 16}

# nvmlInit failures that mean "no usable driver here", said in words.
_INIT_HINTS = {12: "no NVIDIA driver is installed here", 9: "the NVIDIA driver is not loaded",
               18: "the NVIDIA driver and kernel module versions differ; reboot or reload the driver"}

# pynvml spells NVML_P2P_CAPS_INDEX_READ as `0,` — a tuple — so the enum value is used.
_P2P_CAPS_INDEX_READ = 0


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    code = getattr(exc, "value", None)
    if text and code is not None:
        return f"{text}, NVML code {code}"
    return text or type(exc).__name__


class RealNvml:
    source = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None, sysfs_pci: str = "/sys/bus/pci/devices") -> None:
        self.host = socket.gethostname()
        self.available = False
        self.reason = ""
        self.notes: list[str] = []
        self.on_note: Callable[[str], None] | None = None  # e.g. the probe's warn-once
        self._said: set[str] = set()
        self._dead: set[tuple] = set()
        self._handles: list[Any] = []
        self._arch: dict[int, str | None] = {}
        self._dead_fields: dict[int, set[str]] = {}
        self._gpm_prev: dict[int, Any] = {}
        self._sysfs_pci = sysfs_pci
        self._inited = False
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 — only when a backend is wanted
            except Exception as exc:
                self.reason = f"NVML is not available (nvidia-ml-py cannot be imported: {_describe(exc)})"
                return
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            why = _INIT_HINTS.get(getattr(exc, "value", None))
            self.reason = f"NVML is not available ({_describe(exc)}{'; ' + why if why else ''})"
            return
        self._inited = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self.reason = f"NVML started but could not count GPUs ({_describe(exc)})"
            self.close()
            return
        for i in range(count):
            self._handles.append(self._call("nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, i))
        self.available = True

    # ------------------------------------------------------------- plumbing

    def _note(self, what: str, exc: BaseException | str) -> None:
        if what in self._said:
            return
        self._said.add(what)
        line = f"{what}: not available ({exc if isinstance(exc, str) else _describe(exc)})"
        self.notes.append(line)
        if self.on_note is not None:
            try:
                self.on_note(line)
            except Exception:
                pass

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, key: tuple | None = None,
              quiet: bool = False) -> Any:
        """fn(*args), or None with a note. ``key`` names an item that, once permanently
        unavailable, is not asked again."""
        if key is not None and key in self._dead:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if key is not None and (code in _PERMANENT or not isinstance(code, int)):
                self._dead.add(key)
            if not quiet:
                self._note(what, exc)
            return None

    def _h(self, i: int) -> Any:
        return self._handles[i] if 0 <= i < len(self._handles) else None

    def _fn(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._nvml, name, None)
        if fn is None:
            def missing(*_a: Any) -> Any:
                raise RuntimeError(f"this pynvml has no {name}")
            return missing
        return fn

    def _field_id(self, name: str) -> int:
        value = getattr(self._nvml, name, None)
        return value if isinstance(value, int) else _FIELDS[name]

    @staticmethod
    def _field_value(v: Any) -> float | int | None:
        if getattr(v, "nvmlReturn", 1) != 0:
            return None
        member = _VALUE_MEMBER.get(getattr(v, "valueType", 3), "ullVal")
        return getattr(v.value, member)

    def _device(self, what: str, fn_name: str, i: int, *extra: Any, key: tuple | None = None,
                quiet: bool = False) -> Any:
        h = self._h(i)
        if h is None:
            return None
        return self._call(what, self._fn(fn_name), h, *extra, key=key, quiet=quiet)

    # ------------------------------------------------------------- identity

    def device_count(self) -> int:
        return len(self._handles)

    def name(self, i: int) -> str | None:
        v = self._device("GPU name (nvmlDeviceGetName)", "nvmlDeviceGetName", i)
        return _text(v)

    def uuid(self, i: int) -> str | None:
        return _text(self._device("GPU UUID (nvmlDeviceGetUUID)", "nvmlDeviceGetUUID", i))

    def bus_id(self, i: int) -> str | None:
        pci = self._device("PCI bus id (nvmlDeviceGetPciInfo)", "nvmlDeviceGetPciInfo", i)
        return normalize_bus_id(_text(getattr(pci, "busId", None))) if pci is not None else None

    def arch(self, i: int) -> str | None:
        if i not in self._arch:
            raw = self._device("architecture (nvmlDeviceGetArchitecture)", "nvmlDeviceGetArchitecture", i)
            self._arch[i] = ARCHITECTURES.get(raw) if isinstance(raw, int) else None
        return self._arch[i]

    def numa_node(self, i: int) -> int | None:
        v = self._device("NUMA node", "nvmlDeviceGetNumaNodeId", i, quiet=True)
        if isinstance(v, int) and v >= 0:
            return v
        # Older drivers lack nvmlDeviceGetNumaNodeId; Linux says it for every PCI device.
        bus = self.bus_id(i)
        if bus:
            try:
                with open(os.path.join(self._sysfs_pci, bus, "numa_node")) as f:
                    node = int(f.read().strip())
                if node >= 0:
                    return node
            except (OSError, ValueError):
                pass
        self._note("NUMA node", "neither nvmlDeviceGetNumaNodeId nor sysfs numa_node answered")
        return None

    def pcie_link(self, i: int) -> tuple[int | None, int | None, int | None, int | None]:
        what = "PCIe link generation/width (nvmlDeviceGet{Curr,Max}PcieLink*)"
        return (self._device(what, "nvmlDeviceGetCurrPcieLinkGeneration", i),
                self._device(what, "nvmlDeviceGetCurrPcieLinkWidth", i),
                self._device(what, "nvmlDeviceGetMaxPcieLinkGeneration", i),
                self._device(what, "nvmlDeviceGetMaxPcieLinkWidth", i))

    # ------------------------------------------------------------- NVLink

    def nvlink_count(self, i: int) -> int | None:
        fid = self._field_id("NVML_FI_DEV_NVLINK_LINK_COUNT")
        vals = self._device("NVLink count (NVML_FI_DEV_NVLINK_LINK_COUNT)", "nvmlDeviceGetFieldValues", i, [fid])
        if not vals:
            return None
        v = self._field_value(vals[0])
        if v is None:
            self._note("NVLink count (NVML_FI_DEV_NVLINK_LINK_COUNT)", f"NVML code {getattr(vals[0], 'nvmlReturn', '?')}")
            return None
        return int(v)

    def nvlink_state(self, i: int, link: int) -> bool | None:
        v = self._device("NVLink state (nvmlDeviceGetNvLinkState)", "nvmlDeviceGetNvLinkState", i, link)
        return None if v is None else bool(v)

    def nvlink_version(self, i: int, link: int) -> int | None:
        raw = self._device("NVLink version (nvmlDeviceGetNvLinkVersion)", "nvmlDeviceGetNvLinkVersion", i, link)
        return nvlink_major(raw, self.arch(i)) if isinstance(raw, int) else None

    def nvlink_remote_bus_id(self, i: int, link: int) -> str | None:
        pci = self._device("NVLink remote PCI info (nvmlDeviceGetNvLinkRemotePciInfo_v2)",
                           "nvmlDeviceGetNvLinkRemotePciInfo", i, link)
        return normalize_bus_id(_text(getattr(pci, "busId", None))) if pci is not None else None

    def nvlink_remote_type(self, i: int, link: int) -> str | None:
        v = self._device("NVLink remote device type (nvmlDeviceGetNvLinkRemoteDeviceType)",
                         "nvmlDeviceGetNvLinkRemoteDeviceType", i, link)
        return REMOTE_TYPES.get(v, "other") if isinstance(v, int) else None

    # ------------------------------------------------------------- pairs

    def pair_level(self, i: int, j: int) -> str | None:
        hi, hj = self._h(i), self._h(j)
        if hi is None or hj is None:
            return None
        v = self._call("PCIe topology level (nvmlDeviceGetTopologyCommonAncestor)",
                       self._fn("nvmlDeviceGetTopologyCommonAncestor"), hi, hj)
        return TOPOLOGY_LEVELS.get(v) if isinstance(v, int) else None

    def p2p_read(self, i: int, j: int) -> str | None:
        hi, hj = self._h(i), self._h(j)
        if hi is None or hj is None:
            return None
        v = self._call("P2P status (nvmlDeviceGetP2PStatus)", self._fn("nvmlDeviceGetP2PStatus"),
                       hi, hj, _P2P_CAPS_INDEX_READ)
        return P2P_STATUS.get(v, "U") if isinstance(v, int) else None

    # ------------------------------------------------------------- samples

    def utilization(self, i: int) -> tuple[float, float] | None:
        u = self._device("GPU utilization (nvmlDeviceGetUtilizationRates)", "nvmlDeviceGetUtilizationRates", i,
                         key=("util", i))
        return (float(u.gpu), float(u.memory)) if u is not None else None

    def memory(self, i: int) -> tuple[int, int] | None:
        m = self._device("GPU memory (nvmlDeviceGetMemoryInfo)", "nvmlDeviceGetMemoryInfo", i, key=("mem", i))
        return (int(m.used), int(m.total)) if m is not None else None

    def counters(self, i: int, links: list[int]) -> dict[str, Counter | None]:
        """One nvmlDeviceGetFieldValues call: NVLink data TX/RX per link (KiB, scopeId =
        link) and the PCIe byte counters. A field the GPU refuses once is dropped."""
        h = self._h(i)
        if h is None:
            return {}
        dead = self._dead_fields.setdefault(i, set())
        tx = self._field_id("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX")
        rx = self._field_id("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")
        wanted: list[tuple[str, str, Any, int]] = []  # (key, kind, field id or (id, scope), bytes per unit)
        for link in links:
            wanted.append((f"nvlink{link}.tx", "nvlink", (tx, link), 1024))
            wanted.append((f"nvlink{link}.rx", "nvlink", (rx, link), 1024))
        wanted.append(("pcie.tx", "pcie", self._field_id("NVML_FI_DEV_PCIE_COUNT_TX_BYTES"), 1))
        wanted.append(("pcie.rx", "pcie", self._field_id("NVML_FI_DEV_PCIE_COUNT_RX_BYTES"), 1))
        out: dict[str, Counter | None] = {w[0]: None for w in wanted}
        ask = [w for w in wanted if w[1] not in dead]
        if not ask:
            return out
        vals = self._call("counters (nvmlDeviceGetFieldValues)", self._fn("nvmlDeviceGetFieldValues"), h,
                          [w[2] for w in ask], key=("fields", i))
        if vals is None:
            return out
        refused: dict[str, int] = {}
        got: set[str] = set()
        for (key, kind, _fid, unit), v in zip(ask, vals):
            value = self._field_value(v)
            if value is None:
                refused.setdefault(kind, getattr(v, "nvmlReturn", -1))
                continue
            got.add(kind)
            bits = _VALUE_BITS.get(getattr(v, "valueType", 3))
            out[key] = (int(value) * unit, int(getattr(v, "timestamp", 0)), (1 << bits) * unit if bits else None)
        for kind, code in refused.items():
            label = ("NVLink throughput counters (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_*)" if kind == "nvlink"
                     else "PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_*_BYTES)")
            self._note(label, f"NVML code {code}")
            if kind not in got and code in _PERMANENT | {2}:  # INVALID_ARGUMENT: field unknown to this driver
                dead.add(kind)
        return out

    def pcie_throughput(self, i: int) -> tuple[float, float] | None:
        # KB/s over a 20 ms window, per NVML's documentation; KB taken as 1024 bytes.
        what = "PCIe throughput (nvmlDeviceGetPcieThroughput)"
        t = self._device(what, "nvmlDeviceGetPcieThroughput", i, 0, key=("pcie_tp", i))
        r = self._device(what, "nvmlDeviceGetPcieThroughput", i, 1, key=("pcie_tp", i))
        if t is None or r is None:
            return None
        return (float(t) * 1024.0, float(r) * 1024.0)

    def nvlink_rates(self, i: int, links: list[int]) -> dict[str, float | None] | None:
        """Per-link NVLink bytes/s from two GPM samples (MiB/s metrics, Hopper and later)."""
        key = ("gpm", i)
        h = self._h(i)
        if h is None or key in self._dead:
            return None
        nv = self._nvml
        what = "GPM NVLink metrics (nvmlGpm*)"
        support = self._call(what, self._fn("nvmlGpmQueryDeviceSupport"), h, key=key)
        if support is None or not getattr(support, "isSupportedDevice", 0):
            self._dead.add(key)
            if support is not None:
                self._note(what, "this GPU does not support GPM")
            return None
        sample = self._call(what, self._fn("nvmlGpmSampleAlloc"), key=key)
        if sample is None:
            return None
        if self._call(what, self._fn("nvmlGpmSampleGet"), h, sample) is None:
            self._call(what, self._fn("nvmlGpmSampleFree"), sample)
            return None
        prev = self._gpm_prev.get(i)
        self._gpm_prev[i] = sample
        if prev is None:
            return {}
        out: dict[str, float | None] = {}
        try:
            wanted = []
            for link in links:
                for d in ("rx", "tx"):
                    mid = getattr(nv, f"NVML_GPM_METRIC_NVLINK_L{link}_{d.upper()}_PER_SEC", None)
                    out[f"nvlink{link}.{d}"] = None
                    if isinstance(mid, int):
                        wanted.append((f"nvlink{link}.{d}", mid))
            if not wanted:
                return out
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(wanted)
            mg.sample1 = prev
            mg.sample2 = sample
            for k, (_key, mid) in enumerate(wanted):
                mg.metrics[k].metricId = mid
            if self._call(what, self._fn("nvmlGpmMetricsGet"), mg) is None:
                return out
            for k, (okey, _mid) in enumerate(wanted):
                m = mg.metrics[k]
                out[okey] = float(m.value) * 1048576.0 if m.nvmlReturn == 0 else None
            return out
        except Exception as exc:
            self._note(what, exc)
            return out
        finally:
            self._call(what, self._fn("nvmlGpmSampleFree"), prev, quiet=True)

    def close(self) -> None:
        for sample in self._gpm_prev.values():
            self._call("GPM", self._fn("nvmlGpmSampleFree"), sample, quiet=True)
        self._gpm_prev.clear()
        if self._inited:
            self._inited = False
            self._call("nvmlShutdown", self._fn("nvmlShutdown"), quiet=True)


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    return str(v)
