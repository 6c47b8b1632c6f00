"""Every lesson in scenarios/ run as a real torchrun job on gloo, each rank writing its
trace (COMMVIZ_TRACE_DIR): the ops each rank issued, with exact counts and bytes
computed here from the sizes passed, plus what makes each lesson its lesson (roots,
peers, reduce ops, dtypes, async flags, DDP bucket counts, FSDP phases).

The fault scenarios (hang, p2p_deadlock, desync, crash, straggler) are run by
test_diagnose.py; allreduce.py by test_spine.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field

import pytest

from commviz.events import Mark, OpEnd, OpStart
from commviz.trace.file import load
from tests.integration.conftest import AG_SINGLE, RS_SINGLE, REPO, commviz, run, torchrun
from tests.trace.nesting import nesting_errors, to_chrome_trace

pytestmark = pytest.mark.integration

SCEN = os.path.join(REPO, "scenarios")
LESSONS = ["p2p", "broadcast", "scatter_gather", "reduce", "ring_allreduce", "all_gather", "reduce_scatter",
           "all_to_all", "ddp_train", "fsdp_train", "mixed_precision", "overlap", "fabrics"]
ELSEWHERE = ["allreduce", "hang", "p2p_deadlock", "desync", "crash", "straggler"]
F32 = 4


@dataclass
class Job:
    world: int
    stdout: str
    summary: dict
    ops: dict[int, list[OpStart]] = field(default_factory=dict)  # per rank, in the order issued
    marks: dict[int, list[Mark]] = field(default_factory=dict)
    tdir: str = ""  # the ranks' traces (COMMVIZ_TRACE_DIR)

    def per_rank(self, rank: int) -> dict[str, tuple[int, int]]:
        return {op: (v["count"], v["bytes"]) for op, v in self.summary["per_rank"][rank]["ops"].items()}

    def between(self, rank: int, first: str, then: str | None) -> list[OpStart]:
        """This rank's ops after mark `first` and before mark `then` (None: to the end)."""
        t = {m.text: m.t for m in self.marks[rank]}
        hi = t[then] if then else float("inf")
        return [s for s in self.ops[rank] if t[first] <= s.t < hi]


def job(tmp_path, nproc: int, name: str, *args: str) -> Job:
    tdir = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
    p = run(torchrun(nproc, os.path.join(SCEN, f"{name}.py"), *args),
            env={"COMMVIZ_TRACE_DIR": str(tdir), "COMMVIZ_SAMPLES": "0"}, timeout=90)
    assert p.returncode == 0, f"{name} {args} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    assert p.stdout.count(f"{name}: ok") == 1, p.stdout  # rank 0's closing line, once
    s = run(commviz("summary", str(tdir), "--json"))
    assert s.returncode == 0, s.stderr
    out = Job(nproc, p.stdout, json.loads(s.stdout), tdir=str(tdir))
    assert out.summary["world_size"] == nproc and out.summary["backend"] == "gloo"
    assert [r["status"] for r in out.summary["ranks"]] == ["exited"] * nproc
    assert out.summary["diagnoses"] == []
    ends: dict[int, dict[int, OpEnd]] = {}
    batches = load(tdir).batches
    assert nesting_errors(to_chrome_trace(batches)) == []  # what Perfetto needs, on every lesson
    for b in batches:
        for e in b.events:
            if isinstance(e, OpStart):
                out.ops.setdefault(b.rank, []).append(e)
            elif isinstance(e, OpEnd):
                ends.setdefault(b.rank, {})[e.id] = e
            elif isinstance(e, Mark):
                out.marks.setdefault(b.rank, []).append(e)
    for r, starts in out.ops.items():
        starts.sort(key=lambda s: s.id)
        for s in starts:
            e = ends.get(r, {}).get(s.id)
            assert e is not None and e.error == "", f"rank {r}: {s.op} #{s.id} did not complete cleanly: {e}"
    assert sorted(out.ops) == list(range(nproc))
    return out


def same_on_every_rank(j: Job, expect: dict[str, tuple[int, int]]) -> None:
    for r in range(j.world):
        assert j.per_rank(r) == expect, f"rank {r}"


# --------------------------------------------------------------- point to point


