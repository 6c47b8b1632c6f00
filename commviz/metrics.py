"""Prometheus metrics of a live collector (`commviz watch|record --metrics HOST:PORT`).

A custom collector (`CommvizCollector`) reads one copy of the model per scrape
(`read_feed`: `Model.metrics_view` and `Model.op_percentiles_ns` under the feed's
view lock, as a dashboard snapshot is taken, plus the feed's lag and shed counts),
then turns it into metric families outside the lock (`families`, pure). `serve` is
the HTTP part: prometheus_client's `start_http_server` on a daemon thread, bound to
127.0.0.1 unless a host is given; `http_view` hands the same exposition to another
server (`commviz serve --http`). At 1,024 ranks the lock is held 12-26 ms a scrape
(`findings` once, as a dashboard snapshot runs it, and copies); mapping and text
formatting, ~0.2-0.6 s of CPU for ~13k series on 2 busy cores, happen after it.

Metrics (counters are exact: they come from the model's counts, which overload
never sheds):

  commviz_collective_calls_total{rank,group,op}   ops the rank ended
  commviz_collective_bytes_total{rank,group,op}   their bytes (S as nccl-tests counts it)
  commviz_op_instances_total{group,op}            instances folded into the statistics
                                                  (a collective once, a p2p op once per end)
  commviz_op_errors_total{group,op}               of those, ended with an error
  commviz_op_latency_seconds{group,op,quantile}   summary: p50/p99 (quantile 0.5, 0.99) of the
                                                  instance time, as `commviz summary` gives them;
                                                  _sum and _count exact over the timed instances
  commviz_op_duration_seconds{group,op,le}        histogram of the same instance times, every
                                                  timed instance counted in its bucket (10 µs
                                                  to 60 s, 1-2.5-5 a decade): exact, so it adds
                                                  up across collectors and `histogram_quantile`
                                                  reads it
  commviz_rank_state{rank,state}                  1 for the rank's state, 0 for the others
                                                  (ok, waiting, hung, missing, dead, exited)
  commviz_ranks{state}                            ranks in each state
  commviz_rank_dropped_events_total{rank}         events the rank's probe had to drop
  commviz_hang_age_seconds{kind,group,op,seq}     open hangs (hang, p2p_deadlock, dead_rank):
                                                  how long their ranks have waited
  commviz_diagnoses{kind}                         diagnoses now, stragglers included
  commviz_events_total                            events ingested
  commviz_ingest_lag_seconds                      now minus the newest event (as of the newest batch)
  commviz_ingest_shedding                         1 while per-event detail is shed
  commviz_ingest_shed_spells_total                times shedding began
  commviz_ingest_shed_instances_total             collectives folded in untimed while shedding
  commviz_ingest_shed_frames_total                valid frames the server turned away (flood, full queue)
  commviz_ingest_probe_behind_events_total        events the probes left out while the collector took none
  commviz_ingest_read_pauses_total                times reading waited for room in the model's queue
  commviz_ingest_bad_frames_total                 frames that failed to decode
  commviz_connections_refused_total{reason}       token, limit
  commviz_job_info{job,backend}, commviz_world_size, commviz_group_size{group,name}

Two latency families: the summary's p50/p99 come from each (op, group)'s uniform
reservoir (65,536 samples, `model/stats.py`), the figures `commviz summary` prints,
which cannot be added up across collectors or relabelled rows; the histogram's
buckets are counted on the ingest path (`OpStats.add`, which the batch path's
`ledger.fold_fast` calls too), one per timed instance, so they only grow. While
shedding, instances are folded in untimed (`commviz_ingest_shed_instances_total`)
and neither family moves.

Cardinality, bounded at 1,024 ranks and beyond:
- `op` is a catalogue name (`commviz/ops.py`, 57 today) or "other" for a name the
  catalogue does not know.
- `group` is one of at most `MAX_GROUPS` (16) groups or "other". A group gets its own
  label at the first scrape where it has ended ops, while there is room, the busiest
  by bytes first, and keeps it for the job: a group never moves in or out of "other",
  so every counter only grows (a new job starts afresh).
- so the per-rank series are at most ranks x (ops + 1) x (MAX_GROUPS + 1), and in
  practice ranks x the (op, group) pairs a rank uses: a 1,024-rank job whose ranks
  each run 3 ops, each on a group of its own (tensor-parallel, data-parallel, world:
  137 groups), exposes 6,144 call and byte series, 6,144 rank states and 1,024 drop
  counters, ~13,900 series in all with the latency histogram's (tests/test_metrics.py
  holds it under 16,000); the per-op families at most (ops + 1) x (MAX_GROUPS + 1)
  rows, the histogram 24 series a row (21 bounds, +Inf, _sum, _count).
- `commviz_hang_age_seconds` names each hang's exact group and seq, at most
  `MAX_HANGS` (32) of them, the longest waits first.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
                                             SummaryMetricFamily)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from commviz import ops as opcat
from commviz.errors import CommvizError
from commviz.model.diagnosis import Kind, RankStatus
from commviz.model.scrape import MetricsView
from commviz.model.stats import BUCKETS_NS
from commviz.view.ingest import IngestCounts

DEFAULT_HOST = "127.0.0.1"
MAX_GROUPS = 16
MAX_HANGS = 32
OTHER = "other"
QUANTILES = ((0.5, 50), (0.99, 99))  # (the label's value, the model's percentile)
# the dashboard's six words, in its order of severity (worst first)
STATES = tuple(sorted(RankStatus, key=lambda s: s.severity))


@dataclass(frozen=True)
class Reading:
    """One scrape's copy: the model's view, the percentiles of the rows shown, and the
    feed's ingest counts (None for a bare model)."""

    view: MetricsView
    percentiles: dict[tuple[str, str], tuple[int, ...]]
    ingest: IngestCounts | None = None


