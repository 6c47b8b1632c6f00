"""The probe's host sampler: flat numbers, rates from counters, cheap, never raising,
GPU figures only where NVML is, psutil figures everywhere."""

import copy
import subprocess
import sys
from types import SimpleNamespace

from commviz.probe.samplers import HostSampler, local_rank_from_env, should_sample
from commviz.topo.fake import FakeNvml
from commviz.topo.null import NullNvml
from commviz.topo.presets import preset_fixture

MS = 1_000_000  # ns


class FakePsutil:
    def __init__(self):
        self.sent, self.recv = 0, 0

    def cpu_percent(self, interval=None):
        assert interval is None  # never block the probe thread
        return 12.5

    def virtual_memory(self):
        return SimpleNamespace(total=64 << 30, available=48 << 30)

    def net_io_counters(self):
        self.sent += 1_000_000
        self.recv += 3_000_000
        return SimpleNamespace(bytes_sent=self.sent, bytes_recv=self.recv)


def h100(**extra):
    fx = copy.deepcopy(preset_fixture("dgx-h100"))
    fx.update(extra)
    return fx


def test_local_rank_zero_samples():
    assert should_sample(0, 0) and should_sample(8, 0)  # each host's first rank
    assert not should_sample(1, 1) and not should_sample(9, 1)
    assert should_sample(0, None) and not should_sample(3, None)  # no torchrun: rank 0 only
    assert HostSampler.should_sample(16, 0)
    assert local_rank_from_env({"LOCAL_RANK": "2"}) == 2
    assert local_rank_from_env({}) is None and local_rank_from_env({"LOCAL_RANK": "x"}) is None


