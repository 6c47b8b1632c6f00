"""The real NVML backend against a stand-in pynvml: raw encodings decoded, every NVML
error swallowed into "not available" for that item, said once, never raised."""

import sys

import pytest

from commviz.topo.backend import open_backend
from commviz.topo.discover import discover
from commviz.topo.null import NullNvml
from commviz.topo.presets import load_preset, preset_fixture, preset_names
from commviz.topo.real import RealNvml
from tests.topo.fake_pynvml import FakePynvml

NOT_SUPPORTED, NO_PERMISSION, INVALID_ARGUMENT, FUNCTION_NOT_FOUND, GPU_IS_LOST = 3, 4, 2, 13, 15


def real(name="dgx-h100", **kw):
    nv = FakePynvml(preset_fixture(name), **kw)
    return RealNvml(nv), nv


@pytest.mark.parametrize("name", preset_names())
def test_real_backend_sees_what_the_fixture_describes(name):
    b, _ = real(name)
    assert b.available and b.source == "nvml"
    got, want = discover(b), discover(load_preset(name))
    assert got.gpus == want.gpus
    assert got.levels == want.levels and got.matrix() == want.matrix()
    assert got.p2p_read == want.p2p_read


def test_nvml_versions_are_decoded_from_the_enum_and_from_old_drivers():
    for legacy in (False, True):
        for name, major in (("dgx-h100", 4), ("dgx-a100", 3)):
            b, _ = real(name, legacy_versions=legacy)
            assert {lk.version for g in discover(b).gpus for lk in g.links} == {major}, (name, legacy)


def test_bus_ids_come_back_in_one_spelling_from_bytes_and_8_digit_domains():
    b, nv = real()
    assert nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(3)).busId == b"00000000:5D:00.0"
    assert b.bus_id(3) == "0000:5d:00.0"
    assert b.nvlink_remote_bus_id(0, 0) == "0000:05:00.0"


def test_p2p_uses_the_enum_value_not_pynvmls_tuple():
    b, nv = real("pcie-4gpu-2socket")
    assert b.p2p_read(0, 1) == "OK" and b.p2p_read(0, 2) == "CNS"
    assert b.notes == []


def test_nvml_missing_gives_a_reason_not_an_exception():
    nv = FakePynvml(preset_fixture("dgx-h100"), init_error=12)
    b = RealNvml(nv)
    assert not b.available
    assert "NVML is not available" in b.reason and "no NVIDIA driver" in b.reason
    assert b.device_count() == 0 and discover(b).gpus == ()
    b.close()
    assert nv.shutdowns == 0  # never started, never shut down


def test_pynvml_not_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    b = RealNvml()
    assert not b.available and "nvidia-ml-py cannot be imported" in b.reason
    nb = open_backend()
    assert isinstance(nb, NullNvml) and nb.reason == b.reason and nb.source == "none"


def test_open_backend_uses_real_nvml_when_it_starts(monkeypatch):
    nv = FakePynvml(preset_fixture("pcie-2gpu"))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    b = open_backend()
    assert isinstance(b, RealNvml) and b.device_count() == 2
    b.close()
    assert nv.shutdowns == 1


def test_remote_type_not_supported_falls_back_to_bus_ids_and_is_said_once():
    b, nv = real("pcie-4gpu-2socket", errors={"nvmlDeviceGetNvLinkRemoteDeviceType": NOT_SUPPORTED})
    t = discover(b)
    assert {(lk.remote, lk.remote_gpu) for lk in t.gpus[0].links} == {("gpu", 1)}
    assert t.matrix()[0][1] == "NV12"
    lines = [n for n in b.notes if "remote device type" in n]
    assert len(lines) == 1 and "Not Supported" in lines[0]
    assert nv.calls["nvmlDeviceGetNvLinkRemoteDeviceType"] == 48  # asked per link, said once


