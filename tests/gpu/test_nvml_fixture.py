"""NVML dumps taken on real GPU machines by `bench/gpu_check.sh` (tests/gpu/fixtures):
the fake backend replays each, and discovery sees what the machine had. Runs without
a GPU; nothing to check until a dump has been committed."""

import glob
import os

import pytest

from commviz.topo.discover import discover
from commviz.topo.fake import FakeNvml

DUMPS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "*.json")))


@pytest.mark.parametrize("path", DUMPS or [pytest.param(None, marks=pytest.mark.skip("no NVML dump committed yet"))])
def test_a_real_machines_dump_replays(path):
    b = FakeNvml.from_file(path)
    t = discover(b)
    assert t.gpus and all(g.uuid and g.bus_id for g in t.gpus)
    c = b.counters(0, [lk.link for lk in t.gpus[0].up_links])
    assert set(c) >= {"pcie.tx", "pcie.rx"}
