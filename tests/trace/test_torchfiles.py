"""torch's own files open in commviz: flight-recorder dumps (JSON, pickle) and profiler
traces, a file or a directory of them, diagnosed by the same model as a live job."""

import gzip
import json
import shutil
from pathlib import Path

import pytest

from commviz import cli
from commviz.trace.file import TraceError
from commviz.trace.sources import open_trace
from commviz.trace.torchfiles import parse_rank_map, rank_from_name
from tests.trace.torchfixtures import fr_dump, fr_entry, kernel, profile, rpc

DATA = Path(__file__).parent / "data"


def summary(capsys, *args) -> dict:
    assert cli.main(["summary", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def hang_of(doc: dict) -> dict:
    (d,) = [d for d in doc["diagnoses"] if d["kind"] == "hang"]
    return d


@pytest.mark.parametrize("kind", ["gloo_hang_json", "gloo_hang_pickle"])
def test_real_gloo_dumps_of_a_hang_name_the_collective_the_missing_rank_and_the_waiters(capsys, kind):
    doc = summary(capsys, DATA / kind)
    d = hang_of(doc)
    assert (d["op"], d["group"], d["seq"]) == ("all_reduce", "0", 10)  # the 11th collective on the world group
    assert d["waiting_ranks"] == [0, 1, 2] and d["missing_ranks"] == [3]
    assert [r["status"] for r in doc["ranks"]] == ["hung", "hung", "hung", "ok"]
    # what the backend ran before the hang, on every rank (gloo runs reduce_scatter as all_reduce)
    for pr in doc["per_rank"]:
        assert pr["ops"]["all_reduce"]["count"] == (7 if pr["rank"] < 2 else 6)
        assert pr["ops"]["broadcast"] == {"count": 1, "bytes": 4000}
        assert pr["ops"]["all_gather"] == {"count": 1, "bytes": 16000}
        assert pr["ops"]["barrier"]["count"] == 2
    rows = {(o["op"], o["group"]): o["count"] for o in doc["ops"]}
    assert rows[("all_reduce", "1")] == 1  # the [0, 1] group, members inferred
    notes = "\n".join(doc["notes"])
    assert "does not record completion" in notes and "does not record send/recv" in notes
    assert "group 1: members 0,1 inferred" in notes


def test_pickle_dumps_carry_the_waiting_ranks_python_stacks(capsys):
    d = hang_of(summary(capsys, DATA / "gloo_hang_pickle"))
    assert sorted(s["rank"] for s in d["stacks"]) == [0, 1, 2]
    assert all(s["where"].startswith("torch_files.py:") for s in d["stacks"])


def test_real_gloo_profiler_traces_give_exact_counts_and_bytes(capsys):
    doc = summary(capsys, DATA / "gloo_profile")
    rows = {o["op"]: (o["count"], o["bytes"]) for o in doc["ops"]}
    assert rows == {
        "all_reduce": (5, 5 * 4000), "broadcast": (1, 4000), "_all_gather_base": (1, 16000),
        "_reduce_scatter_base": (1, 4000), "barrier": (1, 0), "send": (2, 56), "recv": (2, 56),
    }
    assert all(o["p50_us"] > 0 for o in doc["ops"])  # timed to the end of gloo's run
    for pr in doc["per_rank"]:
        assert pr["ops"]["all_reduce"] == {"count": 5, "bytes": 20000}
        assert ("send" if pr["rank"] % 2 == 0 else "recv") in pr["ops"]
    assert doc["diagnoses"] == []


def test_a_bad_file_costs_one_line_and_the_rest_of_the_directory_loads(tmp_path, capsys):
    d = tmp_path / "dumps"
    shutil.copytree(DATA / "gloo_hang_json", d)
    (d / "fr_trace_0.json").write_text('{"version": "2.10", "entries": [')
    (d / "notes.txt").write_text("hello")
    doc = summary(capsys, d)
    assert [r["rank"] for r in doc["ranks"]] == [1, 2, 3]
    assert len(doc["problems"]) == 2
    assert any("fr_trace_0.json: not valid JSON" in p for p in doc["problems"])
    assert any("notes.txt: not a commviz trace, flight-recorder dump or profiler trace" in p for p in doc["problems"])


def test_a_pickle_that_would_run_code_is_refused_naming_the_file(tmp_path, capsys):
    d = tmp_path / "dumps"
    shutil.copytree(DATA / "gloo_hang_pickle", d)
    canary = tmp_path / "pwned"
    # what `pickle.dumps` makes of an object whose __reduce__ is (os.system, ("touch ...",))
    evil = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c" + \
        bytes([len(f"touch {canary}")]) + f"touch {canary}".encode() + b"\x94\x85\x94R\x94."
    (d / "nccl_trace_rank_2").write_bytes(evil)
    doc = summary(capsys, d)
    assert not canary.exists()
    (line,) = doc["problems"]
    assert "nccl_trace_rank_2: refused: opcode STACK_GLOBAL" in line
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 3]


def test_rank_from_file_names_and_the_rank_map():
    assert rank_from_name("/tmp/nccl_trace_rank_12", {}) == 12
    assert rank_from_name("fr_3.json", {}) == 3
    assert rank_from_name("trace_rank7.json.gz", {}) == 7
    assert rank_from_name("dump_a", {}) is None
    assert rank_from_name("/x/dump_a", parse_rank_map(["dump_a=4,dump_b=5"])) == 4
    with pytest.raises(ValueError, match="FILE=RANK"):
        parse_rank_map(["dump_a"])


def test_a_dump_whose_name_holds_no_rank_says_to_map_it(tmp_path, capsys):
    src = (DATA / "gloo_hang_json" / "fr_trace_1.json").read_bytes()
    (tmp_path / "left").write_bytes(src)
    assert cli.main(["summary", str(tmp_path / "left")]) == 2
    assert "--rank-map left=RANK" in capsys.readouterr().err
    doc = summary(capsys, tmp_path / "left", "--rank-map", "left=1")
    assert [r["rank"] for r in doc["ranks"]] == [1]


def test_ranks_strings_are_parsed_never_evaluated(tmp_path, capsys):
    dump = fr_dump([fr_entry(0, 1)], ranks=(0, 1))
    dump["pg_config"]["0"]["ranks"] = "__import__('os').system('false') or [0, 1]"
    (tmp_path / "fr_0.json").write_text(json.dumps(dump))
    doc = summary(capsys, tmp_path)
    assert any("members 0 inferred" in n for n in doc["notes"])  # ignored, inferred instead


def _write(d: Path, name: str, doc: dict) -> None:
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps(doc))


