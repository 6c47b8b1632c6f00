"""Simulated placement of CPU ranks on a preset's GPUs, and what joins two places."""

from __future__ import annotations

from commviz.topo.discover import discover
from commviz.model.placement import Place, link_kind, simulated_place
from commviz.topo.presets import load_preset


def test_rank_i_sits_on_gpu_i_mod_g_of_host_i_div_g():
    dgx = discover(load_preset("dgx-h100"))
    assert [simulated_place(r, 8, dgx) for r in (0, 7)] == [Place("dgx-h100", 0), Place("dgx-h100", 7)]
    assert simulated_place(9, 16, dgx) == Place("dgx-h100-1", 1)
    pcie = discover(load_preset("pcie-4gpu-2socket"))
    assert [simulated_place(r, 8, pcie) for r in (3, 4)] == [Place("pcie-4gpu-2socket-0", 3),
                                                             Place("pcie-4gpu-2socket-1", 0)]


def test_the_ring_edges_of_both_machines():
    dgx = discover(load_preset("dgx-h100"))
    pcie = discover(load_preset("pcie-4gpu-2socket"))

    def edge(topo, a, b, world):
        return link_kind(simulated_place(a, world, topo), simulated_place(b, world, topo), topo)

    assert edge(dgx, 3, 4, 8) == ("NVLink×18", 450.0)
    assert edge(pcie, 0, 1, 4) == ("NVLink×12", 300.0)
    via, cap = edge(pcie, 1, 2, 4)
    assert via == "PCIe SYS" and round(cap, 1) == 31.5  # gen4 x16 across the sockets
    assert edge(pcie, 3, 4, 8) == ("network", None)
