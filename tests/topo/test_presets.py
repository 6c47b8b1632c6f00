"""Each shipped preset, through the fake backend and discovery, has the shape its
machine has: link counts, far ends, the nvidia-smi matrix, per-GPU bandwidth."""

import collections

import pytest

from commviz.topo.discover import discover
from commviz.topo.presets import load_preset, preset_fixture, preset_names

ALL = ["dgx-a100", "dgx-h100", "pcie-2gpu", "pcie-4gpu-2socket"]


def topo(name):
    return discover(load_preset(name))


def test_the_four_presets_ship():
    assert preset_names() == ALL


@pytest.mark.parametrize("name", ALL)
def test_every_preset_is_a_valid_fixture_with_a_source_and_a_description(name):
    fx = preset_fixture(name)
    assert fx["description"] and fx["sources"]
    t = topo(name)
    assert t.source == f"preset:{name}"
    n = len(t.gpus)
    assert [g.index for g in t.gpus] == list(range(n))
    assert len({g.uuid for g in t.gpus}) == n and len({g.bus_id for g in t.gpus}) == n
    m = t.matrix()
    assert all(m[i][i] == "X" for i in range(n))
    assert all(m[i][j] == m[j][i] for i in range(n) for j in range(n)), "the matrix is symmetric"


def test_dgx_h100():
    t = topo("dgx-h100")
    assert len(t.gpus) == 8
    for g in t.gpus:
        assert g.name == "NVIDIA H100 80GB HBM3" and g.arch == "hopper"
        assert g.nvlink_count == 18 and len(g.up_links) == 18
        assert {lk.remote for lk in g.links} == {"nvswitch"} and {lk.version for lk in g.links} == {4}
        assert {lk.gbps_per_direction for lk in g.links} == {25.0}
        assert g.nvlink_gbps_per_direction == 450.0
        per_switch = collections.Counter(lk.remote_bus_id for lk in g.links)
        assert sorted(per_switch.values(), reverse=True) == [5, 5, 4, 4]
        assert all(lk.remote_gpu is None for lk in g.links)
    assert all(c == "NV18" for i, row in enumerate(t.matrix()) for j, c in enumerate(row) if i != j)
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.levels[0][1] == "NODE" and t.levels[0][4] == "SYS"  # the PCIe view behind NV18


def test_dgx_a100():
    t = topo("dgx-a100")
    assert len(t.gpus) == 8
    for g in t.gpus:
        assert g.nvlink_count == 12 and len(g.up_links) == 12
        assert {lk.version for lk in g.links} == {3}
        per_switch = collections.Counter(lk.remote_bus_id for lk in g.links)
        assert len(per_switch) == 6 and set(per_switch.values()) == {2}
        assert g.nvlink_gbps_per_direction == 300.0
    assert all(c == "NV12" for i, row in enumerate(t.matrix()) for j, c in enumerate(row) if i != j)


def test_pcie_2gpu_has_no_nvlink_and_reads_phb():
    t = topo("pcie-2gpu")
    assert t.matrix() == [["X", "PHB"], ["PHB", "X"]]
    assert all(g.nvlink_count == 0 and g.links == () for g in t.gpus)
    assert t.gpus[0].nvlink_gbps_per_direction is None
    assert t.p2p_read == ()  # not described: not available, not invented


def test_pcie_4gpu_2socket_pairs_and_sockets():
    t = topo("pcie-4gpu-2socket")
    assert t.matrix() == [
        ["X", "NV12", "SYS", "SYS"],
        ["NV12", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV12"],
        ["SYS", "SYS", "NV12", "X"],
    ]
    # far ends resolved to local GPUs by bus id
    assert {lk.remote_gpu for lk in t.gpus[0].links} == {1}
    assert {lk.remote_gpu for lk in t.gpus[3].links} == {2}
    assert t.nvlinks_between(0, 1) == 12 and t.nvlinks_between(0, 2) == 0
    assert t.p2p_read[0][1] == "OK" and t.p2p_read[1][2] == "CNS"
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]
