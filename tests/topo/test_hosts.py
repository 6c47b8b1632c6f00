"""Each rank's GPU is looked up in its own host's topology (issue 17 item 8)."""

from commviz.topo.hosts import HostTopologies
from commviz.topo.model import Gpu, Topology
from tests.helpers import hello


def host(name: str, uuids: list[str], source: str = "nvml") -> Topology:
    return Topology(host=name, source=source,
                    gpus=tuple(Gpu(index=i, name="H100", uuid=u, bus_id=f"0000:{0x18 + i:02x}:00.0")
                               for i, u in enumerate(uuids)))


def rank_on(name: str, uuid: str):
    h = hello(0, host=name)
    h.device, h.cuda_uuid = "cuda:0", uuid
    return h


def test_a_rank_is_placed_on_its_own_hosts_gpus():
    watcher = host("a", ["GPU-a0", "GPU-a1"])
    t = HostTopologies(local=watcher)
    t.add("b", host("b", ["GPU-b0", "GPU-b1", "GPU-b2"]).to_document())
    assert t.gpu_of(rank_on("b", "GPU-b2")).index == 2
    assert t.gpu_of(rank_on("a", "GPU-a1")).index == 1  # the watcher's own host: its NVML view


def test_the_watchers_nvml_view_is_not_used_for_other_hosts():
    t = HostTopologies(local=host("a", ["GPU-x"]))
    assert t.for_host("c") is None
    assert t.gpu_of(rank_on("c", "GPU-x")) is None  # same UUID text, another machine


def test_a_preset_stands_for_every_host_that_sent_nothing():
    preset = host("", ["GPU-p0"], source="preset:dgx-h100")
    t = HostTopologies(local=preset)
    assert t.for_host("anywhere") is preset


def test_an_unreadable_document_is_counted_not_raised():
    t = HostTopologies()
    t.add("b", {"gpus": [{"no index": 1}]})
    assert t.bad == 1 and t.for_host("b") is None
