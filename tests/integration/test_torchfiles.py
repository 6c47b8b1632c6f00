"""A real 4-rank gloo job writes torch's own files — profiler traces of known ops, then
flight-recorder dumps (JSON and pickle) of a hang — and `commviz summary` reads them
as the job they describe."""

import json
import os

import pytest

from tests.integration.conftest import JOBS, commviz, run, torchrun

# one worker runs the module: its job (a module fixture) runs once under `pytest -n`
pytestmark = pytest.mark.xdist_group("torchfiles")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("torchfiles")
    for d in ("prof", "fr_json", "fr_pickle"):
        (out / d).mkdir()
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "COMMVIZ": "0", "COMMVIZ_ADDR": f"ipc://{out}/nobody.sock"}
    p = run(torchrun(4, os.path.join(JOBS, "torch_files.py"), str(out)), env=env, timeout=240)
    assert p.returncode == 0
    return out


def summary(path) -> dict:
    p = run(commviz("summary", str(path), "--json"))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("kind", ["fr_json", "fr_pickle"])
def test_flight_recorder_dumps_of_a_hung_job_are_diagnosed_as_that_hang(files, kind):
    doc = summary(files / kind)
    (d,) = [d for d in doc["diagnoses"] if d["kind"] == "hang"]
    assert (d["op"], d["group"], d["seq"]) == ("all_reduce", "0", 10)
    assert d["waiting_ranks"] == [0, 1, 2] and d["missing_ranks"] == [3]
    assert [r["status"] for r in doc["ranks"]] == ["hung", "hung", "hung", "ok"]
    # the group made by new_group([0, 1]): members inferred from who holds its entries
    assert {(o["op"], o["group"]): o["count"] for o in doc["ops"]}[("all_reduce", "1")] == 1


def test_a_profiler_trace_of_a_gloo_job_is_summarised_with_exact_counts(files):
    doc = summary(files / "prof")
    assert {o["op"]: (o["count"], o["bytes"]) for o in doc["ops"]} == {
        "all_reduce": (5, 5 * 4000), "broadcast": (1, 4000), "_all_gather_base": (1, 16000),
        "_reduce_scatter_base": (1, 4000), "barrier": (1, 0), "send": (2, 56), "recv": (2, 56),
    }
    assert [pr["ops"]["all_reduce"]["count"] for pr in doc["per_rank"]] == [5, 5, 5, 5]
    assert doc["diagnoses"] == []
