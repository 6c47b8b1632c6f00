"""Perfetto export: what the viewers need to draw it right."""

from commviz.events import Batch, Mark, OpEnd, OpStart, Stopped
from commviz.trace.lanes import assign_lanes
from tests.helpers import group, hello
from tests.trace.nesting import nesting_errors, to_chrome_trace

US = 1000  # ns


def test_lanes_keep_overlapping_spans_apart_and_reuse_free_ones():
    spans = [(0, 100), (10, 50), (20, 150), (50, 60), (100, 200), (150, 160)]
    lanes = assign_lanes(spans)
    assert lanes == [0, 1, 2, 1, 0, 1]
    for lane in set(lanes):
        mine = sorted(s for s, k in zip(spans, lanes) if k == lane)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))
    assert assign_lanes([(0, 10), (10, 20), (20, 30)]) == [0, 0, 0]  # no overlap: one track


def test_the_checker_catches_overlap_on_one_track():
    doc = {"traceEvents": [
        {"ph": "X", "pid": 0, "tid": 1, "name": "isend #0", "ts": 0.0, "dur": 100.0},
        {"ph": "X", "pid": 0, "tid": 1, "name": "irecv #0", "ts": 10.0, "dur": 50.0},  # nests: fine
        {"ph": "X", "pid": 0, "tid": 1, "name": "irecv #1", "ts": 20.0, "dur": 130.0},  # crosses isend's end
        {"ph": "X", "pid": 0, "tid": 2, "name": "all_reduce #0", "ts": 20.0, "dur": 130.0},  # other track
        {"ph": "b", "pid": 0, "cat": "c", "id": 1, "name": "a", "ts": 0.0},
        {"ph": "e", "pid": 0, "cat": "c", "id": 2, "name": "a", "ts": 5.0},
    ]}
    errs = nesting_errors(doc)
    assert len(errs) == 3, errs
    assert "'irecv #1' at 20.0 overlaps 'irecv #0'" in errs[0]
    assert "without a begin" in errs[1] and "never ends" in errs[2]


def overlapping_job() -> list[Batch]:
    """Two ranks: isend/irecv posted together and waited on later, two async
    all_reduces in flight at once, a blocking one after, and one never finished."""
    out = []
    for r in (0, 1):
        peer = 1 - r
        evs = [hello(r), group(), group("1", (0, 1))]
        evs += [OpStart(1, 100 * US, "isend", "0", 0, 64, peer=peer, is_async=True),
                OpStart(2, 110 * US, "irecv", "0", 0, 64, peer=peer, is_async=True),
                OpStart(3, 120 * US, "all_reduce", "0", 0, 4096, is_async=True),
                OpEnd(1, 300 * US), OpStart(4, 310 * US, "all_reduce", "0", 1, 4096, is_async=True),
                OpEnd(3, 320 * US), OpEnd(2, 330 * US), OpEnd(4, 500 * US),
                OpStart(5, 500 * US, "all_reduce", "0", 2, 4096), OpEnd(5, 600 * US),
                OpStart(6, 150 * US, "broadcast", "1", 0, 64, root=0), OpEnd(6, 400 * US),
                OpStart(7, 700 * US, "isend", "0", 1, 64, peer=peer, is_async=True),  # never ends
                OpStart(8, 650 * US, "irecv", "0", 1, 64, peer=peer, is_async=True), Mark(800 * US, "step 1")]
        out.append(Batch(1, r, evs))
    return out


def test_overlapping_async_ops_nest_on_every_track():
    doc = to_chrome_trace(overlapping_job())
    assert nesting_errors(doc) == []
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 16  # every op, once
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert sorted(names.values()) == sorted(["group 0", "group 0 · lane 2", "group 0 · lane 3", "group 1"] * 2)
    # lanes sort under their group, in order
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in doc["traceEvents"]
             if e.get("name") == "thread_sort_index"}
    rank0 = sorted((order[k], v) for k, v in names.items() if k[0] == 0)
    assert [v for _, v in rank0] == ["group 0", "group 0 · lane 2", "group 0 · lane 3", "group 1"]
    [never] = [e for e in xs if e["pid"] == 0 and e["name"] == "isend #1"]
    assert never["args"]["unfinished"] and never["ts"] + never["dur"] > 0
    # durations are exact (µs since the trace's first second, not since 1970)
    [ar] = [e for e in xs if e["pid"] == 0 and e["name"] == "all_reduce #0"]
    assert ar["dur"] == 200.0 and ar["args"]["async"] is True
    assert doc["otherData"]["origin_wall_ns"] % 10**9 == 0


def test_touching_ops_share_a_track_and_still_nest():
    """Back-to-back blocking ops (one ends at the ns the next starts) need no lane,
    and a wall clock in 1970-microseconds would have blurred them into overlap."""
    evs = [hello(0, world=1), group(ranks=[0])]
    for k in range(50):
        evs += [OpStart(k, 1_000_003 + 777 * k, "all_reduce", "0", k, 64), OpEnd(k, 1_000_003 + 777 * (k + 1))]
    doc = to_chrome_trace([Batch(1, 0, evs)])
    assert {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {1}
    assert nesting_errors(doc) == []


def test_where_commviz_stopped_the_job_is_an_instant():
    evs = [hello(0, world=1), group(ranks=[0]), OpStart(0, 1000, "all_reduce", "0", 0, 64),
           Stopped(5 * 10**9, "commviz record", "hang", 3.0)]
    doc = to_chrome_trace([Batch(2, 0, evs)])
    [stop] = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert stop["name"] == "stopped by commviz record after 3 s (hang)"
