"""Every op family under a real 4-rank gloo job: each call is one event, on the
right rank, with exact bytes, peer/root, group and sequence number."""

import io
import os
import re
import pickle

import pytest

from commviz.events import GroupDef, OpEnd, OpStart
from commviz.trace.file import load
from tests.integration.conftest import AG_SINGLE, RS_SINGLE, JOBS, run, torchrun

# one worker runs the module: its job (a module fixture) runs once under `pytest -n`
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("coverage")]
WORLD = 4


def pickled(obj) -> int:
    f = io.BytesIO()
    pickle.Pickler(f).dump(obj)  # what torch's _object_to_tensor does
    return len(f.getvalue())


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("every_op")
    sock = tmp_path_factory.mktemp("sock")
    os.chmod(sock, 0o700)
    p = run(
        torchrun(WORLD, "-m", "commviz.run", os.path.join(JOBS, "every_op.py")),
        # a rank that aborts (seen rarely: "terminate called without an active
        # exception", after the probe's own clean shutdown) leaves its threads' stacks
        env={"COMMVIZ_TRACE_DIR": str(d), "COMMVIZ_ADDR": f"ipc://{sock}/nobody.sock", "PYTHONFAULTHANDLER": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    starts, ends, groups = {}, {}, {}
    for b in load(d).batches:
        for e in b.events:
            if isinstance(e, OpStart):
                starts.setdefault(b.rank, {})[e.id] = e
            elif isinstance(e, OpEnd):
                ends.setdefault(b.rank, {})[e.id] = e
            elif isinstance(e, GroupDef):
                groups.setdefault(b.rank, {})[e.group] = e.ranks
    events = {r: [(s, ends[r].get(i)) for i, s in sorted(st.items())] for r, st in starts.items()}
    # ranks share torchrun's stdout and a print's newline may go out in a write of its
    # own, so two ranks' lines can run together: match the pairs, not the lines
    waited = {int(r): int(t) for r, t in re.findall(r"waiting-from (\d+) (\d+)", p.stdout)}
    no_a2a = {int(r) for r in re.findall(r"no-alltoall (\d+)", p.stdout)}
    return {"events": events, "groups": groups, "dir": d, "waited": waited, "no_alltoall": no_a2a}


LATE = 30  # the job's last section (async forms) starts at this seq of group 0


def rows(trace, rank, ops):
    """Events of `ops` before the last section."""
    return [
        (s.op, s.group, s.seq, s.bytes if s.bytes or e is None or e.bytes < 0 else e.bytes, s.peer, s.root, s.is_async)
        for s, e in trace["events"][rank]
        if s.op in ops and (s.group != "0" or s.seq < LATE)
    ]


def end_bytes(trace, rank, op):
    return [e.bytes for s, e in trace["events"][rank] if s.op == op]


def failed_here(trace, rank, s) -> bool:
    """The job's one failing call, and all_to_all where this torch's gloo lacks it."""
    return (s.op == "broadcast" and s.root == 99) or (s.op == "all_to_all" and rank in trace["no_alltoall"])


def test_every_event_completes_once(trace):
    for r in range(WORLD):
        evs = trace["events"][r]
        ids = [s.id for s, _ in evs]
        assert len(ids) == len(set(ids))
        for s, e in evs:
            assert e is not None, f"rank {r}: {s.op}#{s.seq} never ended"
            assert e.t >= s.t
            if not failed_here(trace, r, s):
                assert e.error == "", (s.op, e.error)


def test_point_to_point_family(trace):
    p2p = ("send", "recv", "isend", "irecv", "send_object_list", "recv_object_list")
    obj = 8 + pickled({"k": list(range(10))})  # the size tensor, then the pickled bytes
    for r in range(WORLD):
        nxt, prv = (r + 1) % WORLD, (r - 1) % WORLD
        blocking = [("send", "0", 0, 400, nxt, -1, False), ("recv", "0", 0, 400, prv, -1, False)]
        expect = (blocking if r % 2 == 0 else blocking[::-1]) + [
            ("isend", "0", 1, 1600, nxt, -1, True),
            ("irecv", "0", 1, 1600, prv, -1, True),
            ("isend", "0", 2, 200, nxt, -1, True),  # batch_isend_irecv: one event per P2POp
            ("irecv", "0", 2, 200, prv, -1, True),
        ]
        if r == 0:
            expect.append(("send_object_list", "0", 3, obj, 1, -1, False))
        if r == 1:
            expect.append(("recv_object_list", "0", 3, obj, 0, -1, False))
        assert rows(trace, r, p2p) == expect, r
        batched = [s.batched for s, _ in trace["events"][r] if s.op in ("isend", "irecv")]
        assert batched == [False, False, True, True]


def test_rooted_family(trace):
    ops = ("broadcast", "reduce", "gather", "scatter", "broadcast_object_list", "gather_object", "scatter_object_list")
    bol = 8 + pickled({"weights": list(range(50))})
    go = WORLD * 8 + WORLD * pickled({"r": 0})  # all_gather of sizes, gather of padded objects
    so = 8 + WORLD * 8 + WORLD * pickled({"i": 0})  # broadcast max size, scatter sizes, scatter objects
    for r in range(WORLD):
        got = rows(trace, r, ops)
        assert got[:7] == [
            ("broadcast", "0", 0, 1024, -1, 1, False),
            ("reduce", "0", 1, 1024, -1, 2, False),
            ("gather", "0", 2, WORLD * 256, -1, 3, False),  # the gathered total, on every rank
            ("scatter", "0", 3, WORLD * 128, -1, 0, False),  # the total input, on every rank
            ("broadcast_object_list", "0", 4, bol, -1, 0, False),
            ("gather_object", "0", 5, go, -1, 0, False),
            ("scatter_object_list", "0", 6, so, -1, 0, False),
        ]
        assert got[7:] == [
            ("broadcast", "0", 22, 512, -1, 0, True),
            ("broadcast", "0", 29, 16, -1, 99, False),
        ]
        reduce_ = [s for s, _ in trace["events"][r] if s.op == "reduce"][0]
        assert reduce_.reduce_op == "MAX"


def test_gather_scatter_everything_family(trace):
    ops = (
        "all_gather", "all_gather_into_tensor", AG_SINGLE, "reduce_scatter", "reduce_scatter_tensor",
        RS_SINGLE, "all_to_all", "all_to_all_single", "all_gather_object",
    )
    ago = WORLD * 8 + WORLD * pickled({"r": 0})
    for r in range(WORLD):
        assert rows(trace, r, ops) == [
            ("all_gather", "0", 7, 1024, -1, -1, False),
            ("all_gather_into_tensor", "0", 8, 1024, -1, -1, False),  # one event, not two
            (AG_SINGLE, "0", 9, 1024, -1, -1, False),
            ("reduce_scatter", "0", 10, 1024, -1, -1, False),
            ("reduce_scatter_tensor", "0", 11, 1024, -1, -1, False),
            (RS_SINGLE, "0", 12, 1024, -1, -1, False),
            ("all_to_all", "0", 13, 256, -1, -1, False),
            ("all_to_all_single", "0", 14, 40, -1, -1, False),  # uneven splits: this rank's input
            ("all_gather_object", "0", 15, ago, -1, -1, False),
            ("all_gather_into_tensor", "0", 23, 512, -1, -1, True),
        ]


def test_all_reduce_every_reduce_op_async_coalesced_and_barriers(trace):
    ops = ("all_reduce", "all_reduce_coalesced", "barrier", "monitored_barrier")
    for r in range(WORLD):
        got = [(s.op, s.seq, s.bytes, s.reduce_op, s.is_async) for s, _ in trace["events"][r]
               if s.op in ops and s.group == "0" and s.seq < LATE]
        assert got == [
            ("all_reduce", 16, 64, "SUM", False),
            ("all_reduce", 17, 64, "PRODUCT", False),
            ("all_reduce", 18, 64, "MIN", False),
            ("all_reduce", 19, 64, "MAX", False),
            ("all_reduce", 20, 64, "BAND", False),
            ("all_reduce", 21, 512, "SUM", True),
            ("barrier", 24, 0, "", False),
            ("monitored_barrier", 25, 0, "", False),
            ("all_reduce_coalesced", 26, 120, "SUM", False),
            ("all_reduce", 27, 24, "SUM", False),  # issued inside _coalescing_manager
            ("all_reduce", 28, 24, "SUM", False),
        ]


def test_async_ops_are_timed_to_completion_not_to_wait(trace):
    """The job lets its async collectives complete, then says when it starts waiting
    on them: each one's end was stamped before that."""
    assert sorted(trace["waited"]) == list(range(WORLD))
    for r in range(WORLD):
        timed = [(s, e) for s, e in trace["events"][r] if s.is_async and s.seq in (21, 22, 23) and s.group == "0"]
        assert len(timed) == 3
        for s, e in timed:
            assert e.t < trace["waited"][r], (s.op, (trace["waited"][r] - e.t) / 1e6)


def test_async_forms_and_all_gather_coalesced(trace):
    for r in range(WORLD):
        got = [(s.op, s.seq, s.bytes, s.root, s.is_async) for s, _ in trace["events"][r] if s.group == "0" and s.seq >= LATE]
        assert got == [
            ("reduce", 30, 64, 1, True),
            ("gather", 31, WORLD * 32, 2, True),
            ("scatter", 32, WORLD * 32, 3, True),
            ("all_gather", 33, WORLD * 32, -1, True),
            (AG_SINGLE, 34, WORLD * 32, -1, True),
            ("reduce_scatter", 35, WORLD * 32, -1, True),
            ("reduce_scatter_tensor", 36, WORLD * 32, -1, True),
            ("all_to_all", 37, WORLD * 16, -1, True),
            ("all_to_all_single", 38, WORLD * 16, -1, True),
            ("all_reduce_coalesced", 39, 20, -1, True),
            ("all_gather_coalesced", 40, WORLD * 20, -1, True),
            ("barrier", 41, 0, -1, True),
            ("all_gather_coalesced", 42, WORLD * 20, -1, False),
        ]


def test_failed_op_records_the_error(trace):
    for r in range(WORLD):
        [(s, e)] = [(s, e) for s, e in trace["events"][r] if s.op == "broadcast" and s.root == 99]
        assert "RuntimeError" in e.error or "ValueError" in e.error
        if r in trace["no_alltoall"]:  # an op the backend refuses is still seen, with why
            a2a = [e.error for s, e in trace["events"][r] if s.op == "all_to_all"]
            assert len(a2a) == 2 and all("does not support alltoall" in x for x in a2a), a2a


def test_sub_groups_new_group_and_device_mesh(trace):
    for r in range(WORLD):
        groups = trace["groups"][r]
        sub = [(s.group, s.seq, s.bytes) for s, _ in trace["events"][r] if s.group != "0"]
        if r in (0, 1):
            assert len(sub) == 2
            g_new, g_mesh = sub[0][0], sub[1][0]
            assert groups[g_new] == [0, 1] and sub[0][1:] == (0, 64)
        else:
            assert len(sub) == 1
            g_mesh = sub[0][0]
        assert groups[g_mesh] == ([0, 1] if r < 2 else [2, 3])
        assert sub[-1][1:] == (0, 32)


def test_summary_agrees(trace):
    import json

    from tests.integration.conftest import commviz

    p = run(commviz("summary", str(trace["dir"]), "--json"))
    s = json.loads(p.stdout)
    ops = {(o["op"], o["group"]): o for o in s["ops"]}
    assert ops[("all_reduce", "0")]["count"] == 8
    assert ops[("send", "0")]["count"] == 4 and ops[("send", "0")]["bytes"] == 1600
    assert ops[("broadcast", "0")]["errors"] == 1
    assert all(r["status"] == "exited" for r in s["ranks"])
