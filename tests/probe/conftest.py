"""Fixtures of the probe tests."""

import pytest

from tests.probe.probing import WORLD, installed_probe


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert torch.distributed.is_available()

    with installed_probe(tmp_path_factory) as p:
        dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
        yield p
        p.shutdown()
        dist.destroy_process_group()