class GroupLabels:
    """Which groups get a label of their own (the rest are "other"): at most
    `max_groups`, each given one at the first scrape where it has ended ops while
    there is room, the busiest by bytes first, kept until the job changes. Sticky, so
    a counter summed under "other" never loses a group and never goes down."""

    def __init__(self, max_groups: int = MAX_GROUPS) -> None:
        self.max_groups = max_groups
        self.job = ""
        self.named: set[str] = set()

    def update(self, job: str, group_bytes: dict[str, int]) -> frozenset[str]:
        if job != self.job:
            self.job, self.named = job, set()
        room = self.max_groups - len(self.named)
        if room > 0:
            new = [g for g in group_bytes if g not in self.named]
            new.sort(key=lambda g: (-group_bytes[g], g))
            self.named.update(new[:room])
        return frozenset(self.named)

    def label(self, group: str) -> str:
        return group if group in self.named else OTHER


def op_label(op: str) -> str:
    """A catalogue name as it is; any other name (from the wire) as "other"."""
    return op if op in opcat.CATALOGUE else OTHER


def group_bytes(view: MetricsView) -> dict[str, int]:
    """Bytes per group over every rank's ended ops (a group with ops and no bytes: 0)."""
    out: dict[str, int] = {}
    for r in view.ranks:
        for (_, group), (_, nbytes) in r.calls.items():
            out[group] = out.get(group, 0) + nbytes
    return out


# ----------------------------------------------------------------- reading


def read_model(model, labels: GroupLabels, now: int | None = None, ingest: IngestCounts | None = None) -> Reading:
    """Call with the model's lock held (a bare model in a test needs none): the
    view, the label choice it implies, and the percentiles of the rows that keep
    their own labels (one sort each), nothing else."""
    view = model.metrics_view(now)
    named = labels.update(view.job, group_bytes(view))
    keys = [(o.op, o.group) for o in view.ops if o.timed and o.group in named and o.op in opcat.CATALOGUE]
    return Reading(view, model.op_percentiles_ns(keys, [q for _, q in QUANTILES]), ingest)


