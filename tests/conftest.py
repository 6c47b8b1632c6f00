"""Suite-wide: the tests of the compiled parts themselves (`@pytest.mark.native`)
skip under COMMVIZ_PURE=1 (CI's pure-Python leg) and where a part was not built (an
install with no C compiler: the pure-Python paths are tested all the same). In CI
(`CI` set, as `.ci/run` runs) or with COMMVIZ_REQUIRE_NATIVE=1 a part not built
fails them instead: there a silent fallback would hide a broken build."""

import os

import pytest

from commviz import native
from tests.helpers import FakeClock


def pytest_collection_modifyitems(config, items):
    if native.pure():
        why = "COMMVIZ_PURE=1: the compiled parts are off"
    else:
        missing = [name for name, st in native.report().items() if st not in ("loaded", "built")]
        required = any(os.environ.get(v, "").lower() not in ("", "0", "false")
                       for v in ("CI", "COMMVIZ_REQUIRE_NATIVE"))
        if not missing or required:
            return
        why = f"not built here: {', '.join(missing)} (`commviz doctor` says why)"
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if item.get_closest_marker("native"):
            item.add_marker(skip)


@pytest.fixture
def sockdir(tmp_path):
    """A private directory for a listener's socket (the transport checks its mode)."""
    d = tmp_path / "commviz-test"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def clock():
    """A stopped clock for a Sender, Server or Relay (`clock=clock, sleep=clock.sleep`):
    the test steps their timers instead of sleeping past them."""
    return FakeClock()
