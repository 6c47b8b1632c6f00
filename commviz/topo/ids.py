"""One spelling for GPU identities.

Ranks report their GPU by UUID or PCI bus id (CUDA_VISIBLE_DEVICES renumbers devices,
so an index from a rank means nothing to NVML). The same GPU is spelled differently by
each tool: NVML says ``00000000:18:00.0`` and ``GPU-5e6f…``, CUDA and torch say
``0000:18:00.0`` and a bare UUID. These helpers turn every spelling into one so that
lookups compare like with like.
"""

from __future__ import annotations

import re

_BUS_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def normalize_bus_id(bus_id: str | None) -> str | None:
    """``00000000:18:00.0``, ``0000:18:00.0`` and ``18:00.0`` all become ``0000:18:00.0``.

    None, empty or unparseable input gives None: a bus id that cannot be compared is
    not an identity.
    """
    if not bus_id:
        return None
    m = _BUS_RE.match(str(bus_id).strip())
    if m is None:
        return None
    domain = int(m.group("domain") or "0", 16)
    return bus_id_from_parts(domain, int(m.group("bus"), 16), int(m.group("dev"), 16), int(m.group("fn") or "0"))


def bus_id_from_parts(domain: int, bus: int, device: int, function: int = 0) -> str:
    """The canonical spelling from numbers (torch exposes pci_domain_id/pci_bus_id/pci_device_id)."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def normalize_uuid(uuid: str | None) -> str | None:
    """``GPU-5E6F…`` and ``5e6f…`` (torch's spelling) both become ``5e6f…``, lowercase.

    The ``GPU-``/``MIG-`` prefix is dropped only for comparison; documents keep NVML's
    own spelling.
    """
    if not uuid:
        return None
    u = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            u = u[len(prefix):]
    return u or None
