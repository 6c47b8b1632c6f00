"""One copy of what the dashboard shows, taken from the model under the feed's lock.

Everything the widgets draw comes from a `Snapshot`: the lock is held only while it is
built (plain reads and small copies), never while anything is drawn, so ingest never
waits for a frame and a frame never waits for ingest. A feed's `fetch` (view/feed.py)
is the whole of one data tick's reading; the app runs it on its update thread
(tui/update.py), off the UI thread, and draws what it posts.

Every field is plain data with a precise type (dataclasses, enums, containers of
them): a collector sends a `Fetched` to a view in another process as msgspec, and
msgspec rebuilds exactly these types from the annotations (viewlink.py). Something
that is not plain data (rich's Text, a topology backend) has no place here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from commviz.model import ledger
from commviz.model.diagnosis import Diagnosis
from commviz.model.document import RankRow
from commviz.model.flows import PATTERN_TEXT, PATTERNS, EdgeRate
from commviz.model.placement import Place, simulated_place
from commviz.topo.model import Topology
from commviz.units import format_bps
from commviz.view.alerts import AlertRow, alert_rows
from commviz.view.flow import FlowData, FlowNode

SPARK_WIDTH = 120  # columns of history copied for the sparklines
RECENT_EDGE_NS = 10_000_000_000


@dataclass(frozen=True)
class ModelInfo:
    """The headline the status line and the ranks table's title read, every tick,
    even while the view is frozen (no snapshot then)."""

    world_size: int | None = None
    backend: str | None = None
    job: str | None = None
    events: int = 0
    nranks: int = 0
    start: int | None = None  # the earliest hello's wall ns: the job's elapsed time counts from it


@dataclass
class Snapshot:
    now: int
    info: ModelInfo
    rank_rows: list[RankRow] = field(default_factory=list)
    # the summary's `ops` entries: dicts, because they are the JSON contract
    op_rows: list[dict[str, str | int | float]] = field(default_factory=list)
    alerts: list[AlertRow] = field(default_factory=list)
    diagnoses: list[Diagnosis] = field(default_factory=list)
    flow: FlowData = field(default_factory=lambda: FlowData(nodes=[]))
    places: dict[int, Place] = field(default_factory=dict)
    rates: dict[tuple[int, int], EdgeRate] = field(default_factory=dict)
    tp_total: dict[str, list[float]] = field(default_factory=dict)  # model.throughput's series
    tp_rate: tuple[float, float] = (0.0, 0.0)
    tp_focus: dict[str, list[float]] | None = None
    tp_focus_rate: tuple[float, float] | None = None
    samples: dict[str, dict[str, float]] = field(default_factory=dict)
    focus: int | None = None  # the rank whose traffic and history are shown, None: all
    procs: dict[int, tuple[float, int]] = field(default_factory=dict)  # rank -> (cpu %, rss), watcher's host
    ended: bool = False  # every rank that said hello has exited or died
    # the job's summary document, once it ended (see `take_snapshot`): JSON, as
    # `commviz summary --json` prints it, so plain dicts and lists all the way down
    summary: dict[str, Any] | None = None
    simulated: bool = False  # CPU ranks are shown on the topology's GPUs
    # host -> the GPU topology its ranks are drawn and linked on (its own document,
    # else the watcher's view where that describes it): the links panel reads it
    topologies: dict[str, Topology | None] = field(default_factory=dict)


@dataclass
class Fetched:
    """One data tick's reading: the feed's status line, the model's headline numbers,
    and the snapshot (None while the view is frozen)."""

    now: int
    status: str
    info: ModelInfo
    snap: Snapshot | None
    lock_wait_s: float = 0.0
    lock_hold_s: float = 0.0


class Hosts(Protocol):
    """Which topology each host's ranks sit on: `topo.hosts.HostTopologies`, or
    `OneTopology` where a caller knows of one topology only."""

    def sync(self, documents: dict[str, dict], version: int) -> None: ...

    def for_host(self, host: str) -> Topology | None: ...


class OneTopology:
    """Every host on the one topology given (no per-host documents): for callers
    that hand in no `hosts`."""

    def __init__(self, topology: Topology | None) -> None:
        self.topology = topology

    def sync(self, documents: dict[str, dict], version: int) -> None:
        pass

    def for_host(self, host: str) -> Topology | None:
        return self.topology


def gpu_index(hello, topology: Topology | None) -> int | None:
    """The GPU a rank runs on, as an index on its host: by UUID / bus id in the
    topology when known, else the CUDA device number; None for CPU ranks."""
    if hello is None or not str(hello.device).startswith("cuda"):
        return None
    if topology is not None:
        g = topology.gpu_for(uuid=hello.cuda_uuid, bus_id=hello.pci_bus_id)
        if g is not None:
            return g.index
    _, _, num = str(hello.device).partition(":")
    return int(num) if num.isdigit() else hello.local_rank


def fabric_label(topology: Topology | None) -> str | None:
    if topology is None or not topology.gpus:
        return None
    gpu_links = False
    for g in topology.gpus:  # once per host per snapshot: stop at the first switch link
        for lk in g.links:
            if lk.up:
                if lk.remote == "nvswitch":
                    return "NVSwitch"
                gpu_links = gpu_links or lk.remote == "gpu"
    return "NVLink+PCIe" if gpu_links else "PCIe"


def model_info(m) -> ModelInfo:
    return ModelInfo(m.world_size, m.backend, m.job, m.events, len(m.ranks),
                     min((r.hello.wall_ns for r in m.ranks.values() if r.hello), default=None))


def place_of(rank: int, host: str, hello, world_size: int, topology: Topology | None,
             simulate: bool) -> tuple[Place, bool]:
    """Where the flow view and the links panel put a rank, and whether that place is
    simulated: with `simulate` (the user chose the topology), a rank without a GPU
    sits on the topology's GPUs by rank (`simulated_place`)."""
    gpu = gpu_index(hello, topology)
    if gpu is None and simulate and topology is not None and topology.gpus:
        return simulated_place(rank, world_size, topology), True
    return Place(host, gpu), False