def read_feed(feed, labels: GroupLabels) -> Reading:
    """A `LiveFeed`'s reading, taken as the dashboard takes its snapshot: the frames
    that waited the drain interval put in, the younger left queued; then the model
    read under its lock, once."""
    feed.drain_due()
    with feed.lock:
        return read_model(feed.model, labels, feed.now_ns(), feed.ingest_counts())


# ----------------------------------------------------------------- mapping


def families(reading: Reading, labels: GroupLabels) -> list[Metric]:
    """The metric families of one reading (pure: no lock, no model)."""
    return (_call_families(reading, labels) + _op_families(reading, labels) + _rank_families(reading)
            + _hang_families(reading) + _ingest_families(reading) + _job_families(reading, labels))


def _call_families(reading: Reading, labels: GroupLabels) -> list[Metric]:
    """The exact per-rank counters: calls and bytes by (rank, group, op)."""
    v = reading.view
    calls = CounterMetricFamily("commviz_collective_calls_total", "Ops each rank ended, per group and op.",
                                labels=["rank", "group", "op"])
    nbytes = CounterMetricFamily("commviz_collective_bytes_total",
                                 "Bytes of the ops each rank ended (S as nccl-tests counts it), per group and op.",
                                 labels=["rank", "group", "op"], unit="bytes")
    for r in v.ranks:
        cells: dict[tuple[str, str], list[int]] = {}
        for (op, group), (c, b) in r.calls.items():
            cell = cells.setdefault((labels.label(group), op_label(op)), [0, 0])
            cell[0] += c
            cell[1] += b
        rank = str(r.rank)
        for (group, op), (c, b) in sorted(cells.items()):
            calls.add_metric([rank, group, op], c)
            nbytes.add_metric([rank, group, op], b)
    return [calls, nbytes]


def _rank_families(reading: Reading) -> list[Metric]:
    """Each rank's state and drops, and the count of ranks in each state."""
    v = reading.view
    state = GaugeMetricFamily("commviz_rank_state", "1 for the state each rank is in, 0 for the others.",
                              labels=["rank", "state"])
    counts = {s: 0 for s in STATES}
    dropped = CounterMetricFamily("commviz_rank_dropped_events_total", "Events the rank's probe had to drop.",
                                  labels=["rank"])
    for r in v.ranks:
        rank = str(r.rank)
        counts[r.status] += 1
        for s in STATES:
            state.add_metric([rank, s.value], 1.0 if r.status is s else 0.0)
        dropped.add_metric([rank], r.dropped)
    ranks = GaugeMetricFamily("commviz_ranks", "Ranks in each state.", labels=["state"])
    for s in STATES:
        ranks.add_metric([s.value], counts[s])
    return [state, ranks, dropped]


def _hang_families(reading: Reading) -> list[Metric]:
    """Open hangs with their age (the longest waits first, at most MAX_HANGS), and the
    diagnoses by kind."""
    v = reading.view
    age = GaugeMetricFamily("commviz_hang_age_seconds",
                            "Open hangs (hang, p2p_deadlock, dead_rank): how long their ranks have waited.",
                            labels=["kind", "group", "op", "seq"])
    for h in sorted(v.hangs, key=lambda h: (-h.age_ns, h.kind.order, h.group, h.seq))[:MAX_HANGS]:
        age.add_metric([h.kind.value, h.group, h.op, str(h.seq)], h.age_ns / 1e9)
    diags = GaugeMetricFamily("commviz_diagnoses", "Diagnoses now, by kind.", labels=["kind"])
    for k in Kind:
        diags.add_metric([k.value], v.diagnoses.get(k.value, 0))
    return [age, diags]