def test_p2p_blocking_ring_then_isend_irecv(tmp_path, isolated_env):
    n, iters, numel = 3, 2, 100
    j = job(tmp_path, n, "p2p", "--iters", str(iters), "--numel", str(numel), "--compute", "16")
    b = iters * numel * F32
    same_on_every_rank(j, {"send": (iters, b), "recv": (iters, b), "isend": (iters, b), "irecv": (iters, b)})
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        got = Counter((s.op, s.peer, s.is_async) for s in j.ops[r])
        assert got == {("send", nxt, False): iters, ("recv", prv, False): iters,
                       ("isend", nxt, True): iters, ("irecv", prv, True): iters}, r
        # the blocking ring comes first, then the overlapped shift
        assert [s.is_async for s in j.ops[r]] == [False] * 2 * iters + [True] * 2 * iters
        assert [s.op for s in j.between(r, "blocking ring", "isend/irecv + compute")] == (
            ["send", "recv"] if r == 0 else ["recv", "send"]) * iters


def test_ring_allreduce_sends_2_n_minus_1_chunks(tmp_path, isolated_env):
    n, iters, numel = 4, 2, 64
    j = job(tmp_path, n, "ring_allreduce", "--iters", str(iters), "--numel", str(numel))
    chunk = numel // n * F32
    steps = 2 * (n - 1) * iters
    # each rank sends 2(n-1)/n x S per all_reduce: all_reduce's busbw factor
    same_on_every_rank(j, {"isend": (steps, steps * chunk), "irecv": (steps, steps * chunk),
                           "all_reduce": (iters, iters * numel * F32)})
    for r in range(n):
        p2p = [s for s in j.ops[r] if s.op != "all_reduce"]
        assert all(s.batched and s.is_async for s in p2p)
        assert {s.peer for s in p2p if s.op == "isend"} == {(r + 1) % n}  # only the neighbours: a ring
        assert {s.peer for s in p2p if s.op == "irecv"} == {(r - 1) % n}
        assert len(j.between(r, "ring: reduce-scatter", "ring: all-gather")) == 2 * (n - 1)


def test_fabrics_the_same_ring_on_two_machines(tmp_path, isolated_env):
    """The all_reduces, and rank 0's comparison: every DGX edge on the NVSwitch, the
    PCIe box's pairs on NVLink and its socket-crossing edges on PCIe SYS, which bound it."""
    n, iters, numel = 4, 3, 1000
    j = job(tmp_path, n, "fabrics", "--iters", str(iters), "--numel", str(numel))
    same_on_every_rank(j, {"all_reduce": (iters, iters * numel * F32)})
    moved = 2 * (n - 1) / n * numel * F32
    assert (f"dgx-h100: NVLink×18 (450 GB/s): 0→1 1→2 2→3 3→0; at best {moved / 450e3:.3g} µs per all_reduce"
            in j.stdout)
    assert (f"pcie-4gpu-2socket: NVLink×12 (300 GB/s): 0→1 2→3; PCIe SYS (31.5 GB/s): 1→2 3→0; "
            f"at best {moved / (16 * 1.969e3):.3g} µs per all_reduce" in j.stdout)


# --------------------------------------------------------------------- rooted


def test_broadcast_from_rank_0(tmp_path, isolated_env):
    n, iters, layers, numel = 2, 2, 3, 64
    j = job(tmp_path, n, "broadcast", "--iters", str(iters), "--layers", str(layers), "--numel", str(numel),
            "--dtype", "bfloat16")
    same_on_every_rank(j, {"broadcast": (iters * layers, iters * layers * numel * 2)})
    assert all(s.root == 0 and s.dtype == "bfloat16" for r in range(n) for s in j.ops[r])


def test_scatter_then_gather(tmp_path, isolated_env):
    n, iters, numel = 3, 2, 32
    j = job(tmp_path, n, "scatter_gather", "--iters", str(iters), "--numel", str(numel))
    total = n * numel * F32  # the whole batch, on every rank
    same_on_every_rank(j, {"scatter": (iters, iters * total), "gather": (iters, iters * total)})
    for r in range(n):
        assert [(s.op, s.root) for s in j.ops[r]] == [("scatter", 0), ("gather", 0)] * iters


def test_reduce_sum_min_max_to_a_moving_root(tmp_path, isolated_env):
    n, iters, numel = 3, 3, 50
    j = job(tmp_path, n, "reduce", "--iters", str(iters), "--numel", str(numel), "--dtype", "float64")
    b = numel * 8
    same_on_every_rank(j, {"reduce": (3 * iters, 3 * iters * b), "all_reduce": (iters, iters * b)})
    for r in range(n):
        got = [(s.op, s.root, s.reduce_op) for s in j.ops[r]]
        assert got == [x for i in range(iters) for x in
                       [("reduce", i % n, "SUM"), ("reduce", i % n, "MIN"), ("reduce", i % n, "MAX"),
                        ("all_reduce", -1, "SUM")]]
    rows = {row["op"]: row for row in j.summary["ops"]}
    assert rows["reduce"]["busbw_gbps"] == pytest.approx(rows["reduce"]["algbw_gbps"], rel=1e-3)