def test_every_kind_of_failure_is_swallowed():
    errors = {"nvmlDeviceGetName": GPU_IS_LOST, "nvmlDeviceGetArchitecture": FUNCTION_NOT_FOUND,
              "nvmlDeviceGetNumaNodeId": NOT_SUPPORTED, "nvmlDeviceGetTopologyCommonAncestor": NO_PERMISSION,
              "nvmlDeviceGetCurrPcieLinkGeneration": 999}
    b, _ = real("dgx-h100", errors=errors)
    b._sysfs_pci = "/nonexistent"
    t = discover(b)
    g = t.gpus[0]
    assert g.name is None and g.arch is None and g.numa_node is None and g.pcie_gen is None
    assert g.pcie_width == 16 and g.uuid  # the rest still there
    assert t.levels[0][1] is None
    assert t.matrix()[0][1] == "NV18"  # links still give the label
    assert len(t.notes) == len(set(t.notes)) >= 5
    # Version decoding without an architecture falls back to the enum reading.
    assert {lk.version for lk in g.links} == {4}


def test_numa_node_falls_back_to_sysfs(tmp_path):
    b, _ = real("pcie-2gpu", errors={"nvmlDeviceGetNumaNodeId": FUNCTION_NOT_FOUND})
    d = tmp_path / "0000:21:00.0"
    d.mkdir()
    (d / "numa_node").write_text("1\n")
    b._sysfs_pci = str(tmp_path)
    assert b.numa_node(1) == 1
    assert not any("NUMA" in n for n in b.notes)
    assert b.numa_node(0) is None and any("NUMA" in n for n in b.notes)


def test_a_gpu_whose_handle_fails_is_blank_and_the_others_are_fine():
    b, _ = real("pcie-4gpu-2socket", errors={("nvmlDeviceGetHandleByIndex", 2): GPU_IS_LOST})
    t = discover(b)
    assert t.gpus[2].uuid is None and t.gpus[2].links == ()
    assert t.gpus[3].uuid and t.matrix()[0][1] == "NV12"
    assert b.counters(2, [0]) == {} and b.utilization(2) is None


def test_link_count_field_failure_means_no_links_not_a_guess():
    b, _ = real("dgx-h100", field_errors={91: NOT_SUPPORTED})
    t = discover(b)
    assert all(g.nvlink_count is None and g.links == () for g in t.gpus)
    assert any("NVLINK_LINK_COUNT" in n for n in t.notes)


def test_counters_one_call_per_gpu_in_bytes_with_nvml_timestamps():
    counters = {(0, 138, 3): [0, 2_441, 4_882], (0, 139, 3): [0, 100, 200], (0, 197, 0): [0, 10**6, 2 * 10**6]}
    b, nv = real("dgx-h100", counters=counters, t_us=[1_000_000, 1_100_000, 1_200_000])
    c = b.counters(0, [3, 4])
    assert nv.calls["nvmlDeviceGetFieldValues"] == 1
    assert c["nvlink3.tx"][:2] == (0, 1_000_000)
    c = b.counters(0, [3, 4])
    assert c["nvlink3.tx"][:2] == (2_441 * 1024, 1_100_000) and c["nvlink3.rx"][:2] == (100 * 1024, 1_100_000)
    assert c["nvlink4.tx"][:2] == (0, 1_100_000) and c["pcie.tx"][:2] == (10**6, 1_100_000)
    # where each counter wraps, from NVML's value type: KiB counters in 64 bits
    assert c["nvlink3.tx"][2] == 2**64 * 1024


def test_a_32_bit_pcie_counter_reports_where_it_wraps():
    """nvml.h: the PCIe byte counters (fields 197/198) "can be wrapped"; their width is
    the value type NVML answers with."""
    counters = {(0, 197, 0): [2**32 - 1_000, 3_000]}
    b, nv = real("dgx-h100", counters=counters, t_us=[1_000_000, 2_000_000])
    nv.value_types = {197: 1}  # NVML_VALUE_TYPE_UNSIGNED_INT
    first = b.counters(0, [])["pcie.tx"]
    assert first[2] == 2**32


