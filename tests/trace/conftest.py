"""What the trace tests share: writing a trace file frame by frame, and the synthetic
job of bench/synth.py (the trace the summary's figures are measured on)."""

import importlib.util
import pathlib

import pytest

from commviz.events import encode_batch
from commviz.trace.file import TraceWriter

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def write_trace():
    """write_trace(path, [(rank, events), ...]): one frame per pair."""
    def write(path, frames):
        w = TraceWriter(path)
        for rank, evs in frames:
            w.write(encode_batch(rank, evs))
        w.close()
    return write


@pytest.fixture(scope="session")
def synth():
    spec = importlib.util.spec_from_file_location("bench_synth", ROOT / "bench" / "synth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