def _ingest_families(reading: Reading) -> list[Metric]:
    """Events taken, and keeping up: lag and shedding (the feed's counts where a live
    feed is read, the model's own flag otherwise)."""
    v = reading.view
    out: list[Metric] = [
        CounterMetricFamily("commviz_events_total", "Events ingested.", value=v.events),
        CounterMetricFamily("commviz_ingest_shed_instances_total",
                            "Collectives folded in untimed while shedding detail.", value=v.shed_ops),
        CounterMetricFamily("commviz_ingest_bad_frames_total", "Frames or rings that failed to decode.",
                            value=v.decode_errors),
    ]
    ing = reading.ingest
    shedding = ing.shedding if ing is not None else v.shed
    out.append(GaugeMetricFamily("commviz_ingest_shedding", "1 while per-event detail is shed.",
                                 value=1.0 if shedding else 0.0))
    if ing is not None:
        out.append(GaugeMetricFamily("commviz_ingest_lag_seconds",
                                     "Now minus the newest event's time, as of the newest batch.", value=ing.lag_s))
        out.append(CounterMetricFamily("commviz_ingest_shed_spells_total", "Times shedding began.",
                                       value=ing.shed_spells))
        out.append(CounterMetricFamily("commviz_ingest_shed_frames_total",
                                       "Valid frames the server turned away (over the rate, queue full).",
                                       value=ing.shed_frames))
        out.append(CounterMetricFamily("commviz_ingest_probe_behind_events_total",
                                       "Events the probes left out while the collector took none from them "
                                       "(their credit window full).", value=ing.probe_behind_events))
        out.append(CounterMetricFamily("commviz_ingest_read_pauses_total",
                                       "Times the collector stopped reading for a while, its queue to the "
                                       "model full (frames wait at the ranks meanwhile).", value=ing.read_pauses))
        refused = CounterMetricFamily("commviz_connections_refused_total", "Connections refused.",
                                      labels=["reason"])
        refused.add_metric(["token"], ing.refused_token)
        refused.add_metric(["limit"], ing.refused_limit)
        out.append(refused)
    return out


def _job_families(reading: Reading, labels: GroupLabels) -> list[Metric]:
    """The job, its world size and its labelled groups' sizes."""
    v = reading.view
    info = GaugeMetricFamily("commviz_job_info", "The job being watched.", labels=["job", "backend"])
    if v.job:
        info.add_metric([v.job, v.backend], 1.0)
    size = GaugeMetricFamily("commviz_group_size", "Ranks in each group with a label of its own.",
                             labels=["group", "name"])
    for gid in sorted(labels.named):
        name, n = v.groups.get(gid, ("", 0))
        size.add_metric([gid, name], n)
    return [info, GaugeMetricFamily("commviz_world_size", "The job's world size.", value=v.world_size), size]


def _op_families(reading: Reading, labels: GroupLabels) -> list[Metric]:
    v = reading.view
    # (group, op) labels -> [count, errors, timed, time_ns, model keys, bucket counts]
    rows: dict[tuple[str, str], list] = {}
    for o in v.ops:
        row = rows.setdefault((labels.label(o.group), op_label(o.op)), [0, 0, 0, 0, [], [0] * (len(BUCKETS_NS) + 1)])
        row[0] += o.count
        row[1] += o.errors
        row[2] += o.timed
        row[3] += o.time_ns
        row[4].append((o.op, o.group))
        for i, n in enumerate(o.hist):  # buckets add up: a merged row ("other") is the sum of its parts
            row[5][i] += n
    inst = CounterMetricFamily("commviz_op_instances_total",
                               "Instances folded into the statistics (a collective once, a p2p op once per end).",
                               labels=["group", "op"])
    errs = CounterMetricFamily("commviz_op_errors_total", "Instances that ended with an error.",
                               labels=["group", "op"])
    lat = SummaryMetricFamily("commviz_op_latency_seconds",
                              "Instance time (the shortest rank-side duration, device time where measured): "
                              "p50/p99 of a bounded sample, exact sum and count.",
                              labels=["group", "op"])
    dur = HistogramMetricFamily("commviz_op_duration_seconds",
                                "Instance time (as commviz_op_latency_seconds), every timed instance counted in "
                                "its bucket.", labels=["group", "op"])
    for (group, op), (count, errors, timed, time_ns, keys, hist) in sorted(rows.items()):
        inst.add_metric([group, op], count)
        errs.add_metric([group, op], errors)
        # a label row that is one model row has its percentiles; a merged one ("other")
        # has no quantile that can be told from its parts
        pct = reading.percentiles.get(keys[0]) if len(keys) == 1 else None
        if pct is not None:
            for (label, _), ns in zip(QUANTILES, pct):
                lat.add_sample("commviz_op_latency_seconds", {"group": group, "op": op, "quantile": str(label)},
                               ns / 1e9)
        lat.add_metric([group, op], timed, time_ns / 1e9)
        cum, buckets = 0, []
        for bound, n in zip((*(b / 1e9 for b in BUCKETS_NS), float("inf")), hist):
            cum += n
            buckets.append((floatToGoString(bound), cum))
        dur.add_metric([group, op], buckets, time_ns / 1e9)
    return [inst, errs, lat, dur]