def test_unsupported_counter_fields_are_dropped_after_the_first_refusal():
    b, nv = real("dgx-h100", field_errors={138: NOT_SUPPORTED, 139: NOT_SUPPORTED, 197: INVALID_ARGUMENT,
                                           198: INVALID_ARGUMENT})
    c = b.counters(0, [0, 1])
    assert all(v is None for v in c.values())
    assert nv.calls["nvmlDeviceGetFieldValues"] == 1
    c = b.counters(0, [0, 1])
    assert all(v is None for v in c.values()) and set(c) == {"nvlink0.tx", "nvlink0.rx", "nvlink1.tx",
                                                            "nvlink1.rx", "pcie.tx", "pcie.rx"}
    assert nv.calls["nvmlDeviceGetFieldValues"] == 1  # nothing left worth asking
    assert sum("throughput counters" in n for n in b.notes) == 1
    assert sum("PCIe byte counters" in n for n in b.notes) == 1


def test_transient_field_errors_are_retried():
    b, nv = real("dgx-h100", field_errors={138: 999})
    b.counters(0, [0])
    b.counters(0, [0])
    assert nv.calls["nvmlDeviceGetFieldValues"] == 2


def test_permanent_sample_failures_are_not_asked_again():
    b, nv = real("dgx-h100", errors={"nvmlDeviceGetUtilizationRates": NOT_SUPPORTED})
    assert b.utilization(0) is None and b.utilization(0) is None
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 1
    assert b.memory(0) == (85520809984 // 4, 85520809984)


def test_pcie_throughput_is_kb_per_second_in_bytes():
    b, _ = real("pcie-2gpu")
    assert b.pcie_throughput(0) == (1000 * 1024.0, 2000 * 1024.0)


def test_gpm_rates_prime_then_report_mib_per_second_and_free_samples():
    gpm = {(0, 63 + 2 * 3): [100.0, 200.0], (0, 62 + 2 * 3): [50.0]}  # link 3 TX, RX
    b, nv = real("dgx-h100", gpm=gpm)
    assert b.nvlink_rates(0, [3]) == {}
    r = b.nvlink_rates(0, [3, 4])
    assert r["nvlink3.tx"] == 100.0 * 1048576 and r["nvlink3.rx"] == 50.0 * 1048576
    assert r["nvlink4.tx"] is None  # that metric refused
    r = b.nvlink_rates(0, [3])
    assert r["nvlink3.tx"] == 200.0 * 1048576
    b.close()
    assert nv.gpm_allocated == nv.gpm_freed == 3


def test_gpm_unsupported_is_none_and_not_asked_again():
    b, nv = real("dgx-a100")
    assert b.nvlink_rates(0, [0]) is None and b.nvlink_rates(0, [0]) is None
    assert nv.calls["nvmlGpmQueryDeviceSupport"] == 1


def test_non_nvml_exceptions_are_swallowed_too():
    nv = FakePynvml(preset_fixture("pcie-2gpu"))

    def boom(h):
        raise AttributeError("old pynvml")
    nv.nvmlDeviceGetUUID = boom
    b = RealNvml(nv)
    assert b.uuid(0) is None and b.name(0) == "NVIDIA L40S"
    assert any("UUID" in n and "old pynvml" in n for n in b.notes)


def test_a_function_missing_from_pynvml_is_not_available(monkeypatch):
    nv = FakePynvml(preset_fixture("pcie-2gpu"))
    b = RealNvml(nv)
    monkeypatch.setattr(FakePynvml, "nvmlDeviceGetPcieThroughput", None)
    assert b.pcie_throughput(0) is None
    assert any("this pynvml has no nvmlDeviceGetPcieThroughput" in n for n in b.notes)


def test_on_note_hears_each_note_once():
    heard = []
    nv = FakePynvml(preset_fixture("pcie-2gpu"), errors={"nvmlDeviceGetName": NOT_SUPPORTED})
    b = RealNvml(nv)
    b.on_note = heard.append
    b.name(0), b.name(1), b.name(0)
    assert len(heard) == 1 and "GPU name" in heard[0]
