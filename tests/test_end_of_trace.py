"""`summary` and `replay` read a trace through the same model and the same end-of-trace
rule: on a trace cut off after a rank was killed they name the same ranks dead and
give the same diagnoses."""

import json

from commviz.cli import main
from commviz.events import Counters, OpStart, encode_batch
from commviz.trace.file import LEN, TraceWriter, load
from commviz.tui.feed import ReplayFeed
from tests.helpers import group, hello, op
from tests.tui.helpers import FakeClock

MS = 1_000_000
S = 1_000_000_000


def killed_rank_trace(path):
    """Three ranks; rank 2 is killed after all_reduce #1, ranks 0 and 1 wait in #2
    for 5 s (heartbeats), then the job is killed and the file cut mid-frame."""
    w = TraceWriter(path)
    for r in (0, 1, 2):  # file order is rank by rank, not time order
        w.write(encode_batch(r, [hello(r, world=3), group("0", (0, 1, 2))]))
        w.write(encode_batch(r, op(0, 0, MS) + op(1, 10 * MS, 11 * MS, seq=1)))
        if r < 2:
            w.write(encode_batch(r, [OpStart(2, 20 * MS, "all_reduce", "0", 2, 4096, "float32", [1024])]
                                 + [Counters(k * S) for k in range(1, 6)]))
    w.close()
    with open(path, "ab") as f:
        f.write(LEN.pack(100) + b"\x93\x01")  # a frame the killed writer never finished


def test_summary_and_replay_agree_on_a_killed_rank(tmp_path, capsys):
    p = tmp_path / "killed.cvz"
    killed_rank_trace(p)
    assert main(["summary", str(p), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)

    loaded = load(p)
    assert loaded.truncated
    clock = FakeClock()
    feed = ReplayFeed(loaded.batches, clock=clock, cut_off=loaded.truncated)
    feed.set_speed(16)
    while not feed.done:
        clock.tick(1.0)
        feed.advance()
    replay = feed.model.summary(feed.now_ns())

    assert [r["status"] for r in replay["ranks"]] == [r["status"] for r in summary["ranks"]] == ["dead"] * 3
    assert [feed.model.ranks[r].gone_reason for r in (0, 1, 2)] == ["trace cut off"] * 3
    assert replay["diagnoses"] == summary["diagnoses"]
    [d] = summary["diagnoses"]
    assert (d["kind"], d["op"], d["seq"], d["waiting_ranks"], d["missing_ranks"]) == (
        "dead_rank", "all_reduce", 2, [0, 1], [2])
