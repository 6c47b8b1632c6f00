"""A backend driven by a fixture: a JSON document describing GPUs, links, pair levels
and scripted counter sequences. Presets are fixtures; `commviz nvml-dump` writes one
from a real machine. Tests use it to play counter wraps, resets, unsupported fields
and a missing NVML without a GPU.

Fixture format (version 1), every key but ``gpus`` optional::

    {"format": "commviz-nvml-fixture", "version": 1, "host": "h", "description": "…",
     "nvml": "missing",                       # behave as a machine without NVML
     "gpus": [{"name": "…", "uuid": "GPU-…", "bus_id": "0000:18:00.0", "arch": "hopper",
               "numa_node": 0, "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
               "memory_total": 85520809984,
               "nvlink_count": 18,              # the link-count field; default: links listed
               "links": [{"count": 5, "state": "up", "version": 4, "remote": "nvswitch",
                          "remote_bus_id": "0000:05:00.0"}]}],   # "link": N or "count": K
     "levels": [["X", "NODE"], ["NODE", "X"]],   # PCIe relationship per pair
     "p2p_read": "OK",                           # or a matrix of labels
     "counters": {"t_us": [..], "gpus": {"0": {"nvlink": {"3": {"tx_kib": [..], "rx_kib": [..]}},
                                               "pcie": {"tx_bytes": [..], "rx_bytes": [..]}}}},
     "samples": {"gpus": {"0": {"util": [..], "mem_util": [..], "mem_used": [..],
                                "pcie_tx_Bps": [..], "pcie_rx_Bps": [..]}}},
     "gpm": {"gpus": {"0": {"3": {"tx_mib_s": [..], "rx_mib_s": [..]}}}},
     "unsupported": ["nvlink_counters", "gpu1:utilization"]}

Scripts advance one step per call of that kind on that GPU and hold their last value
when they run out (time keeps moving, so an exhausted script reads as idle). A null in
a script is "not available" at that step. Counters for up links that no script names
read 0 (supported, idle).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from commviz.topo.backend import Counter
from commviz.topo.facts import LEVEL_LABELS, P2P_LABELS, REMOTE_KINDS
from commviz.topo.ids import normalize_bus_id

FORMAT = "commviz-nvml-fixture"
VERSION = 1
T0_US = 1_700_000_000_000_000  # a fixed epoch so fake timestamps look like NVML's
STEP_US = 100_000

UNSUPPORTABLE = ("name", "uuid", "bus_id", "arch", "numa_node", "pcie_link", "nvlink_count", "nvlink_state",
                 "nvlink_version", "nvlink_remote_bus_id", "nvlink_remote_type", "pair_level", "p2p_read",
                 "utilization", "memory", "nvlink_counters", "pcie_counters", "pcie_throughput", "gpm")


class FixtureError(ValueError):
    """A fixture that does not follow the format; the message names the bad key."""


# ------------------------------------------------------------------ loading


def load_fixture(path: str | os.PathLike) -> dict:
    """Read and check a fixture file; link groups (``"count"``) come back expanded."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    try:
        return check_fixture(doc)
    except FixtureError as exc:
        raise FixtureError(f"{path}: {exc}") from None


