"""Flow-view geometry (pure) and the dashboard's topology option."""

from __future__ import annotations

import pytest

from commviz.commands._dashboard import dashboard_topology as _dashboard_topology
from commviz.topo.fake import FixtureError
from commviz.tui.widgets.flow import rate_level, spacing_for
from commviz.tui.widgets.layout import LEFT, RIGHT, NodeSpec, line_cells, make_layout


def cpu(n: int, host: str = "h") -> list[NodeSpec]:
    return [NodeSpec(r, host) for r in range(n)]


def test_ring_places_every_rank_and_neighbours_have_a_path():
    lay = make_layout(cpu(8), 80, 12)
    assert lay.kind == "ring" and sorted(lay.nodes) == list(range(8))
    for r in range(8):
        path = lay.path(r, (r + 1) % 8)
        assert path, f"{r}->{(r + 1) % 8} has cells to move packets on"
        assert all((x, y) not in lay.occupied for x, y, _ in path)
    # Opposite directions run the same cells, reversed.
    fwd, back = lay.path(0, 4), lay.path(4, 0)
    assert [(x, y) for x, y, _ in fwd] == [(x, y) for x, y, _ in reversed(back)]


def test_two_ranks_sit_left_and_right_so_direction_reads():
    lay = make_layout(cpu(2), 60, 8)
    (x0, y0, _), (x1, y1, _) = lay.nodes[0], lay.nodes[1]
    assert y0 == y1 and x0 < x1
    assert {d for _, _, d in lay.path(0, 1)} == {RIGHT} and {d for _, _, d in lay.path(1, 0)} == {LEFT}


def test_gpus_go_under_their_host_and_paths_use_the_fabric():
    nodes = [NodeSpec(r, f"node{r // 8}", r % 8) for r in range(16)]
    lay = make_layout(nodes, 80, 16, {"node0": "NVSwitch", "node1": "NVSwitch"})
    assert lay.kind == "hosts"
    text = "\n".join(lay.canvas.row_text(y) for y in range(lay.h))
    assert "node0 · NVSwitch" in text and "node1 · NVSwitch" in text and "═" in text
    inside, across = lay.path(0, 1), lay.path(7, 8)
    assert inside and across and len(across) > len(inside)
    # Host boxes that do not fit side by side wrap onto rows joined by a trunk.
    many = [NodeSpec(r, f"node{r // 8}", r % 8) for r in range(32)]
    lay = make_layout(many, 80, 30)
    assert lay.kind == "hosts" and lay.path(31, 0)


def test_too_many_ranks_fall_back_to_a_grid_with_bins():
    lay = make_layout(cpu(1024), 60, 10)
    assert lay.kind == "grid" and "ranks per cell" in lay.note
    assert {r for *_, rs in lay.cells for r in rs} == set(range(1024))
    assert lay.path(0, 1) is None  # no edges in a grid
    lay = make_layout([NodeSpec(r, f"n{r // 8}", r % 8) for r in range(64)], 40, 10)
    assert lay.kind == "grid" and lay.canvas.row_text(0).startswith("n0")  # one row per host


def test_node_at_maps_clicks_to_ranks():
    lay = make_layout(cpu(4), 60, 10)
    x, y, w = lay.nodes[2]
    assert lay.node_at(x + w - 1, y) == 2 and lay.node_at(0, 0) is None


def test_line_cells_are_connected():
    pts = line_cells(0, 0, 9, 3)
    assert pts[0] == (0, 0) and pts[-1] == (9, 3)
    assert all(abs(a[0] - b[0]) <= 1 and abs(a[1] - b[1]) <= 1 for a, b in zip(pts, pts[1:]))


def test_packet_density_and_colour_follow_the_rate():
    assert spacing_for(100.0, 100.0) < spacing_for(10.0, 100.0) < spacing_for(0.1, 100.0)
    assert [rate_level(x) for x in (1e3, 5e7, 5e9, 5e11)] == [1, 2, 3, 4]


def test_dashboard_topology_option():
    topo = _dashboard_topology("dgx-h100")
    assert topo.source == "preset:dgx-h100" and len(topo.gpus) == 8
    assert _dashboard_topology(None) is None
    with pytest.raises(FixtureError):
        _dashboard_topology("no-such-machine")