# ------------------------------------------------------- the halves of a ring


def test_all_gather_gathered_total_rounded_to_the_ranks(tmp_path, isolated_env):
    n, iters = 3, 3
    j = job(tmp_path, n, "all_gather", "--iters", str(iters), "--numel", "100")  # 100 -> 102: 34 per rank
    same_on_every_rank(j, {AG_SINGLE: (iters, iters * 102 * F32)})
    assert all(s.shape == [102] for r in range(n) for s in j.ops[r])
    assert "numel rounded up to 102" in j.stdout and "busbw" in j.stdout


def test_reduce_scatter_total_input_and_busbw(tmp_path, isolated_env):
    n, iters, numel = 4, 3, 256
    j = job(tmp_path, n, "reduce_scatter", "--iters", str(iters), "--numel", str(numel))
    same_on_every_rank(j, {RS_SINGLE: (iters, iters * numel * F32)})
    [row] = j.summary["ops"]
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * (n - 1) / n, rel=1e-3)
    assert re.search(r"busbw [0-9.e+-]+ GB/s \(factor \(n-1\)/n = 0\.75\)", j.stdout), j.stdout


# ------------------------------------------------------------------ all_to_all


def test_all_to_all_uneven_token_dispatch(tmp_path, isolated_env):
    n, iters, tokens, hidden = 3, 3, 10, 16
    j = job(tmp_path, n, "all_to_all", "--iters", str(iters), "--tokens", str(tokens), "--numel", str(hidden))

    def route(r, step):  # the scenario's toy router, restated
        return [(step + (t + r) % (n + 1)) % n for t in range(tokens)]

    uneven = False
    for r in range(n):
        want = []
        for i in range(iters):
            received = sum(route(src, i).count(r) for src in range(n))
            uneven |= len(set(Counter(route(r, i)).values())) > 1
            # counts (n int64), dispatch (all this rank's tokens), combine (the tokens its expert got)
            want += [n * 8, tokens * hidden * F32, received * hidden * F32]
        assert [(s.op, s.bytes) for s in j.ops[r]] == [("all_to_all_single", b) for b in want], r
        assert j.per_rank(r) == {"all_to_all_single": (3 * iters, sum(want))}
    assert uneven


# ----------------------------------------------------------------- training


def rebuilt_bucket_count(sizes: list[int], limits: list[int]) -> int:
    """torch's compute_bucket_assignment_by_size: a bucket closes once it reaches its
    limit; the first bucket has limits[0], the others limits[-1]."""
    count, filled, lim = 0, 0, iter(limits)
    limit = next(lim)
    for s in sizes:
        filled += s
        if filled >= limit:
            count, filled, limit = count + 1, 0, next(lim, limit)
    return count + (filled > 0)


