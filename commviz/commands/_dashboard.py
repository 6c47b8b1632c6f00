"""What `watch`, `replay` and `demo` share: the GPU topology to lay ranks out by, and
running the dashboard on a feed (stopping a job we launched when it closes)."""

from __future__ import annotations

import os

from commviz.errors import CommvizError


def topology_option(name: str | None, local: bool = False):
    """`dashboard_topology`, a bad preset or fixture as a CommvizError."""
    from commviz.topo.fake import FixtureError

    try:
        return dashboard_topology(name, local)
    except FixtureError as exc:
        raise CommvizError(str(exc)) from exc


def dashboard_topology(name: str | None, local: bool = False):
    """`--topology` (a preset name or a fixture file), else for a live watch this
    machine's NVML when it has GPUs, else None. Raises FixtureError."""
    from commviz.topo.discover import discover
    from commviz.topo.fake import FakeNvml
    from commviz.topo.presets import load_preset

    if name:
        backend = FakeNvml.from_file(name) if os.path.exists(name) else load_preset(name)
    elif local:
        try:
            from commviz.topo.backend import open_backend

            backend = open_backend()
        except Exception:  # NVML absent or broken is a normal state here
            return None
    else:
        return None
    try:
        topo = discover(backend)
    finally:
        backend.close()
    return topo if topo.gpus else None


def run_app(feed, title: str, job=None, topology=None, simulate: bool = False) -> int:
    """The dashboard on `feed` (a `tui.feed.Feed`) until the user quits; then the job
    (if we launched one) is marked stopped and interrupted, and the feed closed.
    `simulate`: the user chose `topology`, so CPU ranks are shown on its GPUs."""
    from commviz.topo.hosts import HostTopologies
    from commviz.tui.app import WatchApp

    # each host's ranks on the topology its local rank 0 sent; `topology` (this
    # machine's NVML view, or the preset asked for) where a host sent none
    app = WatchApp(feed, title=title, topology=topology, simulate=simulate, hosts=HostTopologies(local=topology))
    try:
        app.run()
    finally:
        if job is not None:
            if job.proc is not None and job.proc.poll() is None:
                feed.note_stop("commviz watch", "quit while it ran")  # for a --record trace's post-mortem
            job.interrupt()
        feed.close()
    if job is not None and job.log_path:
        print(f"job output: {job.log_path}")
    return 0
