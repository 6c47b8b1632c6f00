"""Helpers of the probe tests: the process's probe installed on torch's `fake`
process group, and what a test's ops recorded."""

import contextlib
from pathlib import Path

import pytest

from commviz.events import OpEnd, OpStart
from commviz.trace.file import load

WORLD = 4


@contextlib.contextmanager
def installed_probe(tmp_path_factory):
    """The process's probe, installed with a trace dir and an address nobody listens
    on; `trace_path` is its rank 0 trace file."""
    from commviz.probe.patch import install

    d = tmp_path_factory.mktemp("trace")
    mp = pytest.MonkeyPatch()
    mp.setenv("COMMVIZ_ADDR", f"ipc://{d}/nobody-listens.sock")
    try:
        p = install(trace_dir=str(d))
        assert p is not None
        p.trace_path = Path(p.cfg.trace_dir) / "rank-0.cvz"  # the first install's, if another module installed
        yield p
    finally:
        mp.undo()


def ops_of(probe, fn):
    """Run fn, flush the probe, return [(OpStart, OpEnd|None)] of what fn did."""
    probe.shutdown()  # flush what earlier tests did and start a fresh trace file
    fn()
    probe.shutdown()
    starts, ends = {}, {}
    for b in load(probe.trace_path).batches:
        for e in b.events:
            if isinstance(e, OpStart):
                starts[e.id] = e
            elif isinstance(e, OpEnd):
                ends[e.id] = e
    return [(s, ends.get(i)) for i, s in sorted(starts.items())]


def stop_sender_thread(probe):
    """A fresh probe whose sender thread is stopped: nothing drains the queue. Its
    sampler thread is stopped too: it queues samples on its own, and the counts here
    are of ops."""
    probe.shutdown()
    probe.ensure_started()
    s = probe.sender
    s._stop.set()
    s._wake.set()
    s.thread.join(5)
    assert not s.thread.is_alive()
    if probe.sampler is not None:
        probe.sampler.stop()
    probe.queue.clear()
    return s
