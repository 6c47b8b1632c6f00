"""A stand-in for the `pynvml` module, built from a fixture, speaking NVML's raw
encodings (8-digit PCI domains, nvmlNvlinkVersion_t codes, topology level numbers,
field-value structs) so the real backend's decoding and error handling run without a GPU.

``errors`` makes functions raise: {"nvmlDeviceGetNvLinkRemoteDeviceType": 3} raises
NVMLError(3) on every call; {("nvmlDeviceGetUtilizationRates", 1): 3} only for GPU 1.
``field_errors`` sets a field's nvmlReturn: {138: 3} makes NVLink TX "not supported".
``calls`` counts calls per function name.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace

from commviz.topo.fake import check_fixture

LEVEL_CODES = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
P2P_CODES = {"OK": 0, "CNS": 1, "GNS": 2, "TNS": 3, "DR": 4, "NS": 5, "U": 6}
ARCH_CODES = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
              "hopper": 9, "blackwell": 10}
VERSION_ENUM = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}
REMOTE_CODES = {"gpu": 0, "nvswitch": 2, "other": 0xFF}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 4: "Insufficient Permissions", 12: "NVML Shared Library Not Found",
                13: "Function Not Found", 15: "GPU is lost", 2: "Invalid Argument"}.get(self.value, "Unknown Error")


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def raw_bus(bus_id: str | None) -> str | None:
    """NVML's spelling: 8-digit domain, upper case."""
    if bus_id is None:
        return None
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


