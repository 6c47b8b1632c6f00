"""Each host's ranks are drawn and linked on their own host's GPU topology (issue 17,
open point 1): the document its local rank 0 sent (events.HostTopology), the
watcher's own NVML view only for the watcher's host.

Host a (the watcher's, NVML says DGX H100: every GPU pair on NVSwitch, 18 links)
sends nothing; host b (two sockets, GPUs paired by NVLink, the pairs across the
sockets on PCIe) sends its document; host c sends nothing and is not the watcher's."""

from __future__ import annotations

import pytest

from commviz.events import GroupDef, Hello, HostTopology, OpEnd, OpStart
from commviz.model.placement import Place
from commviz.topo.discover import discover
from commviz.topo.hosts import HostTopologies
from commviz.topo.model import Topology
from commviz.topo.presets import load_preset
from commviz.tui.app import WatchApp
from commviz.view.snapshot import take_snapshot
from commviz.tui.widgets.flow import FlowView
from commviz.tui.widgets.tables import LinksTable

from .helpers import MS, WALL0, FakeClock
from .scenes import FakeFeed

WORLD = 6


def preset_on(name: str, host: str) -> Topology:
    """A preset as NVML on `host` would report it (as a rank's HostTopology carries it)."""
    doc = discover(load_preset(name)).to_document()
    doc["host"], doc["source"] = host, "nvml"
    return Topology.from_document(doc)


A = preset_on("dgx-h100", "a")  # the watcher's own view
B = preset_on("pcie-4gpu-2socket", "b")


def gpu_hello(rank: int, host: str, local: int, uuid: str | None) -> Hello:
    return Hello(rank=rank, local_rank=local, world_size=WORLD, host=host, pid=3000 + rank, backend="nccl",
                 device=f"cuda:{local}", torch_version="2.13.0", commviz_version="0.1.0", job="two-hosts",
                 mono_ns=WALL0, wall_ns=WALL0, cuda_uuid=uuid)


def two_host_job() -> FakeFeed:
    """Ranks 0,1 on a (GPUs 0,1), ranks 2,3 on b (its GPUs 1 and 2, the other socket's
    pair: visible as cuda:0 and cuda:1), ranks 4,5 on c; a send in each pair over the
    last second."""
    feed = FakeFeed(now=WALL0 + 2000 * MS)
    m = feed.model
    placing = [("a", 0, A.gpus[0].uuid), ("a", 1, A.gpus[1].uuid), ("b", 0, B.gpus[1].uuid),
               ("b", 1, B.gpus[2].uuid), ("c", 0, "GPU-c0"), ("c", 1, "GPU-c1")]
    for r, (host, local, uuid) in enumerate(placing):
        m.ingest(r, gpu_hello(r, host, local, uuid))
        m.ingest(r, GroupDef("0", list(range(WORLD)), "nccl"))
    m.ingest(2, HostTopology(WALL0, "b", B.to_document()))  # b's local rank 0
    for src in (0, 2, 4):
        dst = src + 1
        for k in range(10):
            t = feed.now - 900 * MS + k * 80 * MS
            m.ingest(src, OpStart(id=k, t=t, op="send", group="0", seq=k, bytes=64 << 20, peer=dst))
            m.ingest(dst, OpStart(id=k, t=t, op="recv", group="0", seq=k, bytes=64 << 20, peer=src))
            m.ingest(src, OpEnd(id=k, t=t + 20 * MS))
            m.ingest(dst, OpEnd(id=k, t=t + 20 * MS))
    return feed


def test_each_rank_sits_on_its_own_hosts_gpus():
    feed = two_host_job()
    snap = take_snapshot(feed.model, feed.now, topology=A, hosts=HostTopologies(local=A))
    assert snap.places[0] == Place("a", 0) and snap.places[1] == Place("a", 1)
    assert snap.places[2] == Place("b", 1) and snap.places[3] == Place("b", 2)  # by UUID in b's document
    assert snap.places[4] == Place("c", 0) and snap.places[5] == Place("c", 1)  # nothing known: cuda:N
    assert snap.flow.fabric == {"a": "NVSwitch", "b": "NVLink+PCIe"}  # c: no topology, no fabric named


async def test_the_links_panel_shows_each_hosts_own_links_and_capacities():
    feed = two_host_job()
    app = WatchApp(feed, title="t", animate=False, clock=FakeClock(), topology=A, hosts=HostTopologies(local=A))
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        links = app.query_one("#links", LinksTable)
        cell = lambda key, col: getattr(links.link_cell(key, col), "plain", links.link_cell(key, col))  # noqa: E731
        assert (cell("e:0:1", "via"), cell("e:0:1", "cap")) == ("NVLink×18", "450 GB/s")
        # b's GPUs 1 and 2 are on different sockets: PCIe gen4 x16, not the watcher's NVSwitch
        assert (cell("e:2:3", "via"), cell("e:2:3", "cap")) == ("PCIe SYS", "31.5 GB/s")
        assert (cell("e:4:5", "via"), cell("e:4:5", "cap")) == ("GPU-GPU", "–")  # c sent nothing
        text = "\n".join(app.query_one("#flow", FlowView).text_lines())
        assert "a · NVSwitch" in text and "b · NVLink+PCIe" in text


def test_the_model_keeps_one_document_per_host_and_a_resend_changes_nothing():
    feed = two_host_job()
    m = feed.model
    assert set(m.host_topologies) == {"b"} and m.host_topologies["b"]["gpus"][1]["uuid"] == B.gpus[1].uuid
    v = m.topology_version
    m.ingest(2, HostTopology(WALL0 + 1, "b", B.to_document()))  # the resync to a reconnecting watcher
    assert m.topology_version == v
    hosts = HostTopologies(local=A)
    hosts.sync(m.host_topologies, m.topology_version)
    assert hosts.for_host("b").gpus[2].uuid == B.gpus[2].uuid and hosts.for_host("a") is A
    assert hosts.for_host("c") is None


def test_a_document_that_is_not_a_hosts_is_not_kept():
    m = two_host_job().model
    v = m.topology_version
    m.ingest(4, HostTopology(WALL0, "c", {"gpus": [{"index": i} for i in range(1000)]}))
    m.ingest(4, HostTopology(WALL0, "c", {"gpus": "all of them"}))
    assert "c" not in m.host_topologies and m.topology_version == v


def test_a_document_with_gpus_out_of_order_is_counted_and_not_used():
    doc = B.to_document()
    doc["gpus"] = doc["gpus"][::-1]
    hosts = HostTopologies()
    hosts.add("b", doc)
    assert hosts.bad == 1 and hosts.for_host("b") is None


def test_summary_is_the_same_with_and_without_the_documents():
    with_docs = two_host_job().model
    without = two_host_job().model
    without.host_topologies.clear()
    a, b = with_docs.summary(), without.summary()
    assert a == b


@pytest.mark.parametrize("preset", ["dgx-h100", "pcie-4gpu-2socket"])
def test_a_preset_asked_for_still_stands_for_hosts_that_sent_nothing(preset):
    chosen = discover(load_preset(preset))
    feed = two_host_job()
    snap = take_snapshot(feed.model, feed.now, topology=chosen, hosts=HostTopologies(local=chosen))
    assert snap.topologies["c"] is chosen and snap.topologies["b"].gpus[1].uuid == B.gpus[1].uuid
