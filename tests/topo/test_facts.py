"""NVML's encodings decoded in one place."""

import pytest

from commviz.topo.facts import link_gbps, nvlink_major


@pytest.mark.parametrize("raw,arch,want", [
    (6, "hopper", 4),  # current drivers: nvmlNvlinkVersion_t 4.0
    (4, "hopper", 4),  # old drivers: the plain generation
    (4, "ampere", 3),  # enum 3.0
    (3, "ampere", 3),  # old driver, plain 3 (the enum would say 2.2)
    (7, "blackwell", 5),
    (2, "volta", 2),
    (4, None, 3),  # no architecture: the enum reading
    (0, "hopper", None), (None, "hopper", None), (99, None, None),
])
def test_nvlink_version_decoding(raw, arch, want):
    assert nvlink_major(raw, arch) == want


def test_link_speed_per_generation():
    assert link_gbps(4) == 25.0 and link_gbps(3) == 25.0 and link_gbps(5) == 50.0
    assert link_gbps(None) is None and link_gbps(6) is None  # unknown: not guessed
