"""Suite-wide: under COMMVIZ_PURE=1 (CI's pure-Python leg) no compiled part is
loaded, so the tests of those parts themselves skip; everywhere else they run, and
fail where a part was not built (a silent fallback would hide a broken build)."""

import pytest

from commviz import native


def pytest_collection_modifyitems(config, items):
    if not native.pure():
        return
    skip = pytest.mark.skip(reason="COMMVIZ_PURE=1: the compiled parts are off")
    for item in items:
        if item.get_closest_marker("native"):
            item.add_marker(skip)


@pytest.fixture
def sockdir(tmp_path):
    """A private directory for a listener's socket (the transport checks its mode)."""
    d = tmp_path / "commviz-test"
    d.mkdir(mode=0o700)
    return d