class CommvizCollector(Collector):
    """prometheus_client's custom collector: each `collect()` takes one reading
    (`read(labels)`, e.g. `read_feed` bound to a feed) and maps it. Scrapes that come
    at once take turns (the group labels are one state)."""

    def __init__(self, read: Callable[[GroupLabels], Reading], max_groups: int = MAX_GROUPS) -> None:
        self._read = read
        self.labels = GroupLabels(max_groups)
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            reading = self._read(self.labels)
            return families(reading, self.labels)

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not scrape the model


def feed_collector(feed, max_groups: int = MAX_GROUPS) -> CommvizCollector:
    return CommvizCollector(lambda labels: read_feed(feed, labels), max_groups)


# ----------------------------------------------------------------- serving


@dataclass
class MetricsServer:
    host: str
    port: int
    _server: object = None  # serving.server.HttpServer

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def registry_of(collector: Collector, process: bool = True) -> CollectorRegistry:
    """A registry of its own (not prometheus_client's global one) holding the
    collector, and the process's CPU and memory (`process`)."""
    from prometheus_client import ProcessCollector

    registry = CollectorRegistry()
    registry.register(collector)
    if process:
        ProcessCollector(registry=registry)
    return registry


def http_view(feed) -> dict:
    """`/metrics` for another HTTP server on the same feed (`commviz serve --http`):
    path -> (content type, () -> the exposition's bytes)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    registry = registry_of(feed_collector(feed))
    return {"/metrics": (CONTENT_TYPE_LATEST, lambda: generate_latest(registry))}


def listen_socket(host: str, port: int):
    """`--metrics HOST:PORT` bound and listening; a CommvizError naming the fix."""
    from commviz.serving.server import listening_socket

    try:
        return listening_socket(host, port)
    except OSError as exc:
        where = f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise CommvizError(f"--metrics {where}: port {port} is taken (another commviz or exporter?); "
                               f"pick another, e.g. --metrics {host}:{port + 1}, or {host}:0 for any free one") from exc
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise CommvizError(f"--metrics {where}: not allowed to listen there ({exc.strerror}); "
                               "use a port above 1023") from exc
        raise CommvizError(f"--metrics {where}: cannot listen: {exc}; give HOST:PORT of this machine, "
                           f"e.g. --metrics {DEFAULT_HOST}:9400") from exc


def serve(collector: Collector, host: str = DEFAULT_HOST, port: int = 0, process: bool = True) -> MetricsServer:
    """`/metrics` alone on host:port (0: any free port; `MetricsServer.port` says
    which), for a collector with no other HTTP face (`record --metrics`): the same
    asyncio server as `serve --http` (serving/server.py), with one path. A collector
    that has an HTTP view serves `--metrics` as a second address of that one
    (httpview.StateServer.add_metrics). Raises CommvizError, naming the fix."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from commviz.serving.server import HttpServer, Lane, Later, Reply

    registry = registry_of(collector, process)
    sock = listen_socket(host, port)

    def answer(ask):
        if ask.path != "/metrics":
            return Reply(404, "text/plain", b"only /metrics is served here\n")
        return Later(lambda: Reply(200, CONTENT_TYPE_LATEST, generate_latest(registry)), Lane.STATE)

    server = HttpServer(answer)
    site = server.listen(sock, "metrics")
    return MetricsServer(host, site.port, server)
