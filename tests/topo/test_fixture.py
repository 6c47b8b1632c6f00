"""The fixture format: what it accepts, how it fails, how the fake plays it."""

import json

import pytest

from commviz.topo.discover import discover
from commviz.topo.fake import FakeNvml, FixtureError, check_fixture, load_fixture


def gpu(**kw):
    g = {"name": "G", "uuid": "GPU-1", "bus_id": "0000:01:00.0", "links": []}
    g.update(kw)
    return g


def test_link_groups_expand_in_order_and_explicit_numbers_are_kept():
    fx = check_fixture({"gpus": [gpu(links=[{"count": 2, "state": "up", "remote": "nvswitch"},
                                            {"link": 5, "state": "down"},
                                            {"state": "up", "remote": "other"}])]})
    assert [(lk["link"], lk["state"]) for lk in fx["gpus"][0]["links"]] == [
        (0, "up"), (1, "up"), (5, "down"), (6, "up")]


@pytest.mark.parametrize("doc,needle", [
    ({"gpus": [gpu(links=[{"remote": "switch"}])]}, "gpus[0].links[0].remote: 'switch'"),
    ({"gpus": [gpu(links=[{"state": "active"}])]}, "gpus[0].links[0].state"),
    ({"gpus": [gpu(bus_id="zz")]}, "gpus[0].bus_id: 'zz' is not a PCI bus id"),
    ({"gpus": [gpu(links=[{"link": 0}, {"link": 0}])]}, "link 0 listed twice"),
    ({"gpus": [gpu(), gpu()], "levels": [["X", "PHB"]]}, "levels: expected a 2x2 matrix"),
    ({"gpus": [gpu(), gpu()], "levels": [["X", "NV2"], ["NV2", "X"]]}, "levels[0][1]: 'NV2'"),
    ({"gpus": [], "unsupported": ["everything"]}, "unsupported: 'everything' names no item"),
    ({"gpus": [], "format": "other"}, "format is 'other'"),
    ({"gpus": [], "version": 9}, "version 9 is not supported"),
    ({"gpus": [gpu(index=3)]}, "gpus[0].index"),
    ([], "a fixture is a JSON object"),
])
def test_bad_fixtures_name_the_bad_key(doc, needle):
    with pytest.raises(FixtureError) as e:
        check_fixture(doc)
    assert needle in str(e.value)


def test_files_that_cannot_be_read_say_so(tmp_path):
    with pytest.raises(FixtureError, match="cannot read"):
        load_fixture(tmp_path / "none.json")
    p = tmp_path / "bad.json"
    p.write_text("{ nope")
    with pytest.raises(FixtureError, match=r"bad.json: not JSON \(line 1"):
        load_fixture(p)


def test_from_file_names_its_source(tmp_path):
    p = tmp_path / "box.json"
    p.write_text(json.dumps({"host": "box", "gpus": [gpu()]}))
    b = FakeNvml.from_file(p)
    assert b.source == f"fixture:{p}" and b.host == "box"
    assert discover(b).gpus[0].name == "G"


def test_a_fixture_can_describe_a_machine_without_nvml():
    b = FakeNvml({"nvml": "missing", "gpus": [gpu()]})
    assert not b.available and "not available" in b.reason
    t = discover(b)
    assert t.gpus == () and t.matrix() == []


def test_missing_values_are_not_available_not_invented():
    b = FakeNvml({"gpus": [{"links": [{"state": "up"}]}]})
    t = discover(b)
    g = t.gpus[0]
    assert (g.name, g.uuid, g.bus_id, g.arch, g.numa_node, g.pcie_gen) == (None,) * 6
    assert g.links[0].version is None and g.links[0].gbps_per_direction is None
    assert g.nvlink_gbps_per_direction is None
    assert b.memory(0) is None  # no memory_total: nothing to report


def test_unsupported_items_are_said_once():
    b = FakeNvml({"gpus": [gpu(), gpu(uuid="GPU-2", bus_id="0000:02:00.0")], "unsupported": ["utilization"]})
    assert b.utilization(0) is None and b.utilization(1) is None and b.utilization(0) is None
    assert b.notes == ["utilization: not available (unsupported in this fixture)"]


def test_scripts_step_per_call_and_hold_their_last_value():
    b = FakeNvml({"gpus": [gpu(memory_total=100, links=[{"state": "up"}, {"state": "down"}])],
                  "counters": {"t_us": [10, 20], "gpus": {"0": {"nvlink": {"0": {"tx_kib": [1, 2]}},
                                                               "pcie": {"rx_bytes": [5, None, 7]}}}},
                  "samples": {"gpus": {"0": {"util": [50, 60], "mem_used": [30]}}}})
    c = [b.counters(0, [0, 1]) for _ in range(4)]
    assert [x["nvlink0.tx"] for x in c] == [(1024, 10), (2048, 20), (2048, 30), (2048, 40)]
    assert all(x["nvlink0.rx"][0] == 0 for x in c)  # not scripted, up: idle
    assert all(x["nvlink1.tx"] is None for x in c)  # down
    assert [x["pcie.rx"] for x in c] == [(5, 10), None, (7, 30), (7, 40)]
    assert [b.utilization(0) for _ in range(3)] == [(50.0, 0.0), (60.0, 0.0), (60.0, 0.0)]
    assert b.memory(0) == (30, 100)