class FakePynvml:
    NVMLError = NVMLError
    NVML_FI_DEV_NVLINK_LINK_COUNT = 91
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
    NVML_GPM_METRICS_GET_VERSION = 1
    # pynvml really spells it with a trailing comma; the backend must not use it.
    NVML_P2P_CAPS_INDEX_READ = (0,)

    def __init__(self, fixture: dict, errors: dict | None = None, field_errors: dict | None = None,
                 init_error: int | None = None, legacy_versions: bool = False,
                 counters: dict | None = None, t_us: list[int] | None = None, gpm: dict | None = None) -> None:
        self.fx = check_fixture(fixture)
        self.errors = dict(errors or {})
        self.field_errors = dict(field_errors or {})
        self.init_error = init_error
        self.legacy_versions = legacy_versions
        self.counters = counters or {}  # (gpu, field id, scope) -> list of values
        self.t_us = t_us or [1_000_000 * k for k in range(1, 100)]
        self.gpm = gpm or {}  # (gpu, metric id) -> list of MiB/s values
        self.calls: collections.Counter = collections.Counter()
        self.shutdowns = 0
        self._field_step: dict[int, int] = collections.defaultdict(int)
        self._gpm_step: dict[int, int] = collections.defaultdict(int)
        self.gpm_allocated = 0
        self.gpm_freed = 0
        for link in range(18):
            setattr(self, f"NVML_GPM_METRIC_NVLINK_L{link}_RX_PER_SEC", 62 + 2 * link)
            setattr(self, f"NVML_GPM_METRIC_NVLINK_L{link}_TX_PER_SEC", 63 + 2 * link)

    # ------------------------------------------------------------- plumbing

    def _enter(self, name: str, handle: Handle | None = None) -> None:
        self.calls[name] += 1
        code = self.errors.get(name)
        if code is None and handle is not None:
            code = self.errors.get((name, handle.index))
        if code is not None:
            raise NVMLError(code)

    def _gpu(self, h: Handle) -> dict:
        return self.fx["gpus"][h.index]

    def _link(self, h: Handle, link: int) -> dict:
        g = self._gpu(h)
        for lk in g["links"]:
            if lk["link"] == link:
                return lk
        raise NVMLError(2)

    # ------------------------------------------------------------- lifecycle

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.fx["gpus"])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex", Handle(i))
        return Handle(i)

    # ------------------------------------------------------------- identity

    def nvmlDeviceGetName(self, h: Handle) -> str:
        self._enter("nvmlDeviceGetName", h)
        return self._gpu(h)["name"]

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return self._gpu(h)["uuid"]

    def nvmlDeviceGetPciInfo(self, h: Handle):
        self._enter("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=raw_bus(self._gpu(h)["bus_id"]).encode())  # bytes, as old pynvml did

    def nvmlDeviceGetArchitecture(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetArchitecture", h)
        return ARCH_CODES.get(self._gpu(h).get("arch"), 0xFFFFFFFF)

    def nvmlDeviceGetNumaNodeId(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetNumaNodeId", h)
        v = self._gpu(h).get("numa_node")
        return -1 if v is None else v

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return self._gpu(h)["pcie"]["gen"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return self._gpu(h)["pcie"]["width"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration", h)
        return self._gpu(h)["pcie"]["max_gen"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Handle) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkWidth", h)
        return self._gpu(h)["pcie"]["max_width"]

    # ------------------------------------------------------------- NVLink

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", h)
        return 1 if self._link(h, link).get("state") == "up" else 0

    def nvmlDeviceGetNvLinkVersion(self, h: Handle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkVersion", h)
        major = self._link(h, link)["version"]
        return major if self.legacy_versions else VERSION_ENUM[major]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Handle, link: int):
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", h)
        return SimpleNamespace(busId=raw_bus(self._link(h, link)["remote_bus_id"]))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Handle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", h)
        return REMOTE_CODES[self._link(h, link)["remote"]]

    # ------------------------------------------------------------- pairs

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", a)
        return LEVEL_CODES[self.fx["levels"][a.index][b.index]]

    def nvmlDeviceGetP2PStatus(self, a: Handle, b: Handle, index) -> int:
        self._enter("nvmlDeviceGetP2PStatus", a)
        if not isinstance(index, int):
            raise TypeError(f"p2pIndex must be an int (ctypes would refuse {index!r})")
        p2p = self.fx.get("p2p_read")
        if p2p is None:
            raise NVMLError(3)
        return P2P_CODES[p2p if isinstance(p2p, str) else p2p[a.index][b.index]]

    # ------------------------------------------------------------- samples

    def nvmlDeviceGetUtilizationRates(self, h: Handle):
        self._enter("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=42, memory=7)

    def nvmlDeviceGetMemoryInfo(self, h: Handle):
        self._enter("nvmlDeviceGetMemoryInfo", h)
        total = self._gpu(h).get("memory_total") or 0
        return SimpleNamespace(total=total, used=total // 4, free=total - total // 4)

    def nvmlDeviceGetPcieThroughput(self, h: Handle, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", h)
        return 1000 if counter == 0 else 2000  # KB/s

    def nvmlDeviceGetFieldValues(self, h: Handle, field_ids: list):
        self._enter("nvmlDeviceGetFieldValues", h)
        out = []
        is_counter_read = any((f[0] if isinstance(f, tuple) else f) in (138, 139, 197, 198) for f in field_ids)
        step = self._field_step[h.index]
        if is_counter_read:
            self._field_step[h.index] += 1
        for f in field_ids:
            fid, scope = f if isinstance(f, tuple) else (f, 0)
            ret = self.field_errors.get(fid, 0)
            v = SimpleNamespace(fieldId=fid, scopeId=scope, timestamp=self.t_us[min(step, len(self.t_us) - 1)],
                                latencyUsec=0, valueType=3, nvmlReturn=ret,
                                value=SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0))
            if ret == 0:
                if fid == 91:
                    v.valueType = 1
                    v.value.uiVal = self._gpu(h).get("nvlink_count", len(self._gpu(h)["links"]))
                else:
                    seq = self.counters.get((h.index, fid, scope), [0])
                    v.valueType = getattr(self, "value_types", {}).get(fid, 3)  # 1: a 32-bit counter
                    setattr(v.value, "uiVal" if v.valueType == 1 else "ullVal", seq[min(step, len(seq) - 1)])
            out.append(v)
        return out

    # ------------------------------------------------------------- GPM

    def nvmlGpmQueryDeviceSupport(self, h: Handle):
        self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(isSupportedDevice=1 if any(k[0] == h.index for k in self.gpm) else 0)

    def nvmlGpmSampleAlloc(self):
        self._enter("nvmlGpmSampleAlloc")
        self.gpm_allocated += 1
        return SimpleNamespace(gpu=None, step=None)

    def nvmlGpmSampleGet(self, h: Handle, sample):
        self._enter("nvmlGpmSampleGet", h)
        sample.gpu = h.index
        sample.step = self._gpm_step[h.index]
        self._gpm_step[h.index] += 1
        return sample

    def nvmlGpmSampleFree(self, sample) -> None:
        self.gpm_freed += 1

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(64)])

    def nvmlGpmMetricsGet(self, mg):
        self._enter("nvmlGpmMetricsGet")
        gpu, step = mg.sample2.gpu, mg.sample1.step
        for k in range(mg.numMetrics):
            m = mg.metrics[k]
            seq = self.gpm.get((gpu, m.metricId))
            if seq is None:
                m.nvmlReturn = 3
            else:
                m.value = float(seq[min(step, len(seq) - 1)])
        return mg