@pytest.mark.parametrize("cap_mb", [None, 0.01])
def test_ddp_bucket_count_follows_bucket_cap(tmp_path, isolated_env, cap_mb):
    n, iters, width, layers = 2, 3, 64, 4
    extra = [] if cap_mb is None else ["--bucket-cap-mb", str(cap_mb)]
    j = job(tmp_path, n, "ddp_train", "--iters", str(iters), "--numel", str(width), "--layers", str(layers), *extra)
    grad = width * width * F32
    # step 1: one bucket of everything; then rebuilt by the cap (torch's default: 1 MiB first, then 25 MiB)
    limits = [1 << 20, 25 << 20] if cap_mb is None else [int(cap_mb * (1 << 20))]
    per_step = rebuilt_bucket_count([grad] * layers, limits)
    assert per_step == (1 if cap_mb is None else layers)
    # DDP's constructor first: the shape check (2 int64 per dimension of each 2-d weight,
    # all-gathered) and the broadcast of rank 0's weights
    same_on_every_rank(j, {"ddp_bucket": (1 + (iters - 1) * per_step, iters * layers * grad),
                           "_verify_params_across_processes": (1, 8 * 2 * 2 * layers * n),
                           "_broadcast_coalesced": (1, layers * grad),
                           # the rebuild's layout (an int32 per parameter and the bucket
                           # count, then one per bucket), from C++
                           "ddp_rebuild_broadcast": (2, 4 * (layers + 1) + 4 * per_step)})
    for r in range(n):
        got = [(s.bucket, s.bytes, s.params) for s in j.ops[r] if s.op == "ddp_bucket"]
        size = layers * grad // per_step
        assert got == [(0, layers * grad, layers)] + [(b, size, layers // per_step) for b in range(per_step)] * (iters - 1)


def test_fsdp2_gathers_in_forward_and_backward_scatters_in_backward(tmp_path, isolated_env):
    n, iters, width, layers = 2, 2, 64, 2
    j = job(tmp_path, n, "fsdp_train", "--iters", str(iters), "--numel", str(width), "--layers", str(layers))
    w = width * width * F32  # one layer's full weights
    same_on_every_rank(j, {AG_SINGLE: (2 * layers * iters, 2 * layers * iters * w),
                           RS_SINGLE: (layers * iters, layers * iters * w)})
    for r in range(n):
        for i in range(iters):
            fwd = j.between(r, f"step {i}: forward", f"step {i}: backward")
            bwd = j.between(r, f"step {i}: backward", f"step {i + 1}: forward" if i + 1 < iters else None)
            assert [s.op for s in fwd] == [AG_SINGLE] * layers
            assert Counter(s.op for s in bwd) == {AG_SINGLE: layers, RS_SINGLE: layers}


def test_mixed_precision_bf16_moves_half_the_bytes(tmp_path, isolated_env):
    n, iters, layers, numel = 2, 2, 2, 256
    j = job(tmp_path, n, "mixed_precision", "--iters", str(iters), "--layers", str(layers), "--numel", str(numel))
    calls = iters * layers
    same_on_every_rank(j, {"all_reduce": (2 * calls, calls * numel * (4 + 2))})
    for r in range(n):
        by = {}
        for s in j.ops[r]:
            c, b = by.get(s.dtype, (0, 0))
            by[s.dtype] = (c + 1, b + s.bytes)
        assert by == {"float32": (calls, calls * numel * 4), "bfloat16": (calls, calls * numel * 2)}
        assert by["bfloat16"][1] * 2 == by["float32"][1]  # same ops, same element counts, exactly half
        assert all(s.shape == [numel] for s in j.ops[r])
        assert {s.dtype for s in j.between(r, "float32 gradient sync", "bfloat16 gradient sync")} == {"float32"}
        assert {s.dtype for s in j.between(r, "bfloat16 gradient sync", None)} == {"bfloat16"}


def test_overlap_serialized_then_async(tmp_path, isolated_env):
    n, iters, layers, numel = 2, 2, 3, 1024
    j = job(tmp_path, n, "overlap", "--iters", str(iters), "--layers", str(layers), "--numel", str(numel),
            "--compute", "32")
    calls = iters * layers
    same_on_every_rank(j, {"all_reduce": (2 * calls, 2 * calls * numel * F32)})
    for r in range(n):
        assert [s.is_async for s in j.ops[r]] == [False] * calls + [True] * calls
        assert len(j.between(r, "serialized", "overlapped")) == calls
    assert re.search(r"serialized [0-9.]+ ms a step, overlapped [0-9.]+ ms a step", j.stdout), j.stdout
    # exported for Perfetto, the async all_reduces in flight together get lanes, and
    # every track's slices nest
    out = tmp_path / "overlap.json"
    e = run(commviz("export", j.tdir, "--perfetto", str(out)))
    assert e.returncode == 0 and f"{4 * calls} ops written" in e.stdout, e.stderr
    doc = json.loads(out.read_text())
    assert nesting_errors(doc) == []
    lanes = {ev["args"]["name"] for ev in doc["traceEvents"] if ev.get("name") == "thread_name"}
    assert "group 0" in lanes and "group 0 · lane 2" in lanes, lanes


# ------------------------------------------------------------------ the course


def test_every_scenario_is_tested_and_in_the_readme():
    files = sorted(f[:-3] for f in os.listdir(SCEN) if f.endswith(".py") and not f.startswith("_"))
    assert files == sorted(LESSONS + ELSEWHERE)
    readme = open(os.path.join(REPO, "README.md")).read()
    section = readme.split("## Scenarios", 1)[1].split("\n## ", 1)[0]
    for name in files:
        assert f"scenarios/{name}.py" in section, name


def test_a_wrong_result_fails_loudly_naming_the_rank():
    code = ("import sys, torch; sys.path.insert(0, 'scenarios'); from _common import check; "
            "check(3, 'step 2: sum', torch.tensor([6., 5.]), torch.tensor([6., 6.]))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COMMVIZ": "0"})
    assert p.returncode == 1
    assert "rank 3: step 2: sum (element 1 of 2, 1 wrong): expected 6.0, got 5.0" in p.stderr