def check_fixture(doc: Any) -> dict:
    """Validate a fixture document and return a copy with link groups expanded."""
    if not isinstance(doc, dict):
        raise FixtureError("a fixture is a JSON object")
    if doc.get("format", FORMAT) != FORMAT:
        raise FixtureError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("version", VERSION) != VERSION:
        raise FixtureError(f"version {doc.get('version')!r} is not supported (this commviz reads {VERSION})")
    out = copy.deepcopy(doc)
    gpus = out.get("gpus", [])
    if not isinstance(gpus, list):
        raise FixtureError("gpus: expected a list")
    if out.get("nvml") not in (None, "missing"):
        raise FixtureError(f"nvml: {out.get('nvml')!r} is not 'missing'")
    for gi, g in enumerate(gpus):
        where = f"gpus[{gi}]"
        if not isinstance(g, dict):
            raise FixtureError(f"{where}: expected an object")
        if "index" in g and g["index"] != gi:
            raise FixtureError(f"{where}.index: is {g['index']}, but GPUs are listed in index order")
        for k in ("bus_id",):
            if g.get(k) is not None and normalize_bus_id(g[k]) is None:
                raise FixtureError(f"{where}.{k}: {g[k]!r} is not a PCI bus id")
        g["links"] = _expand_links(g.get("links", []), where)
        n = g.get("nvlink_count", len(g["links"]))
        if n is not None and (not isinstance(n, int) or n < 0):
            raise FixtureError(f"{where}.nvlink_count: expected a count, got {n!r}")
    n = len(gpus)
    if "levels" in out:
        _check_matrix(out["levels"], n, "levels", set(LEVEL_LABELS) | {"X", None})
    p2p = out.get("p2p_read")
    if isinstance(p2p, str):
        if p2p not in P2P_LABELS:
            raise FixtureError(f"p2p_read: {p2p!r} is not one of {', '.join(P2P_LABELS)}")
    elif p2p is not None:
        _check_matrix(p2p, n, "p2p_read", set(P2P_LABELS) | {"X", None})
    for item in out.get("unsupported", []):
        name = item.split(":", 1)[1] if ":" in item else item
        if name not in UNSUPPORTABLE:
            raise FixtureError(f"unsupported: {item!r} names no item (one of {', '.join(UNSUPPORTABLE)})")
    t_us = (out.get("counters") or {}).get("t_us")
    if t_us is not None and (not isinstance(t_us, list) or not all(isinstance(t, int) for t in t_us)):
        raise FixtureError("counters.t_us: expected a list of integer microseconds")
    return out


def _expand_links(entries: Any, where: str) -> list[dict]:
    if not isinstance(entries, list):
        raise FixtureError(f"{where}.links: expected a list")
    links: list[dict] = []
    seen: set[int] = set()
    nxt = 0
    for li, e in enumerate(entries):
        w = f"{where}.links[{li}]"
        if not isinstance(e, dict):
            raise FixtureError(f"{w}: expected an object")
        if e.get("state") not in ("up", "down", None):
            raise FixtureError(f"{w}.state: {e.get('state')!r} is not 'up', 'down' or null")
        if e.get("remote") not in (*REMOTE_KINDS, None):
            raise FixtureError(f"{w}.remote: {e.get('remote')!r} is not one of {', '.join(REMOTE_KINDS)}")
        if e.get("remote_bus_id") is not None and normalize_bus_id(e["remote_bus_id"]) is None:
            raise FixtureError(f"{w}.remote_bus_id: {e['remote_bus_id']!r} is not a PCI bus id")
        count = e.get("count", 1)
        if not isinstance(count, int) or count < 1:
            raise FixtureError(f"{w}.count: expected a positive integer")
        first = e.get("link", nxt)
        for k in range(count):
            number = first + k
            if number in seen:
                raise FixtureError(f"{w}: link {number} listed twice")
            seen.add(number)
            one = {key: val for key, val in e.items() if key not in ("count", "link")}
            links.append({"link": number, **one})
        nxt = first + count
    return links


def _check_matrix(m: Any, n: int, where: str, allowed: set) -> None:
    if not isinstance(m, list) or len(m) != n or not all(isinstance(r, list) and len(r) == n for r in m):
        raise FixtureError(f"{where}: expected a {n}x{n} matrix")
    for i, row in enumerate(m):
        for j, cell in enumerate(row):
            if cell not in allowed:
                raise FixtureError(f"{where}[{i}][{j}]: {cell!r} is not one of "
                                   f"{', '.join(sorted(str(a) for a in allowed if a))}")


# ------------------------------------------------------------------ backend