def test_nccl_dumps_every_desync_and_the_hang(tmp_path, capsys):
    r0 = [fr_entry(0, 1, t0=0), fr_entry(1, 2, t0=10_000), fr_entry(2, 3, t0=20_000),
          fr_entry(3, 4, t0=30_000, state="started"), fr_entry(4, 0, op="send 0->1", t0=40_000, numel=8, p2p_seq=1)]
    r1 = [fr_entry(0, 1, t0=0), fr_entry(1, 2, t0=10_000, numel=2048), fr_entry(2, 3, t0=20_000, dtype="BFloat16"),
          fr_entry(3, 0, op="recv 1<-0", t0=40_000, numel=8, p2p_seq=1)]
    _write(tmp_path, "nccl_trace_rank_0", fr_dump(r0))
    _write(tmp_path, "nccl_trace_rank_1", fr_dump(r1))
    doc = summary(capsys, tmp_path)
    desyncs = {(d["seq"], tuple(d.get("details", {}).get("fields", []))) for d in doc["diagnoses"] if d["kind"] == "desync"}
    assert {seq for seq, _ in desyncs} == {1, 2}  # size at #1, dtype at #2: both, not only the first
    d = hang_of(doc)
    assert (d["op"], d["seq"], d["waiting_ranks"], d["missing_ranks"]) == ("all_reduce", 3, [0], [1])
    assert doc["per_rank"][0]["ops"]["send"] == {"count": 1, "bytes": 32}
    assert doc["per_rank"][1]["ops"]["recv"] == {"count": 1, "bytes": 32}
    ar = [o for o in doc["ops"] if o["op"] == "all_reduce"]
    assert ar[0]["p50_us"] == 1.0  # completion times recorded: 1000 ns per op
    assert not any("does not record completion" in n for n in doc["notes"])