def test_importing_the_sampler_loads_neither_nvml_nor_psutil():
    code = ("import sys, commviz.probe.samplers as s; h = s.HostSampler(); "
            "print(sorted(m for m in ('pynvml', 'psutil', 'torch', 'commviz.topo.discover') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_host_figures_and_network_rates():
    s = HostSampler(backend=NullNvml(), psutil_module=FakePsutil())
    first = s.sample(1_000 * MS)
    assert first == {"cpu.percent": 12.5, "mem.used": float(16 << 30), "mem.total": float(64 << 30)}
    second = s.sample(1_500 * MS)
    assert second["net.tx_Bps"] == 2_000_000.0 and second["net.rx_Bps"] == 6_000_000.0
    assert not any(k.startswith("gpu") for k in second)
    assert not s.nvml_available and s.topology is None


def test_without_nvml_or_psutil_it_is_a_no_op():
    s = HostSampler(backend=NullNvml(), psutil_module=False)
    assert s.sample(0) == {} and s.sample(10 * MS) == {}


def test_gpu_figures_and_per_link_rates_from_counters():
    fx = h100(counters={"t_us": [0, 100_000, 200_000],
                        "gpus": {"0": {"nvlink": {"3": {"tx_kib": [0, 1_000, 3_000], "rx_kib": [0, 500, 500]},
                                                  "4": {"tx_kib": [0, 1_000, 1_000]}},
                                       "pcie": {"tx_bytes": [0, 10**6, 2 * 10**6]}}}},
             samples={"gpus": {"0": {"util": [90], "mem_util": [30], "mem_used": [40 << 30]}}})
    s = HostSampler(backend=FakeNvml(fx), psutil_module=False)
    a = s.sample(0)
    assert a["gpu0.util"] == 90.0 and a["gpu0.mem_util"] == 30.0
    assert a["gpu0.mem_used"] == float(40 << 30) and a["gpu0.mem_total"] == 85520809984.0
    assert "gpu0.nvlink3.tx_Bps" not in a  # one reading is not a rate
    b = s.sample(250 * MS)
    assert b["gpu0.nvlink3.tx_Bps"] == 1_000 * 1024 / 0.1  # NVML's timestamps, not our clock
    assert b["gpu0.nvlink3.rx_Bps"] == 500 * 1024 / 0.1
    assert b["gpu0.nvlink.tx_Bps"] == 2 * 1_000 * 1024 / 0.1
    assert b["gpu0.nvlink17.tx_Bps"] == 0.0  # up and idle
    assert b["gpu0.pcie.tx_Bps"] == 10**7
    assert b["gpu7.nvlink0.rx_Bps"] == 0.0 and b["gpu7.util"] == 0.0
    c = s.sample(500 * MS)
    assert c["gpu0.nvlink3.tx_Bps"] == 2_000 * 1024 / 0.1 and c["gpu0.nvlink3.rx_Bps"] == 0.0
    assert s.topology.gpus[0].uuid == fx["gpus"][0]["uuid"]  # gpu0 -> a UUID ranks can name


def test_a_counter_reset_leaves_that_interval_out():
    fx = h100(counters={"gpus": {"1": {"nvlink": {"0": {"tx_kib": [5_000, 6_000, 10, 1_010]}}}}})
    s = HostSampler(backend=FakeNvml(fx), psutil_module=False)
    got = [s.sample(k * 100 * MS).get("gpu1.nvlink0.tx_Bps") for k in range(4)]
    assert got == [None, 1_000 * 1024 / 0.1, None, 1_000 * 1024 / 0.1]


def test_unsupported_throughput_fields_fall_back_to_gpm():
    fx = h100(unsupported=["nvlink_counters"],
              gpm={"gpus": {"2": {"5": {"tx_mib_s": [100.0, 200.0], "rx_mib_s": [50.0]}}}})
    s = HostSampler(backend=FakeNvml(fx), psutil_module=False)
    a = s.sample(0)
    assert not any(".nvlink" in k for k in a)
    b = s.sample(250 * MS)
    assert b["gpu2.nvlink5.tx_Bps"] == 100.0 * 1048576 and b["gpu2.nvlink5.rx_Bps"] == 50.0 * 1048576
    assert "gpu2.nvlink6.tx_Bps" not in b  # GPM had nothing for it: not available, not 0
    assert not any(k.startswith("gpu0.nvlink") for k in b)  # no GPM there either
    assert b["gpu2.pcie.tx_Bps"] == 0.0  # PCIe still from its byte counters


def test_no_nvlink_counters_and_no_gpm_means_no_nvlink_keys():
    s = HostSampler(backend=FakeNvml(h100(unsupported=["nvlink_counters"])), psutil_module=False)
    for k in range(3):
        out = s.sample(k * 100 * MS)
        assert not any(".nvlink" in key for key in out)
        assert "gpu0.util" in out


def test_pcie_falls_back_to_the_slow_api_one_gpu_per_sample():
    fx = h100(unsupported=["pcie_counters"],
              samples={"gpus": {str(i): {"pcie_tx_Bps": [1e9 + i], "pcie_rx_Bps": [2e9]} for i in range(8)}})
    backend = FakeNvml(fx)
    calls = []
    real = backend.pcie_throughput
    backend.pcie_throughput = lambda i: calls.append(i) or real(i)
    s = HostSampler(backend=backend, psutil_module=False)
    seen = []
    for k in range(9):
        out = s.sample(k * 100 * MS)
        seen.append(sorted(key for key in out if key.endswith("pcie.tx_Bps")))
    assert all(len(x) == 1 for x in seen)  # one blocking call per sample
    assert calls == [0, 1, 2, 3, 4, 5, 6, 7, 0]
    assert seen[3] == ["gpu3.pcie.tx_Bps"]


def test_no_pcie_anywhere_stops_asking():
    backend = FakeNvml(h100(unsupported=["pcie_counters", "pcie_throughput"]))
    calls = []
    real = backend.pcie_throughput
    backend.pcie_throughput = lambda i: calls.append(i) or real(i)
    s = HostSampler(backend=backend, psutil_module=False)
    for k in range(20):
        assert not any("pcie" in key for key in s.sample(k * 100 * MS))
    assert sorted(calls) == list(range(8))  # each GPU asked once


def test_pcie_2gpu_box_has_no_nvlink_keys():
    s = HostSampler(backend=FakeNvml(preset_fixture("pcie-2gpu")), psutil_module=False)
    s.sample(0)
    out = s.sample(100 * MS)
    assert {k for k in out if k.startswith("gpu0")} == {"gpu0.util", "gpu0.mem_util", "gpu0.mem_used",
                                                       "gpu0.mem_total", "gpu0.pcie.tx_Bps", "gpu0.pcie.rx_Bps"}


def test_a_backend_that_raises_never_reaches_the_caller_and_is_said_once():
    said = []
    backend = FakeNvml(h100())

    def boom(i, links):
        raise RuntimeError("driver fell over")
    backend.counters = boom
    s = HostSampler(backend=backend, psutil_module=FakePsutil(), warn=lambda key, msg: said.append((key, msg)))
    for k in range(3):
        out = s.sample(k * 100 * MS)
        assert out["cpu.percent"] == 12.5 and out["gpu0.util"] == 0.0  # the rest still comes
    assert len([m for _k, m in said if "driver fell over" in m]) == 1  # said once, not per GPU or sample


def test_psutil_that_fails_is_said_once():
    said = []

    class Broken(FakePsutil):
        def virtual_memory(self):
            raise OSError("no /proc")
    s = HostSampler(backend=NullNvml(), psutil_module=Broken(), warn=lambda k, m: said.append(m))
    for k in range(3):
        assert s.sample(k * MS) == {"cpu.percent": 12.5}
    assert len(said) == 1 and "no /proc" in said[0]


def test_lazy_start_opens_nvml_and_psutil_on_the_first_sample(monkeypatch):
    from tests.topo.fake_pynvml import FakePynvml

    nv = FakePynvml(preset_fixture("pcie-2gpu"))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    s = HostSampler()
    assert nv.calls["nvmlInit"] == 0
    out = s.sample(0)
    assert nv.calls["nvmlInit"] == 1 and s.nvml_available
    assert "cpu.percent" in out and out["gpu1.util"] == 42.0
    s.close()
    assert nv.shutdowns == 1


def test_lazy_start_without_nvml_sends_only_host_figures(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    said = []
    s = HostSampler(warn=lambda k, m: said.append(m))
    out = s.sample(0)
    assert "cpu.percent" in out and not any(k.startswith("gpu") for k in out)
    assert said == []  # NVML absent is normal, not worth a line


def test_due_spaces_samples_by_the_interval():
    s = HostSampler(backend=NullNvml(), psutil_module=False, interval_s=0.25)
    assert s.due(0)
    s.sample(0)
    assert not s.due(200 * MS) and s.due(250 * MS)


def test_sampling_an_8_gpu_box_is_cheap():
    import time

    s = HostSampler(backend=FakeNvml(h100()), psutil_module=False)
    s.sample(0)
    t0 = time.perf_counter()
    for k in range(1, 21):
        s.sample(k * 250 * MS)
    per_sample = (time.perf_counter() - t0) / 20
    assert per_sample < 0.02, f"{per_sample * 1e3:.1f} ms per sample"


def test_the_sampler_thread_sends_this_hosts_topology_once_then_samples():
    """Each host's local rank 0 tells the watcher its own GPUs (issue 17 item 8): the
    watcher lays ranks out per host, not on its own machine's topology."""
    import collections
    import threading

    from commviz.events import HostTopology, Sample
    from commviz.probe.health import Health
    from commviz.probe.samplers import SamplerThread
    from commviz.topo.model import Topology

    q = collections.deque()
    sampled = threading.Event()

    class Counted(HostSampler):
        def sample(self, now_ns):
            out = super().sample(now_ns)
            if self._last_ns is not None and sum(isinstance(e, Sample) for e in q) >= 1:
                sampled.set()
            return out

    s = SamplerThread(Counted(backend=FakeNvml(h100()), psutil_module=FakePsutil(), interval_s=0.001),
                      q.append, Health(), host="node7")
    s.start()
    assert sampled.wait(5)
    s.stop()
    topos = [e for e in q if isinstance(e, HostTopology)]
    assert len(topos) == 1 and topos[0].host == "node7"
    assert len(Topology.from_document(topos[0].document).gpus) == 8
    assert isinstance(q[0], HostTopology)  # before the first sample that needs it


def test_a_reconnecting_watcher_gets_the_hosts_topology_again():
    import collections

    from commviz.events import HostTopology
    from commviz.probe.health import Health
    from commviz.probe.sender import Sender
    from tests.helpers import hello
    from tests.probe.test_sender import FakeClient

    q = collections.deque([HostTopology(1, "h", {"host": "h", "source": "nvml", "gpus": []})])
    s = Sender(0, hello(0), None, None, Health(), q)
    s.client = FakeClient()
    s.client.up = True
    s.flush()
    s.connected = False  # the watcher went away and came back
    s.flush()
    resync = s.client.frames[-1].events
    assert any(isinstance(e, HostTopology) and e.host == "h" for e in resync)


def test_the_sampler_thread_queues_through_the_probes_bounded_push():
    """A stuck flushing thread must not let samples grow the queue past its cap: the
    sampler thread queues through the probe's push, which drops and counts."""
    import collections
    import threading

    from commviz.events import Sample
    from commviz.probe.health import Health
    from commviz.probe.samplers import SamplerThread

    q, health, cap, pushed = collections.deque(), Health(), 3, threading.Event()

    def push(rec):
        if len(q) < cap:
            q.append(rec)
        else:
            health.dropped += 1
            pushed.set()

    class Busy:
        interval_s = 0.001
        topology = None

        def due(self, t):
            return True

        def sample(self, t):
            return {"cpu_pct": 1.0}

        def close(self):
            pass

    s = SamplerThread(Busy(), push, health)
    s.start()
    assert pushed.wait(5)
    s.stop()
    assert len(q) == cap and all(isinstance(e, Sample) for e in q) and health.dropped >= 1
