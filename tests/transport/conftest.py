"""Fixtures of the transport tests."""

import pytest


@pytest.fixture
def sockdir(tmp_path):
    d = tmp_path / "commviz-test"
    d.mkdir(mode=0o700)
    return d
