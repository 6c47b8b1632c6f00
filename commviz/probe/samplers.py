"""Host and GPU samples for the probe's background thread.

One process per host samples (local rank 0): NVML counters are per GPU, not per rank,
and eight ranks asking the same driver the same question would only add cost. Samples
are a flat dict of numbers so they fit the `Sample` event as they are:

    cpu.percent  mem.used  mem.total  net.tx_Bps  net.rx_Bps           (psutil)
    gpu<i>.util  gpu<i>.mem_util  gpu<i>.mem_used  gpu<i>.mem_total      (NVML, % and bytes)
    gpu<i>.nvlink<l>.tx_Bps  gpu<i>.nvlink<l>.rx_Bps  gpu<i>.nvlink.tx_Bps  gpu<i>.nvlink.rx_Bps
    gpu<i>.pcie.tx_Bps  gpu<i>.pcie.rx_Bps

``<i>`` is NVML's index on this host (see `topology` to map it to UUID and bus id,
which is how ranks name their GPU). A figure that is not available is left out, never
sent as 0. Nothing heavy is imported here: NVML and psutil are opened on the first
`sample`, on the thread that calls it. With no NVML only the psutil figures are sent;
with neither, the sampler is a no-op. `sample` never raises.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from commviz.events import HostTopology, Sample
from commviz.topo.rates import RateTracker

DEFAULT_INTERVAL_S = 0.25


def should_sample(rank: int, local_rank: int | None) -> bool:
    """Local rank 0 of each host samples; without a local rank (no torchrun), rank 0."""
    return local_rank == 0 if local_rank is not None else rank == 0


def local_rank_from_env(env: dict[str, str] | None = None) -> int | None:
    """This rank's local rank as its launcher set it (torchrun, mpiexec, srun:
    commviz/launchers.py), None when none did."""
    from commviz.launchers import local_rank

    return local_rank(env)


class HostSampler:
    """Call `sample(now_ns)` every `interval_s` or so from a background thread.

    ``backend``: an `NvmlBackend`; None opens the real one (null when NVML is absent) on
    the first sample. ``psutil_module``: None imports psutil on the first sample; False
    leaves host figures out. ``warn(key, message)``: said-once reporting, e.g. the
    probe's ``Health.warn_once``.
    """

    def __init__(self, backend: Any = None, psutil_module: Any = None,
                 warn: Callable[[str, str], None] | None = None, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._backend = backend
        self._psutil = psutil_module
        self._warn = warn
        self._started = False
        self._topology = None
        self._links: dict[int, list[int]] = {}
        self._rates = RateTracker()
        self._gpm: set[int] = set()  # GPUs whose NVLink rates come from GPM
        self._pcie_slow: set[int] = set()  # GPUs whose PCIe rate needs the 20 ms API
        self._no_pcie: set[int] = set()  # GPUs with no PCIe figure from either source
        self._pcie_turn = 0
        self._last_ns: int | None = None
        self._said: set[str] = set()

    # ------------------------------------------------------------- public

    @staticmethod
    def should_sample(rank: int, local_rank: int | None) -> bool:
        return should_sample(rank, local_rank)

    def due(self, now_ns: int) -> bool:
        """True when `interval_s` has passed since the last sample (or none was taken)."""
        return self._last_ns is None or now_ns - self._last_ns >= self.interval_s * 1e9

    @property
    def nvml_available(self) -> bool:
        return bool(self._backend is not None and self._backend.available)

    @property
    def topology(self):
        """The host's `Topology` (after the first sample): maps ``gpu<i>`` to UUID/bus id."""
        return self._topology

    def sample(self, now_ns: int) -> dict[str, float]:
        """Every figure available now; {} at worst. Never raises."""
        self._last_ns = now_ns
        out: dict[str, float] = {}
        try:
            if not self._started:
                self._start()
            self._host(now_ns, out)
            if self.nvml_available and self._topology is not None:
                for g in self._topology.gpus:
                    self._guard(g.index, out)
                self._pcie_round(out)
        except Exception as exc:  # belt and braces: the probe must not die of a sample
            self._say("sampler", f"host sampling stopped working ({type(exc).__name__}: {exc})")
        return out

    def close(self) -> None:
        b, self._backend = self._backend, None
        if b is not None:
            try:
                b.close()
            except Exception:
                pass

    # ------------------------------------------------------------- setup

    def _start(self) -> None:
        self._started = True
        if self._psutil is None:
            try:
                import psutil  # noqa: PLC0415

                self._psutil = psutil
                psutil.cpu_percent(None)  # primes the counter; the first real figure is the next call
            except Exception as exc:
                self._psutil = False
                self._say("psutil", f"host CPU/memory/network figures are off (psutil: {exc})")
        if self._backend is None:
            try:
                from commviz.topo.backend import open_backend  # noqa: PLC0415

                self._backend = open_backend()
            except Exception as exc:
                self._say("nvml", f"GPU figures are off ({type(exc).__name__}: {exc})")
                return
        if not self._backend.available:
            return  # NVML absent is normal: no GPU figures, nothing said
        # What NVML cannot tell (no NVLink on this GPU, …) is normal and stays in
        # topology.notes; only failures of the sampler itself are said.
        try:
            from commviz.topo.discover import discover  # noqa: PLC0415

            self._topology = discover(self._backend)
        except Exception as exc:
            self._say("topology", f"GPU topology discovery failed ({type(exc).__name__}: {exc}); GPU figures are off")
            self._topology = None
            return
        self._links = {g.index: [lk.link for lk in g.up_links] for g in self._topology.gpus}

    # ------------------------------------------------------------- figures

    def _host(self, now_ns: int, out: dict[str, float]) -> None:
        ps = self._psutil
        if not ps:
            return
        t_us = now_ns // 1000
        try:
            out["cpu.percent"] = float(ps.cpu_percent(None))
            vm = ps.virtual_memory()
            out["mem.used"] = float(vm.total - vm.available)
            out["mem.total"] = float(vm.total)
            net = ps.net_io_counters()
            for d, v in (("tx", net.bytes_sent), ("rx", net.bytes_recv)):
                rate = self._rates.update(f"net.{d}", v, t_us)
                if rate is not None:
                    out[f"net.{d}_Bps"] = rate
        except Exception as exc:
            self._say("psutil-sample", f"a host figure failed ({type(exc).__name__}: {exc})")

    def _guard(self, i: int, out: dict[str, float]) -> None:
        """One GPU's figures; a failure costs that GPU's figures for this sample only."""
        try:
            self._gpu(i, out)
        except Exception as exc:
            self._say("gpu", f"GPU sampling failed (gpu{i}: {type(exc).__name__}: {exc}); "
                      "the job goes on, some GPU figures may be missing")

    def _gpu(self, i: int, out: dict[str, float]) -> None:
        b = self._backend
        p = f"gpu{i}"
        u = b.utilization(i)
        if u is not None:
            out[f"{p}.util"], out[f"{p}.mem_util"] = float(u[0]), float(u[1])
        m = b.memory(i)
        if m is not None:
            out[f"{p}.mem_used"], out[f"{p}.mem_total"] = float(m[0]), float(m[1])
        links = self._links.get(i, [])
        if i in self._gpm:
            self._gpm_rates(i, links, out)
            counters = b.counters(i, [])
        else:
            counters = b.counters(i, links)
            rates: dict[str, float | None] = {}
            for lk in links:
                for d in ("tx", "rx"):
                    c = counters.get(f"nvlink{lk}.{d}")
                    rates[f"nvlink{lk}.{d}"] = self._counter_rate(f"{p}.nvlink{lk}.{d}", c)
            self._emit_links(p, rates, out)
            if links and all(counters.get(f"nvlink{lk}.{d}") is None for lk in links for d in ("tx", "rx")):
                # The throughput fields are not there: try GPM (Hopper and later) from now on.
                if b.nvlink_rates(i, links) is not None:
                    self._gpm.add(i)
        for d in ("tx", "rx"):
            c = counters.get(f"pcie.{d}")
            rate = self._counter_rate(f"{p}.pcie.{d}", c)
            if rate is not None:
                out[f"{p}.pcie.{d}_Bps"] = rate
        if counters.get("pcie.tx") is None and counters.get("pcie.rx") is None:
            if (counters or i in self._gpm) and i not in self._no_pcie:
                self._pcie_slow.add(i)
        else:
            self._pcie_slow.discard(i)

    def _counter_rate(self, key: str, c) -> float | None:
        """Bytes/s from a backend Counter (value, t_us[, modulus]); None when absent."""
        if c is None:
            return self._rates.update(key, None, None)
        return self._rates.update(key, c[0], c[1], modulus=c[2] if len(c) > 2 else None)

    def _gpm_rates(self, i: int, links: list[int], out: dict[str, float]) -> None:
        rates = self._backend.nvlink_rates(i, links)
        if rates is None:
            self._gpm.discard(i)
            return
        self._emit_links(f"gpu{i}", rates, out)

    @staticmethod
    def _emit_links(p: str, rates: dict[str, float | None], out: dict[str, float]) -> None:
        total = {"tx": 0.0, "rx": 0.0}
        seen = {"tx": False, "rx": False}
        for key, rate in rates.items():
            if rate is None:
                continue
            out[f"{p}.{key}_Bps"] = float(rate)
            d = key.rsplit(".", 1)[1]
            total[d] += rate
            seen[d] = True
        for d in ("tx", "rx"):
            if seen[d]:
                out[f"{p}.nvlink.{d}_Bps"] = total[d]

    def _pcie_round(self, out: dict[str, float]) -> None:
        """PCIe rates for GPUs without byte counters: nvmlDeviceGetPcieThroughput blocks
        about 40 ms per GPU, so one GPU is asked per sample, round robin."""
        slow = sorted(self._pcie_slow)
        if not slow:
            return
        i = slow[self._pcie_turn % len(slow)]
        self._pcie_turn += 1
        tp = self._backend.pcie_throughput(i)
        if tp is None:
            self._pcie_slow.discard(i)
            self._no_pcie.add(i)
            return
        out[f"gpu{i}.pcie.tx_Bps"], out[f"gpu{i}.pcie.rx_Bps"] = float(tp[0]), float(tp[1])

    def _say(self, key: str, message: str) -> None:
        if key in self._said:
            return
        self._said.add(key)
        try:
            if self._warn is not None:
                self._warn("sampler:" + key, message)
            else:
                sys.stderr.write(f"commviz: {message}\n")
        except Exception:
            pass


class SamplerThread:
    """Runs a HostSampler on its own thread: NVML's PCIe fallback blocks 20-40 ms per
    call, which on the flushing or CUDA polling thread would hold back both."""

    def __init__(self, sampler: HostSampler, push, health, host: str = "") -> None:
        self.sampler = sampler
        self.push = push  # the probe's: bounded by its queue cap, drops counted
        self.health = health
        self.host = host  # as the rank's Hello names it
        self.topology_sent = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="commviz-sampler", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        s = self.sampler
        while not self._stop.is_set():
            try:
                t = time.monotonic_ns()
                if s.due(t):
                    values = s.sample(t)
                    if not self.topology_sent and s.topology is not None:
                        # the watcher lays out this host's ranks on this host's GPUs
                        self.topology_sent = True
                        self.push(HostTopology(t, self.host, s.topology.to_document()))
                    if values:
                        self.push(Sample(t, values))
            except Exception as exc:  # sample() never raises; belt and braces
                self.health.internal("sampler", exc)
            self._stop.wait(s.interval_s)

    def stop(self, timeout: float = 0.5) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.sampler.close()
