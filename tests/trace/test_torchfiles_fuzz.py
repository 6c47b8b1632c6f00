"""Hostile or broken torch files never crash the importers: each is a named error or
plain data the model can digest."""

import json
import pickle
import random
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from commviz.model import Model
from commviz.trace import flightrec, kineto, safepickle
from commviz.trace.file import TraceError
from commviz.trace.sources import open_trace

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DATA = Path(__file__).parent / "data"
REAL = json.loads((DATA / "gloo_hang_json" / "fr_trace_2.json").read_text())
PROFILE = json.loads((DATA / "hta_nccl_rank0.json").read_text())

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12)
    | st.binary(max_size=12),
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=25,
)
jsonish = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.sampled_from(
        ["entries", "version", "pg_config", "ranks", "process_group", "profiling_name", "input_sizes", "traceEvents",
         "args", "name", "ph", "ts", "dur", "x"]), inner, max_size=5),
    max_leaves=30,
)


def _digest(batches) -> None:
    m = Model(hang_after_s=1.0)
    for b in batches:
        for ev in b.events:
            m.ingest(b.rank, ev)
    m.summary()


@SETTINGS
@given(st.binary(max_size=256))
def test_random_bytes_are_refused_or_plain(data):
    try:
        safepickle.loads(data)
    except safepickle.UnsafePickle as exc:
        assert str(exc)


@SETTINGS
@given(plain, st.integers(3, pickle.HIGHEST_PROTOCOL))
def test_plain_data_round_trips(v, protocol):
    assert safepickle.loads(pickle.dumps(v, protocol=protocol)) == v


@SETTINGS
@given(jsonish)
def test_any_document_is_a_dump_error_or_a_dump_the_model_digests(doc):
    try:
        d = flightrec.parse_dump(doc, 0, 0)
    except flightrec.DumpError:
        return
    batches, _ = flightrec.to_batches({0: d}, "fuzz")
    _digest(batches)


def _one_field_replaced(real: dict, items: str, seed: int, value, nested: str = "") -> tuple[dict, random.Random]:
    """A copy of `real` with one field of one of its `items` (or of that item's
    `nested` mapping, most of the time) set to `value`."""
    rnd = random.Random(seed)
    doc = json.loads(json.dumps(real))
    e = rnd.choice(doc[items])
    target = e[nested] if nested and rnd.random() < 0.7 else e
    target[rnd.choice(sorted(target))] = value
    return doc, rnd


@SETTINGS
@given(st.integers(0, 2**32), jsonish)
def test_a_real_dump_with_one_field_replaced(seed, value):
    doc, rnd = _one_field_replaced(REAL, "entries", seed, value)
    if rnd.random() < 0.3:
        doc["pg_config"][""]["ranks"] = value if not isinstance(value, str) else value[:20]
    d = flightrec.parse_dump(doc, 2, 0)
    batches, _ = flightrec.to_batches({2: d, 0: flightrec.parse_dump(REAL, 0, 0)}, "fuzz")
    _digest(batches)


@SETTINGS
@given(st.integers(0, 2**32), jsonish)
@example(seed=147047, value=7506948714431391.0)  # a duration that ends past what an int64 holds
def test_a_real_profile_with_one_field_replaced(seed, value):
    doc, _ = _one_field_replaced(PROFILE, "traceEvents", seed, value, nested="args")
    try:
        rt = kineto.parse(doc, 0)
    except kineto.ProfileError:
        return
    _digest([kineto.to_batch(rt, "fuzz")])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.sampled_from([b"", b"{", b"\x80\x02", b"\x1f\x8b"]))
def test_any_file_in_a_directory_is_a_trace_error_or_loads(tmp_path_factory, data, head):
    d = tmp_path_factory.mktemp("f")
    (d / "dump_0").write_bytes(head + data)
    try:
        loaded = open_trace(d)
    except TraceError as exc:
        assert "dump_0" in str(exc)
        return
    _digest(loaded.batches)
