"""The pure topology model: identity lookups, link counting, documents."""

import copy

import pytest

from commviz.topo.discover import discover
from commviz.topo.fake import FakeNvml
from commviz.topo.ids import bus_id_from_parts, normalize_bus_id, normalize_uuid
from commviz.topo.model import Topology
from commviz.topo.presets import load_preset, preset_fixture, preset_names


@pytest.mark.parametrize("raw,want", [
    ("00000000:18:00.0", "0000:18:00.0"),
    ("0000:18:00.0", "0000:18:00.0"),
    ("00000000:5D:00.0", "0000:5d:00.0"),
    ("18:00.0", "0000:18:00.0"),
    ("0001:AB:1f.3", "0001:ab:1f.3"),
    ("", None), (None, None), ("not a bus", None),
])
def test_bus_ids_have_one_spelling(raw, want):
    assert normalize_bus_id(raw) == want


def test_bus_id_from_torch_style_parts():
    assert bus_id_from_parts(0, 0x5D, 0) == "0000:5d:00.0"


def test_uuid_spellings():
    assert normalize_uuid("GPU-4A100000-0000") == "4a100000-0000"
    assert normalize_uuid("4a100000-0000") == "4a100000-0000"
    assert normalize_uuid(None) is None


def test_gpu_for_by_uuid_or_bus_id_never_by_index():
    t = discover(load_preset("dgx-h100"))
    g5 = t.gpus[5]
    assert t.gpu_for(uuid=g5.uuid) is g5
    assert t.gpu_for(uuid=g5.uuid.removeprefix("GPU-").upper()) is g5  # torch's spelling
    assert t.gpu_for(bus_id="00000000:AB:00.0") is g5  # NVML's spelling
    assert t.gpu_for(uuid="GPU-nope", bus_id=g5.bus_id) is g5  # bus id as the fallback
    assert t.gpu_for(uuid="GPU-nope") is None
    assert t.gpu_for() is None


def test_ranks_map_through_a_reordered_cuda_visible_devices():
    """CUDA_VISIBLE_DEVICES=3,1,0,2: rank r sees cuda:0 = physical GPU [3,1,0,2][r]. Each
    rank reports its GPU's UUID/bus id; the mapping must land on the physical GPU."""
    t = discover(load_preset("pcie-4gpu-2socket"))
    visible = [3, 1, 0, 2]
    reported = {rank: {"uuid": t.gpus[phys].uuid.removeprefix("GPU-"), "bus_id": t.gpus[phys].bus_id.upper()}
                for rank, phys in enumerate(visible)}
    by_uuid = {rank: t.gpu_for(uuid=r["uuid"]).index for rank, r in reported.items()}
    by_bus = {rank: t.gpu_for(bus_id=r["bus_id"]).index for rank, r in reported.items()}
    assert by_uuid == by_bus == dict(enumerate(visible))
    # ranks 0 and 2 are GPUs 3 and 0: different sockets, no NVLink between them
    assert t.label(by_uuid[0], by_uuid[2]) == "SYS"
    assert t.label(by_uuid[1], by_uuid[2]) == "NV12"


def test_link_count_comes_from_the_link_count_field():
    fx = copy.deepcopy(preset_fixture("dgx-h100"))
    fx["gpus"][0]["nvlink_count"] = 4  # the field says 4; the fixture lists 18
    t = discover(FakeNvml(fx))
    assert len(t.gpus[0].links) == 4 and t.gpus[0].nvlink_count == 4
    assert t.nvlinks_between(0, 1) == 4  # min of the two GPUs' switch links
    fx["unsupported"] = ["gpu1:nvlink_count"]
    t = discover(FakeNvml(fx))
    assert t.gpus[1].nvlink_count is None and t.gpus[1].links == ()
    assert t.label(1, 2) == "NODE"  # no links known: the PCIe level shows
    assert any("nvlink_count" in n for n in t.notes)


def test_down_links_do_not_count():
    fx = copy.deepcopy(preset_fixture("pcie-4gpu-2socket"))
    fx["gpus"][0]["links"] = [{"count": 10, "state": "up", "version": 3, "remote": "gpu",
                               "remote_bus_id": fx["gpus"][1]["bus_id"]},
                              {"count": 2, "state": "down"}]
    t = discover(FakeNvml(fx))
    g = t.gpus[0]
    assert len(g.links) == 12 and len(g.up_links) == 10
    assert g.links[11].state == "down" and g.links[11].remote is None
    assert t.label(0, 1) == "NV10"
    assert g.nvlink_gbps_per_direction == 250.0


def test_remote_type_unknown_falls_back_to_the_bus_id():
    fx = copy.deepcopy(preset_fixture("pcie-4gpu-2socket"))
    fx["unsupported"] = ["nvlink_remote_type"]
    fx["gpus"][2]["links"] = [{"count": 12, "state": "up", "version": 3, "remote_bus_id": "0000:e1:00.0"}]
    t = discover(FakeNvml(fx))
    assert {(lk.remote, lk.remote_gpu) for lk in t.gpus[0].links} == {("gpu", 1)}
    assert {(lk.remote, lk.remote_gpu) for lk in t.gpus[2].links} == {("other", None)}


@pytest.mark.parametrize("name", preset_names())
def test_document_round_trips(name):
    t = discover(load_preset(name))
    doc = t.to_document()
    back = Topology.from_document(doc)
    assert back == t
    assert back.matrix() == doc["matrix"]


def test_a_bare_design_document_reads_back():
    """Only the DESIGN.md keys: levels come back from the matrix's PCIe cells."""
    t = discover(load_preset("pcie-4gpu-2socket"))
    doc = {k: v for k, v in t.to_document().items() if k in ("host", "source", "gpus", "matrix")}
    for g in doc["gpus"]:
        for k in ("arch", "numa_node", "pcie", "nvlink_count"):
            g.pop(k)
    back = Topology.from_document(doc)
    assert back.matrix() == t.matrix()
    assert back.gpu_for(bus_id=t.gpus[2].bus_id).index == 2