def take_snapshot(m, now: int, focus: int | None = None, topology: Topology | None = None,
                  spark_width: int = SPARK_WIDTH, simulate: bool = False, summary_unless: int | None = None,
                  hosts: Hosts | None = None) -> Snapshot:
    """Call with the feed's lock held. `simulate`: CPU ranks on the topology's GPUs.
    With `summary_unless` (a live dashboard: the model's event count when it last got a
    summary, -1 for never), a job that has ended and has news since gets its summary
    document, as `commviz summary` reads it (the model's own clock).

    `hosts` says which topology each host's ranks sit on (`topo.hosts.HostTopologies`:
    the host's own document, which its local rank 0 sent, else `topology` where that
    describes the host); without it every host is taken to be `topology`."""
    if hosts is None:
        hosts = OneTopology(topology)
    hosts.sync(m.host_topologies, m.topology_version)
    snap = Snapshot(now=now, info=model_info(m), focus=focus)
    found = m.findings(now)  # once per snapshot: the rows and the alerts share it
    rank_rows = m.rank_rows(now, found)
    diagnoses = found.diagnoses
    snap.rank_rows = rank_rows
    snap.op_rows = m.op_rows()  # == summary(now)["ops"], without per-rank work
    snap.diagnoses = diagnoses
    snap.alerts = alert_rows(diagnoses, rank_rows, m.decode_errors, m.last_decode_error)
    snap.ended = bool(rank_rows) and all(row.status.gone for row in rank_rows)
    if snap.ended and summary_unless is not None and m.events != summary_unless:
        snap.summary = m.summary()
    ledger.flush_flows(m)  # a shedding model's sampled ends, held until they span a bucket
    tr = m.traffic
    snap.rates = rates = tr.flows.rates(now)
    recent = tr.flows.recent_edges(now, RECENT_EDGE_NS)
    tp = tr.throughput
    snap.tp_total = tp.series(now, spark_width)
    snap.tp_rate = tp.rate(now)
    if focus is not None:
        snap.tp_focus = tp.series(now, spark_width, rank=focus)
        snap.tp_focus_rate = tp.rate(now, rank=focus)
    waits: list[tuple[int, int]] = []
    for d in diagnoses:
        if d.kind.names_missing:
            waits += [(w, g) for w in d.waiting_ranks for g in d.missing_ranks][:256]
    topologies = snap.topologies
    fabrics: dict[str, str] = {}
    nodes = []
    for row in rank_rows:
        r = m.ranks[row.rank]
        t = topologies[row.host] = _topology_of(hosts, topologies, row.host)
        place, simulated = place_of(row.rank, row.host, r.hello, m.world_size or len(m.ranks), t, simulate)
        host, gpu = place.host, place.gpu
        if simulated:
            topologies[host] = _topology_of(hosts, topologies, host)
        snap.simulated |= simulated
        snap.places[row.rank] = place
        nodes.append(FlowNode(row.rank, host, gpu, row.status, row.op.partition("#")[0]))
        if gpu is not None and host not in fabrics:
            fabric = fabric_label(topologies[host])
            if fabric:
                fabrics[host] = fabric
        if r.sample:
            snap.samples[host] = dict(r.sample)
    banner, alert = _banner(diagnoses, rates, snap.tp_rate, nodes)
    snap.flow = FlowData(nodes=nodes, rates=rates, recent=recent, fabric=fabrics, banner=banner, alert=alert,
                         waits=waits[:256])
    return snap


def _topology_of(hosts: Hosts, seen: dict[str, Topology | None], host: str) -> Topology | None:
    if host in seen:
        return seen[host]
    return hosts.for_host(host)


def _banner(diagnoses: list[Diagnosis], rates: dict[tuple[int, int], EdgeRate], tp_rate: tuple[float, float],
            nodes: list[FlowNode]) -> tuple[str, bool]:
    if diagnoses:
        d = diagnoses[0]
        more = f"  (+{len(diagnoses) - 1} more in Alerts)" if len(diagnoses) > 1 else ""
        return f"{d.kind.upper()}: {d.message}{more}", True
    if rates:
        by_op: dict[str, float] = {}
        for r in rates.values():
            by_op[r.op] = by_op.get(r.op, 0.0) + r.Bps
        op = max(by_op, key=by_op.get)
        how = PATTERN_TEXT.get(PATTERNS.get(op, ""), "")
        how = "exact" if how == "exact" else f"modelled {how}"
        return f"{op}: {how} · {format_bps(tp_rate[0] * 1e9)} · {tp_rate[1]:,.0f} ops/s", False
    inside = sum(1 for n in nodes if n.op)
    if inside:
        return f"{inside} rank(s) inside an op; nothing finished in the last second", False
    return "idle: nothing moved in the last second", False