def test_nccl_profiler_traces_time_to_the_kernel_end(tmp_path, capsys):
    for rank in (0, 1):
        evs = []
        for k in range(3):
            evs += [rpc("allreduce", 100.0 * k, 5.0, 10 + k, rank, 1024, seq=k), kernel("AllReduce_Sum_f32", 100.0 * k + 4, 40.0, 10 + k)]
        evs.append(rpc("_allgather_base", 400.0, 5.0, 20, rank, 256, out_nelems=512, dtype="BFloat16", seq=3))
        evs.append(rpc("wait", 410.0, 1.0, 21, rank, 0))
        evs.append(rpc("send" if rank == 0 else "recv", 500.0, 3.0, 22, rank, 16, peer=1 - rank))
        _write(tmp_path, f"rank{rank}.json", profile(rank, evs))
    gz = tmp_path / "rank1.json.gz"
    gz.write_bytes(gzip.compress((tmp_path / "rank1.json").read_bytes()))
    (tmp_path / "rank1.json").unlink()
    doc = summary(capsys, tmp_path)
    rows = {o["op"]: o for o in doc["ops"]}
    assert (rows["all_reduce"]["count"], rows["all_reduce"]["bytes"]) == (3, 3 * 4096)
    assert rows["all_reduce"]["p50_us"] == 44.0  # call at 0 µs, kernel ends at 44 µs
    assert (rows["_all_gather_base"]["count"], rows["_all_gather_base"]["bytes"]) == (1, 1024)
    assert (rows["send"]["bytes"], rows["recv"]["bytes"]) == (64, 64)
    assert "wait" not in rows and doc["diagnoses"] == []


def test_a_real_nccl_profiler_trace_from_hta(capsys):
    doc = summary(capsys, DATA / "hta_nccl_rank0.json")
    rows = {o["op"]: o for o in doc["ops"]}
    assert rows["all_reduce"]["count"] == 2 and rows["all_reduce"]["bytes"] == (2049000 + 7875584) * 4
    assert rows["broadcast"]["count"] == 2 and rows["broadcast"]["bytes"] == 53120 * 4 + 53 * 8  # float32, then int64
    assert doc["world_size"] == 2 and doc["backend"] == "nccl"


def test_replay_and_export_open_the_same_files(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert cli.main(["export", str(DATA / "gloo_hang_json"), "--perfetto", str(out)]) == 0
    doc = json.loads(out.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert len(names) == 12 + 12 + 11 + 10  # every entry of every rank's recorder
    assert names.count("all_reduce #10") == 3  # the hung one, drawn on the ranks inside it
    loaded = open_trace(DATA / "gloo_profile")
    from commviz.tui.feed import ReplayFeed

    feed = ReplayFeed(loaded.batches)
    assert "0/" in feed.status()


def test_nothing_readable_is_an_error_naming_why(tmp_path):
    (tmp_path / "a").write_bytes(b"\x00\x01junk")
    with pytest.raises(TraceError, match="none of torch's files"):
        open_trace(tmp_path)
    with pytest.raises(TraceError, match="not a commviz trace, flight-recorder dump or profiler trace"):
        open_trace(tmp_path / "a")
