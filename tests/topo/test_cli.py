"""`commviz topo` and `commviz nvml-dump`: the DESIGN.md document, the nvidia-smi style
text, and plain words when there is no NVML."""

import json
import sys

import pytest

from commviz.cli import main
from commviz.topo.fake import FakeNvml, load_fixture
from commviz.topo.rates import RateTracker
from commviz.topo.presets import preset_fixture
from tests.topo.fake_pynvml import FakePynvml

LINK_KEYS = {"link", "state", "version", "remote", "remote_bus_id", "remote_gpu", "gbps_per_direction"}
GPU_KEYS = {"index", "name", "uuid", "bus_id", "links"}


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml({"gpus": []}, init_error=12))


def test_topo_preset_json_is_the_design_document(capsys):
    assert main(["topo", "--preset", "dgx-h100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "preset:dgx-h100" and doc["host"] == "dgx-h100"
    assert len(doc["gpus"]) == 8
    g = doc["gpus"][0]
    assert set(g) >= GPU_KEYS
    assert g["name"] == "NVIDIA H100 80GB HBM3" and g["uuid"].startswith("GPU-") and g["bus_id"] == "0000:18:00.0"
    assert len(g["links"]) == 18
    lk = g["links"][0]
    assert set(lk) >= LINK_KEYS
    assert lk == {"link": 0, "state": "up", "version": 4, "remote": "nvswitch", "remote_bus_id": "0000:05:00.0",
                  "remote_gpu": None, "gbps_per_direction": 25.0}
    m = doc["matrix"]
    assert len(m) == 8 and all(len(r) == 8 for r in m)
    assert m[0][0] == "X" and m[0][1] == "NV18" and m[7][3] == "NV18"


def test_topo_preset_text_reads_like_nvidia_smi(capsys):
    assert main(["topo", "--preset", "pcie-4gpu-2socket"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:4] == ["GPU0", "GPU1", "GPU2", "GPU3"])
    assert lines[head + 1].split() == ["GPU0", "X", "NV12", "SYS", "SYS", "0"]
    assert lines[head + 4].split() == ["GPU3", "SYS", "SYS", "NV12", "X", "1"]
    assert "Legend:" in out and "NV#" in out
    assert "links 0-11" in out and "-> GPU1 0000:31:00.0" in out
    assert "CNS" in out  # the P2P table


def test_topo_dgx_text_groups_links_per_switch(capsys):
    assert main(["topo", "--preset", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "NVLink: 18 links, 18 up, 450 GB/s per direction" in out
    assert "links 0-4" in out and "links 14-17" in out and "NVSwitch 0000:08:00.0" in out


def test_topo_without_nvml_says_so_and_points_at_presets(no_nvml, capsys):
    assert main(["topo"]) == 0
    out = capsys.readouterr().out
    assert "NVML is not available" in out
    assert "commviz topo --preset dgx-h100" in out and "pcie-4gpu-2socket" in out


def test_topo_json_without_nvml_is_a_document_with_source_none(no_nvml, capsys):
    assert main(["topo", "--json"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc["source"] == "none" and doc["gpus"] == [] and doc["matrix"] == []
    assert "NVML is not available" in cap.err


def test_topo_on_a_gpu_machine_uses_nvml(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(preset_fixture("pcie-2gpu")))
    assert main(["topo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "nvml" and doc["matrix"] == [["X", "PHB"], ["PHB", "X"]]


def test_unknown_preset_and_bad_fixture_are_clear(tmp_path, capsys):
    assert main(["topo", "--preset", "dgx-z9"]) == 2
    err = capsys.readouterr().err
    assert "no preset named 'dgx-z9'" in err and "dgx-h100" in err
    bad = tmp_path / "f.json"
    bad.write_text('{"gpus": [{"links": [{"remote": "switch"}]}]}')
    assert main(["topo", "--fixture", str(bad)]) == 2
    assert "gpus[0].links[0].remote" in capsys.readouterr().err


def test_preset_and_fixture_are_exclusive(capsys):
    with pytest.raises(SystemExit):
        main(["topo", "--preset", "dgx-h100", "--fixture", "x.json"])


def test_nvml_dump_without_nvml_fails_clearly(no_nvml, tmp_path, capsys):
    out = tmp_path / "f.json"
    assert main(["nvml-dump", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cannot dump" in err and "NVML is not available" in err
    assert not out.exists()


def test_nvml_dump_writes_a_fixture_that_topo_reads_back(monkeypatch, tmp_path, capsys):
    nv = FakePynvml(preset_fixture("dgx-h100"), counters={(0, 138, 0): [0, 1_000, 3_000]},
                    t_us=[1_000_000, 1_200_000, 1_400_000])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    out = tmp_path / "real.json"
    assert main(["nvml-dump", str(out), "--samples", "3", "--interval", "0"]) == 0
    assert "written to" in capsys.readouterr().out
    fx = load_fixture(out)
    assert fx["counters"]["t_us"] == [1_000_000, 1_200_000, 1_400_000]
    assert fx["counters"]["gpus"]["0"]["nvlink"]["0"]["tx_kib"] == [0, 1_000, 3_000]
    assert fx["gpus"][0]["memory_total"] == 85520809984
    # the capture replays: the fake plays the recorded counters, rates come out the same
    fake, r = FakeNvml.from_file(out), RateTracker()
    rates = [r.update("tx", *fake.counters(0, [0])["nvlink0.tx"]) for _ in range(3)]
    assert rates == [None, 1_000 * 1024 / 0.2, 2_000 * 1024 / 0.2]
    assert main(["topo", "--fixture", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == f"fixture:{out}"
    assert main(["topo", "--preset", "dgx-h100", "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == want["gpus"] and doc["matrix"] == want["matrix"]
    assert nv.shutdowns == 1
