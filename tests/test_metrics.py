"""The Prometheus endpoint (`commviz/metrics.py`): exact counters per rank, group and
op, the age of an open hang, rank states, a label set that stays bounded at 1,024
ranks, and a real scrape over HTTP parsed as Prometheus parses it. No timing: every
value is computed from synthetic events at a given `now`."""

from __future__ import annotations

import socket
import sys
import os
import urllib.error
import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from commviz import metrics  # noqa: E402
from commviz.cli import main  # noqa: E402
from commviz.commands._live import metrics_addr  # noqa: E402
from commviz.errors import CommvizError  # noqa: E402
from commviz.events import GroupDef, OpEnd, OpStart  # noqa: E402
from commviz.model import Model  # noqa: E402
from tests.helpers import WALL0, hello  # noqa: E402

S = 1_000_000_000
MS = 1_000_000


class Job:
    """A model fed event by event; times are ns since the job's start (mono 0 = WALL0)."""

    def __init__(self, world: int, groups: dict[str, list[int]], **kw) -> None:
        self.m = Model(**kw)
        self.ids = [0] * world
        self.seqs: dict[tuple[int, str], int] = {}
        for r in range(world):
            self.m.ingest(r, hello(r, world=world))
        for gid, ranks in groups.items():
            for r in ranks:
                self.m.ingest(r, GroupDef(gid, list(ranks), "gloo"))

    def start(self, rank: int, t: int, op: str = "all_reduce", group: str = "0", nbytes: int = 4096,
              peer: int = -1) -> int:
        op_id = self.ids[rank]
        self.ids[rank] += 1
        seq = self.seqs.get((rank, group), 0)
        self.seqs[(rank, group)] = seq + 1
        self.m.ingest(rank, OpStart(op_id, t, op, group, seq, nbytes, "float32", [nbytes // 4], peer=peer))
        return op_id

    def op(self, rank: int, t0: int, t1: int, **kw) -> None:
        self.m.ingest(rank, OpEnd(self.start(rank, t0, **kw), t1))


def scrape(m: Model, now: int | None = None, labels: metrics.GroupLabels | None = None) -> dict:
    """{(sample name, sorted labels): value} of one reading of `m`."""
    labels = labels if labels is not None else metrics.GroupLabels()
    fams = metrics.families(metrics.read_model(m, labels, now), labels)
    out = {}
    for fam in fams:
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key  # one value per series
            out[key] = s.value
    return out


def series(got: dict, name: str) -> dict:
    return {lab: v for (n, lab), v in got.items() if n == name}


def L(**kw) -> tuple:
    return tuple(sorted(kw.items()))


def test_counters_are_the_models_exact_counts_per_rank_group_and_op():
    j = Job(2, {"0": [0, 1], "tp": [0, 1]})
    for i in range(3):
        for r in (0, 1):
            j.op(r, i * MS, i * MS + 100_000 * (r + 1), nbytes=4096)
    for i in range(2):
        for r in (0, 1):
            j.op(r, 10 * MS + i * MS, 10 * MS + i * MS + 50_000, op="broadcast", group="tp", nbytes=1000)
    j.op(0, 20 * MS, 20 * MS + 10_000, op="send", peer=1, nbytes=64)
    j.op(1, 20 * MS, 20 * MS + 20_000, op="recv", peer=0, nbytes=64)
    j.op(0, 30 * MS, 30 * MS + 1000, op="my_custom_op", nbytes=8)  # a name the catalogue does not know
    got = scrape(j.m)

    calls = series(got, "commviz_collective_calls_total")
    assert calls == {
        L(rank="0", group="0", op="all_reduce"): 3, L(rank="1", group="0", op="all_reduce"): 3,
        L(rank="0", group="tp", op="broadcast"): 2, L(rank="1", group="tp", op="broadcast"): 2,
        L(rank="0", group="0", op="send"): 1, L(rank="1", group="0", op="recv"): 1,
        L(rank="0", group="0", op="other"): 1,
    }
    nbytes = series(got, "commviz_collective_bytes_total")
    assert nbytes[L(rank="1", group="0", op="all_reduce")] == 3 * 4096
    assert nbytes[L(rank="0", group="tp", op="broadcast")] == 2000
    assert nbytes[L(rank="0", group="0", op="other")] == 8
    # the same counts as the summary's per-rank table
    per_rank = {row["rank"]: row["ops"] for row in j.m.summary()["per_rank"]}
    for rank in (0, 1):
        assert sum(v for lab, v in calls.items() if dict(lab)["rank"] == str(rank)) == \
            sum(o["count"] for o in per_rank[rank].values())

    # per op and group: instances once each, latency p50/p99 as the summary has them,
    # sum and count exact
    inst = series(got, "commviz_op_instances_total")
    assert inst[L(group="0", op="all_reduce")] == 3 and inst[L(group="tp", op="broadcast")] == 2
    lat = series(got, "commviz_op_latency_seconds")
    row = next(o for o in j.m.summary()["ops"] if o["op"] == "all_reduce")
    assert lat[L(group="0", op="all_reduce", quantile="0.5")] == pytest.approx(row["p50_us"] / 1e6)
    assert lat[L(group="0", op="all_reduce", quantile="0.99")] == pytest.approx(row["p99_us"] / 1e6)
    assert series(got, "commviz_op_latency_seconds_count")[L(group="0", op="all_reduce")] == 3
    # each instance's time is its shortest rank-side duration: rank 0's 100 µs
    assert series(got, "commviz_op_latency_seconds_sum")[L(group="0", op="all_reduce")] == pytest.approx(3e-4)
    # and every timed instance in its latency bucket, exactly (a bound is inclusive)
    hist = series(got, "commviz_op_duration_seconds_bucket")
    assert hist[L(group="0", op="all_reduce", le="5e-05")] == 0
    assert hist[L(group="0", op="all_reduce", le="0.0001")] == 3  # 100 µs: in the 100 µs bucket
    assert hist[L(group="0", op="all_reduce", le="+Inf")] == 3
    assert hist[L(group="tp", op="broadcast", le="2.5e-05")] == 0
    assert hist[L(group="tp", op="broadcast", le="5e-05")] == 2
    assert series(got, "commviz_op_duration_seconds_count")[L(group="0", op="all_reduce")] == 3
    assert series(got, "commviz_op_duration_seconds_sum")[L(group="0", op="all_reduce")] == pytest.approx(3e-4)
    les = [float(dict(lab)["le"]) for lab in hist if dict(lab)["op"] == "all_reduce"]
    assert les == sorted(les) and les[0] == 1e-5 and les[-2] == 60.0  # 10 µs to a minute, then +Inf

    states = series(got, "commviz_rank_state")
    assert states[L(rank="0", state="ok")] == 1 and states[L(rank="0", state="hung")] == 0
    assert len(states) == 2 * 6
    assert series(got, "commviz_events_total") == {(): j.m.events}
    assert series(got, "commviz_hang_age_seconds") == {}


def test_an_open_hang_has_its_age_and_the_ranks_their_states():
    j = Job(3, {"0": [0, 1, 2]}, hang_after_s=10.0)
    for r in range(3):
        j.op(r, 0, MS)
    j.start(0, 1 * S)
    j.start(1, 1 * S + 500 * MS)  # rank 2 never enters all_reduce #1
    got = scrape(j.m, now=WALL0 + 13 * S)
    assert series(got, "commviz_hang_age_seconds") == {
        L(kind="hang", group="0", op="all_reduce", seq="1"): pytest.approx(12.0),
    }
    [d] = j.m.diagnoses(WALL0 + 13 * S)
    assert d["kind"] == "hang" and d["missing_ranks"] == [2]
    states = {dict(lab)["rank"]: dict(lab)["state"] for lab, v in series(got, "commviz_rank_state").items() if v}
    assert states == {"0": "hung", "1": "hung", "2": "missing"}
    ranks = series(got, "commviz_ranks")
    assert ranks[L(state="hung")] == 2 and ranks[L(state="missing")] == 1 and ranks[L(state="ok")] == 0
    assert series(got, "commviz_diagnoses")[L(kind="hang")] == 1
    # before the threshold: waiting, and no hang
    early = scrape(j.m, now=WALL0 + 5 * S)
    assert series(early, "commviz_hang_age_seconds") == {}
    assert series(early, "commviz_ranks")[L(state="waiting")] == 2


def test_the_label_set_stays_bounded_at_1024_ranks():
    """1,024 ranks: a world group, 128 tensor-parallel groups of 8 and 8 data-parallel
    groups of 128 (137 groups). Each rank's series are its (op, group) pairs; groups
    past the 16 busiest share "other", and the totals stay exact."""
    world = 1024
    groups = {"world": list(range(world))}
    groups |= {f"tp{i}": list(range(8 * i, 8 * i + 8)) for i in range(128)}
    groups |= {f"dp{i}": list(range(i, world, 8)) for i in range(8)}
    j = Job(world, groups, flows=False)
    for r in range(world):
        tp, dp = f"tp{r // 8}", f"dp{r % 8}"
        # tp groups move different amounts, so "the busiest" is well defined
        j.op(r, 0, 1000, group=tp, nbytes=1024 * (r // 8 + 1))
        j.op(r, 2000, 3000, group=tp, nbytes=1024 * (r // 8 + 1))
        j.op(r, 4000, 5000, op="all_gather_into_tensor", group=dp, nbytes=1 << 20)
        j.op(r, 6000, 7000, op="barrier", group="world", nbytes=0)
    labels = metrics.GroupLabels()
    got = scrape(j.m, labels=labels)

    calls = series(got, "commviz_collective_calls_total")
    assert len(calls) <= world * 3  # a rank's (op, group) pairs; none per other rank or group
    used = {dict(lab)["group"] for lab in calls}
    assert len(used) <= metrics.MAX_GROUPS + 1 and "other" in used
    # the 16 busiest by bytes: the 8 dp groups (128 MiB each) and the 8 busiest tp groups
    assert labels.named == {f"dp{i}" for i in range(8)} | {f"tp{i}" for i in range(120, 128)}
    assert sum(calls.values()) == 4 * world  # exact, "other" included
    total = sum(r.bytes_done for r in j.m.ranks.values())
    assert sum(series(got, "commviz_collective_bytes_total").values()) == total
    assert len(series(got, "commviz_rank_state")) == world * 6
    per_op = series(got, "commviz_op_instances_total")
    assert len(per_op) <= 3 * (metrics.MAX_GROUPS + 1)
    assert len(got) < 16_000  # the whole scrape: 1,024 ranks x (3 + 6 + 1) series, and the rest

    # a busier group that comes later joins "other" (no room): labels are kept, and
    # every counter only grows
    for r in range(8):
        j.op(r, 10_000, 11_000, group="late", nbytes=1 << 30)
    j.m.ingest(0, GroupDef("late", list(range(8)), "gloo"))
    again = scrape(j.m, labels=labels)
    assert "late" not in labels.named
    after = series(again, "commviz_collective_calls_total")
    assert all(after[k] >= v for k, v in calls.items())
    assert after[L(rank="0", group="other", op="all_reduce")] == calls[L(rank="0", group="other", op="all_reduce")] + 1


def test_the_batch_path_counts_per_group_as_one_event_at_a_time():
    events = []
    for r in range(4):
        events += [(r, hello(r, world=4)), (r, GroupDef("0", [0, 1, 2, 3], "gloo")),
                   (r, GroupDef("pair", [0, 1] if r < 2 else [2, 3], "gloo"))]
    for i in range(500):
        for r in range(4):
            g = "pair" if i % 3 == 0 else "0"
            seq = i // 3 if g == "pair" else i - i // 3 - 1
            events += [(r, OpStart(i, 1000 * i + r, "all_reduce" if g == "0" else "broadcast", g, seq, 64 + i)),
                       (r, OpEnd(i, 1000 * i + 900))]
    one, many = Model(flows=False), Model(flows=False)
    for r, ev in events:
        one.ingest(r, ev)
    many.ingest([r for r, _ in events], [ev for _, ev in events])
    for rank in range(4):
        assert many.ranks[rank].per_group == one.ranks[rank].per_group
        assert sum(c for c, _ in one.ranks[rank].per_group.values()) == one.ranks[rank].ops_done == 500
    assert scrape(many) == scrape(one)


def test_the_endpoint_serves_what_prometheus_parses():
    j = Job(2, {"0": [0, 1]})
    for i in range(5):
        for r in (0, 1):
            j.op(r, i * MS, i * MS + 200_000, nbytes=256)
    collector = metrics.CommvizCollector(lambda labels: metrics.read_model(j.m, labels))
    server = metrics.serve(collector, "127.0.0.1", 0)
    try:
        assert server.port != 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            text = resp.read().decode()
    finally:
        server.close()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    calls = {(s.labels["rank"], s.labels["group"], s.labels["op"]): s.value
             for s in fams["commviz_collective_calls"].samples}
    assert fams["commviz_collective_calls"].type == "counter"
    assert calls == {("0", "0", "all_reduce"): 5.0, ("1", "0", "all_reduce"): 5.0}
    lat = fams["commviz_op_latency_seconds"]
    assert lat.type == "summary"
    assert {s.labels.get("quantile") for s in lat.samples if s.name == "commviz_op_latency_seconds"} == {"0.5", "0.99"}
    dur = fams["commviz_op_duration_seconds"]
    assert dur.type == "histogram"
    assert {s.labels["le"]: s.value for s in dur.samples if s.name.endswith("_bucket")}["0.00025"] == 5.0
    assert fams["commviz_rank_state"].type == "gauge"
    assert "process_cpu_seconds" in fams or sys.platform != "linux"  # the collector's own CPU


def test_a_port_that_is_taken_names_the_fix():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        collector = metrics.CommvizCollector(lambda labels: metrics.read_model(Model(), labels))
        with pytest.raises(CommvizError, match=f"port {port} is taken.*pick another"):
            metrics.serve(collector, "127.0.0.1", port)


def test_read_feed_takes_a_live_feeds_model_and_lag(tmp_path):
    from commviz.watcher import LiveFeed

    d = tmp_path / "commviz-t"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock").start()
    try:
        with feed.lock:
            for r in (0, 1):
                feed.model.ingest(r, hello(r))
                feed.model.ingest(r, GroupDef("0", [0, 1], "gloo"))
                feed.model.ingest(r, OpStart(0, 0, "all_reduce", "0", 0, 64))
                feed.model.ingest(r, OpEnd(0, 1000))
        feed.overload.lag_ns = 3 * S
        got = {}
        for fam in metrics.feed_collector(feed).collect():
            for s in fam.samples:
                got[(s.name, tuple(sorted(s.labels.items())))] = s.value
        assert series(got, "commviz_collective_calls_total") == {
            L(rank="0", group="0", op="all_reduce"): 1, L(rank="1", group="0", op="all_reduce"): 1}
        assert series(got, "commviz_ingest_lag_seconds") == {(): 3.0}
        assert series(got, "commviz_ingest_shedding") == {(): 0.0}
        assert series(got, "commviz_ingest_shed_frames_total") == {(): 0}
        feed.metrics_url = "http://127.0.0.1:9/metrics"
        assert "metrics http://127.0.0.1:9/metrics" in feed.status()

        # `commviz serve --http` answers /metrics from the same collector; on loopback
        # with no token, as the --metrics endpoint does, while its views want one
        from commviz.httpview import StateServer

        http = StateServer(feed, "127.0.0.1", 0, extra=metrics.http_view(feed), loopback_token="sesame").start()
        try:
            with urllib.request.urlopen(f"{http.url}/metrics", timeout=30) as resp:
                text = resp.read().decode()
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(f"{http.url}/summary", timeout=30)
        finally:
            http.close()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert sum(s.value for s in fams["commviz_collective_calls"].samples) == 2
    finally:
        feed.close()


@pytest.mark.parametrize("text, want", [
    ("9400", ("127.0.0.1", 9400)), (":9400", ("127.0.0.1", 9400)), ("0.0.0.0:9400", ("0.0.0.0", 9400)),
    ("localhost:0", ("localhost", 0)), ("[::1]:9400", ("::1", 9400)),
])
def test_metrics_addresses(text, want):
    assert metrics_addr(text) == want


def test_a_bad_metrics_address_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["record", "-o", str(tmp_path / "t.cvz"), "--metrics", "host:port", "--", "true"])
    assert "is not HOST:PORT or PORT" in capsys.readouterr().err


def test_record_metrics_on_a_taken_port_fails_before_the_job(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        marker = tmp_path / "ran"
        assert main(["record", "-o", str(tmp_path / "t.cvz"), "--metrics", f"127.0.0.1:{port}", "--",
                     "touch", str(marker)]) == 2
    assert f"port {port} is taken" in capsys.readouterr().err
    assert not marker.exists()


def test_without_prometheus_client_the_flag_says_what_to_install(monkeypatch):
    import commviz
    from commviz.commands._live import start_metrics

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "commviz.metrics")
    monkeypatch.delattr(commviz, "metrics")
    with pytest.raises(CommvizError, match=r"pip install 'commviz\[metrics\]'"):
        start_metrics(("127.0.0.1", 0), feed=None)


def test_the_grafana_dashboard_asks_only_for_metrics_the_endpoint_has():
    import json
    import pathlib
    import re

    doc = json.loads((pathlib.Path(__file__).parent.parent / "docs" / "grafana" / "commviz.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    asked = {name for e in exprs for name in re.findall(r"\bcommviz_[a-z_]+", e)}
    j = Job(3, {"0": [0, 1, 2]})
    for r in range(3):
        j.op(r, 0, MS)
    j.start(0, 2 * MS)  # and a hang
    labels = metrics.GroupLabels()
    reading = metrics.read_model(j.m, labels, WALL0 + 20 * S, metrics.IngestCounts())
    have = {s.name for fam in metrics.families(reading, labels) for s in fam.samples}
    assert asked and asked <= have, asked - have


def test_watch_serves_metrics_while_the_dashboard_runs_and_stops_after(tmp_path, monkeypatch):
    from commviz.commands import watch as watch_cmd

    d = tmp_path / "commviz-t"
    d.mkdir(mode=0o700)
    seen = {}

    def fake_app(feed, title, job=None, topology=None, simulate=False):
        from commviz.viewlink import ViewQuery

        seen["status"] = feed.fetch(ViewQuery()).status  # the status line the dashboard draws
        seen["collector"] = feed.collector.proc
        with urllib.request.urlopen(feed.metrics_url, timeout=30) as resp:
            seen["text"] = resp.read().decode()
        feed.close()
        return 0

    monkeypatch.setattr(watch_cmd, "run_app", fake_app)
    assert main(["watch", "--listen", f"ipc://{d}/w.sock", "--metrics", "127.0.0.1:0"]) == 0
    assert "metrics http://127.0.0.1:" in seen["status"] and seen["status"].startswith("listening on ipc://")
    assert seen["collector"].pid != os.getpid() and seen["collector"].poll() is not None  # its own process, gone
    names = {f.name for f in text_string_to_metric_families(seen["text"])}
    assert {"commviz_events", "commviz_ranks", "commviz_ingest_lag_seconds"} <= names
    url = seen["status"].split("metrics ", 1)[1].split(" ", 1)[0]
    with pytest.raises(OSError):  # the endpoint is closed with the dashboard
        urllib.request.urlopen(url, timeout=30)
