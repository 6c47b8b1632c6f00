"""The collector builds and serves views without the UI toolkit: a headless `commviz
serve` on a machine with no terminal loads neither Textual nor rich, and the view
model (commviz/view/) stays that way as it grows (its imports are held by the
"views are data" contract in pyproject.toml, which `lint-imports` checks)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

UI = ("textual", "rich")
LOADED_UI = f"sorted(m for m in sys.modules if m.split('.')[0] in {UI!r})"


def run_python(code: str, timeout: float = 120) -> str:
    """`code` in a fresh interpreter (this one has Textual loaded by other tests);
    its stdout. The last line it prints is what it found."""
    got = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout)
    assert got.returncode == 0, got.stderr
    return got.stdout.strip().splitlines()[-1]


def test_importing_the_collector_and_the_view_model_loads_no_ui_toolkit():
    loaded = run_python(f"""
        import sys
        import commviz.commands.serve, commviz.viewlink, commviz.view.snapshot, commviz.view.feed
        import commviz.watcher, commviz.httpview
        print({LOADED_UI})
    """)
    assert loaded == "[]"


def test_a_collector_answering_a_view_loads_no_ui_toolkit(sockdir):
    """The whole of it, as a user runs it: `commviz serve` up, a view connected by the
    address the ranks use, a snapshot taken, encoded and read back."""
    addr = f"ipc://{sockdir}/w.sock"
    seen = run_python(f"""
        import sys, threading, time
        from commviz import cli
        from commviz.viewlink import RemoteFeed, ViewError, ViewQuery

        got = []

        def look():
            end = time.monotonic() + 60
            while not got and time.monotonic() < end:
                try:
                    got.append(RemoteFeed({addr!r}).fetch(ViewQuery()))
                except ViewError:  # not up yet
                    time.sleep(0.05)

        t = threading.Thread(target=look, daemon=True)
        t.start()
        rc = cli.main(["serve", "--listen", {addr!r}, "--for", "2"])
        t.join(60)
        print(rc, bool(got) and got[0].snap is not None, {LOADED_UI})
    """)
    assert seen == "0 True []"