class FakeNvml:
    def __init__(self, fixture: dict, source: str = "fixture:<memory>") -> None:
        self.fixture = check_fixture(fixture)
        self.source = source
        self.host = str(self.fixture.get("host") or "fixture")
        self.available = self.fixture.get("nvml") != "missing"
        self.reason = "" if self.available else "NVML is not available (the fixture describes a machine without it)"
        self.notes: list[str] = []
        self._said: set[str] = set()
        self._gpus: list[dict] = self.fixture.get("gpus", []) if self.available else []
        self._links = [{lk["link"]: lk for lk in g["links"]} for g in self._gpus]
        self._steps: dict[tuple[str, int], int] = {}
        self._unsupported = set(self.fixture.get("unsupported", []))

    @classmethod
    def from_file(cls, path: str | os.PathLike, source: str | None = None) -> "FakeNvml":
        return cls(load_fixture(path), source or f"fixture:{os.fspath(path)}")

    # ------------------------------------------------------------- plumbing

    def _off(self, item: str, i: int | None = None) -> bool:
        off = item in self._unsupported or (i is not None and f"gpu{i}:{item}" in self._unsupported)
        if off and item not in self._said:
            self._said.add(item)
            self.notes.append(f"{item}: not available (unsupported in this fixture)")
        return off

    def _g(self, i: int) -> dict | None:
        return self._gpus[i] if 0 <= i < len(self._gpus) else None

    def _attr(self, item: str, i: int, key: str | None = None) -> Any:
        g = self._g(i)
        if g is None or self._off(item, i):
            return None
        return g.get(key or item)

    def _link(self, item: str, i: int, link: int) -> dict | None:
        if self._g(i) is None or self._off(item, i):
            return None
        count = self.nvlink_count(i)
        if count is None or not 0 <= link < count:
            return None
        return self._links[i].get(link)

    def _step(self, kind: str, i: int) -> int:
        k = self._steps.get((kind, i), 0)
        self._steps[(kind, i)] = k + 1
        return k

    def _t_us(self, k: int) -> int:
        script = (self.fixture.get("counters") or {}).get("t_us")
        if not script:
            return T0_US + k * STEP_US
        if k < len(script):
            return script[k]
        step = script[-1] - script[-2] if len(script) > 1 and script[-1] > script[-2] else STEP_US
        return script[-1] + (k - len(script) + 1) * step

    @staticmethod
    def _at(script: Any, k: int, default: Any) -> Any:
        if script is None:
            return default
        if not isinstance(script, list):
            return script
        if not script:
            return default
        return script[k] if k < len(script) else script[-1]

    def _gpu_script(self, section: str, i: int) -> dict:
        return ((self.fixture.get(section) or {}).get("gpus") or {}).get(str(i)) or {}

    # ------------------------------------------------------------- identity

    def device_count(self) -> int:
        return len(self._gpus)

    def name(self, i: int) -> str | None:
        return self._attr("name", i)

    def uuid(self, i: int) -> str | None:
        return self._attr("uuid", i)

    def bus_id(self, i: int) -> str | None:
        return normalize_bus_id(self._attr("bus_id", i))

    def arch(self, i: int) -> str | None:
        return self._attr("arch", i)

    def numa_node(self, i: int) -> int | None:
        return self._attr("numa_node", i)

    def pcie_link(self, i: int) -> tuple[int | None, int | None, int | None, int | None]:
        p = self._attr("pcie_link", i, "pcie") or {}
        return (p.get("gen"), p.get("width"), p.get("max_gen", p.get("gen")), p.get("max_width", p.get("width")))

    # ------------------------------------------------------------- NVLink

    def nvlink_count(self, i: int) -> int | None:
        g = self._g(i)
        if g is None or self._off("nvlink_count", i):
            return None
        return g.get("nvlink_count", len(g["links"]))

    def nvlink_state(self, i: int, link: int) -> bool | None:
        lk = self._link("nvlink_state", i, link)
        state = lk.get("state") if lk else None
        return None if state is None else state == "up"

    def nvlink_version(self, i: int, link: int) -> int | None:
        lk = self._link("nvlink_version", i, link)
        return lk.get("version") if lk else None

    def nvlink_remote_bus_id(self, i: int, link: int) -> str | None:
        lk = self._link("nvlink_remote_bus_id", i, link)
        return normalize_bus_id(lk.get("remote_bus_id")) if lk else None

    def nvlink_remote_type(self, i: int, link: int) -> str | None:
        lk = self._link("nvlink_remote_type", i, link)
        return lk.get("remote") if lk else None

    # ------------------------------------------------------------- pairs

    def _pair(self, item: str, key: str, i: int, j: int) -> str | None:
        if self._g(i) is None or self._g(j) is None or i == j or self._off(item, i):
            return None
        m = self.fixture.get(key)
        if isinstance(m, str):
            return m
        return m[i][j] if m else None

    def pair_level(self, i: int, j: int) -> str | None:
        return self._pair("pair_level", "levels", i, j)

    def p2p_read(self, i: int, j: int) -> str | None:
        return self._pair("p2p_read", "p2p_read", i, j)

    # ------------------------------------------------------------- samples

    def _sample_pair(self, what: str, i: int, a: str, b: str) -> tuple[float, float] | None:
        """Two scripted sample series of GPU `i` at the reading `what` is on."""
        if self._g(i) is None or self._off(what, i):
            return None
        k = self._step(what, i)
        s = self._gpu_script("samples", i)
        x, y = self._at(s.get(a), k, 0.0), self._at(s.get(b), k, 0.0)
        return None if x is None or y is None else (float(x), float(y))

    def utilization(self, i: int) -> tuple[float, float] | None:
        return self._sample_pair("utilization", i, "util", "mem_util")

    def memory(self, i: int) -> tuple[int, int] | None:
        g = self._g(i)
        if g is None or self._off("memory", i) or g.get("memory_total") is None:
            return None
        used = self._at(self._gpu_script("samples", i).get("mem_used"), self._step("memory", i), 0)
        return None if used is None else (int(used), int(g["memory_total"]))

    def counters(self, i: int, links: list[int]) -> dict[str, Counter | None]:
        if self._g(i) is None:
            return {}
        k = self._step("counters", i)
        t = self._t_us(k)
        script = self._gpu_script("counters", i)
        out: dict[str, Counter | None] = {}
        nvlink_off = self._off("nvlink_counters", i)
        for link in links:
            lk = self._link("nvlink_counters", i, link) if not nvlink_off else None
            ls = (script.get("nvlink") or {}).get(str(link)) or {}
            for d in ("tx", "rx"):
                v = None
                if lk is not None and lk.get("state") == "up":
                    v = self._at(ls.get(f"{d}_kib"), k, 0)
                out[f"nvlink{link}.{d}"] = None if v is None else (int(v) * 1024, t)
        pcie_off = self._off("pcie_counters", i)
        ps = script.get("pcie") or {}
        for d in ("tx", "rx"):
            v = None if pcie_off else self._at(ps.get(f"{d}_bytes"), k, 0)
            out[f"pcie.{d}"] = None if v is None else (int(v), t)
        return out

    def pcie_throughput(self, i: int) -> tuple[float, float] | None:
        return self._sample_pair("pcie_throughput", i, "pcie_tx_Bps", "pcie_rx_Bps")

    def nvlink_rates(self, i: int, links: list[int]) -> dict[str, float | None] | None:
        script = self._gpu_script("gpm", i)
        if self._g(i) is None or not script or self._off("gpm", i):
            return None
        k = self._step("gpm", i)
        if k == 0:
            return {}  # GPM needs two samples, like the real one
        out: dict[str, float | None] = {}
        for link in links:
            ls = script.get(str(link)) or {}
            for d in ("tx", "rx"):
                v = self._at(ls.get(f"{d}_mib_s"), k - 1, None)
                out[f"nvlink{link}.{d}"] = None if v is None else float(v) * 1048576.0
        return out

    def close(self) -> None:
        pass
