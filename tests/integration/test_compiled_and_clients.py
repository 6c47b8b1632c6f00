"""Jobs commviz was not tuned for behave exactly as without it and hide nothing from
it: a compiled job (functional collectives and dist.all_reduce under
`fullgraph=True`, DDP over a compiled module, a compiled DDP), and unmodified
PyTorch Lightning and Accelerate jobs. Each runs twice, plainly and under commviz
with torch's flight recorder on; results must be equal and the audit must find no
collective commviz did not see."""

import json
import os

import pytest

from commviz.events import OpStart
from commviz.trace.file import load
from tests.integration.conftest import JOBS, commviz, run, run_plain, torchrun

pytestmark = pytest.mark.integration
WORLD = 2


def both(tmp_path, job: str) -> tuple[list[dict], list[dict], dict, list[OpStart]]:
    """(plain reports, commviz reports, summary JSON, starts by rank) of `job`."""
    reports = {}
    for how in ("plain", "commviz"):
        out = tmp_path / how
        cmd = [os.path.join(JOBS, job), "--report", str(out)]
        env = {"TORCH_FR_BUFFER_SIZE": "2000", "PYTHONFAULTHANDLER": "1"}  # a rank that aborts shows its threads
        if how == "commviz":
            sock = tmp_path / "sock"
            sock.mkdir(mode=0o700)
            cmd = ["-m", "commviz.run", *cmd]
            env.update(COMMVIZ_TRACE_DIR=str(tmp_path / "trace"), COMMVIZ_ADDR=f"ipc://{sock}/nobody.sock")
        else:
            env["COMMVIZ"] = "0"
        p = (run_plain if how == "plain" else run)(torchrun(WORLD, *cmd), env=env, timeout=240)
        assert p.returncode == 0, f"{how} run: {p.stderr[-3000:]}"
        reports[how] = [json.loads((tmp_path / f"{how}.{r}").read_text()) for r in range(WORLD)]
    s = run(commviz("summary", str(tmp_path / "trace"), "--json"))
    assert s.returncode == 0
    starts: dict[int, list] = {}
    for b in load(tmp_path / "trace").batches:
        starts.setdefault(b.rank, []).extend(e for e in b.events if isinstance(e, OpStart))
    return reports["plain"], reports["commviz"], json.loads(s.stdout), starts


def nothing_unseen(summary: dict) -> None:
    for r in summary["per_rank"]:
        audit = r["audit"]
        assert audit["backend"], "the flight recorder was read"
        assert audit["unseen"] == {}, (r["rank"], audit)


def counts(starts: list[OpStart]) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for s in starts:
        c = out.setdefault(s.op, [0, 0])
        c[0] += 1
        c[1] += s.bytes
    return {k: tuple(v) for k, v in out.items()}


@pytest.mark.timeout(600)
def test_a_compiled_job_is_unchanged_and_fully_seen(tmp_path):
    plain, seen, summary, starts = both(tmp_path, "compiled.py")
    for p, c in zip(plain, seen):
        # what dynamo made of the functions: one graph each, no break, with or without us
        assert c["explain"] == p["explain"] == {"chain": [1, 0, []], "inplace": [1, 0, []]}
        assert c["graphs"] == p["graphs"]
        # no break added (a compiled DDP breaks at DDP._pre_forward under commviz,
        # which torch itself breaks inside of)
        assert sum(c["breaks"].values()) <= sum(p["breaks"].values())
        for key in ("chain", "inplace", "inner", "outer"):
            assert c[key] == p[key], key
    nothing_unseen(summary)
    f32 = 4
    for r in range(WORLD):
        got = counts(starts[r])
        # chain and inplace run twice each (explain, then compiled), on 8 floats
        assert got["funcol.all_reduce"] == (4, 4 * 8 * f32)
        assert got["funcol.all_gather_into_tensor"] == (2, 2 * 8 * f32 * WORLD)
        assert got["funcol.reduce_scatter_tensor"] == (2, 2 * 8 * f32 * WORLD)
        # two DDP models of 4 parameters, one bucket each: 3 steps, rebuilt once
        params = (16 * 32 + 32 + 32 * 4 + 4) * f32
        assert got["ddp_bucket"] == (6, 6 * params)
        assert got["ddp_rebuild_broadcast"] == (4, 2 * (4 * (4 + 1) + 4))
        assert got["_broadcast_coalesced"] == (2, 2 * params)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("job", ["lightning_job.py", "accelerate_job.py"])
def test_training_frameworks_are_unchanged_and_fully_seen(tmp_path, job):
    pytest.importorskip("pytorch_lightning" if job.startswith("lightning") else "accelerate")
    plain, seen, summary, starts = both(tmp_path, job)
    assert seen == plain
    nothing_unseen(summary)
    for r in range(WORLD):
        got = counts(starts[r])
        assert got["ddp_rebuild_broadcast"][0] == 2  # the reducer's, from C++
        assert got["ddp_bucket"][0] == 4  # four steps, one bucket each
