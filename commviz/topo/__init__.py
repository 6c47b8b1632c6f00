"""GPU topology and NVLink/PCIe counters from NVML — real where there are GPUs, faithful
fakes (fixtures, presets) where there are none, and a null backend where there is no
driver.

    backend = open_backend()            # or load_preset("dgx-h100"), FakeNvml.from_file(path)
    topo = discover(backend)            # Topology: gpus, links, matrix(), gpu_for(uuid=…)
    RateTracker().update(key, cumulative, t_us)   # counters -> bytes/s

The names below load on first use, so the probe importing `commviz.topo.rates` pays for
that module only, and no NVML is imported until a backend is opened.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "NvmlBackend": "backend", "open_backend": "backend",
    "discover": "discover",
    "FakeNvml": "fake", "FixtureError": "fake", "load_fixture": "fake",
    "bus_id_from_parts": "ids", "normalize_bus_id": "ids", "normalize_uuid": "ids",
    "Gpu": "model", "Link": "model", "Topology": "model",
    "NullNvml": "null",
    "load_preset": "presets", "preset_names": "presets",
    "RateTracker": "rates",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commviz.topo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"commviz.topo.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
