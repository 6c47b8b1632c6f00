"""A rank as the model knows it, and an op of it kept whole: the data that ingest
(`model/ledger.py`) writes and the answers read."""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz.events import Hello, OpEnd, OpStart, Stopped
from commviz.model import audit as audit_mod
from commviz.model.diagnosis import RankStatus
from commviz.model.nccl import NcclTally
from commviz.model.seen import SeenIds
from commviz.model.stacks import StackStore
from commviz.model.track import InFlight


@dataclass(frozen=True)
class PairedOp:
    """One op of one rank, start and end paired (end None: it never ended), on the
    wall clock. Kept only by a model made with `keep_ops=True` (the in-memory export);
    a streaming exporter takes the same fields from `Model(on_op=...)` instead."""

    rank: int
    start: OpStart
    t0: int
    end: OpEnd | None = None
    t1: int = 0


@dataclass
class RankState:
    rank: int
    hello: Hello | None = None
    offset_ns: int = 0
    status: RankStatus = RankStatus.OK  # what its events say: ok, or gone (dead | exited)
    inflight: dict[int, InFlight] = field(default_factory=dict)
    # Ids of the ops it started: a start resent after a reconnect (or arriving in
    # the same flush as the resync) is recognised and not counted twice.
    seen_ids: SeenIds = field(default_factory=SeenIds)
    ops_done: int = 0
    bytes_done: int = 0
    per_op: dict[str, list[int]] = field(default_factory=dict)  # op -> [count, bytes]
    per_group: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (op, group) -> [count, bytes]
    last_seen: int = 0  # wall ns of the newest event
    last_op: str = ""
    last_op_end: int = 0
    dropped: int = 0
    behind: int = -1  # its probe's Counters.behind as last told (-1: not yet)
    internal_errors: int = 0
    trace_errors: int = 0
    gone_reason: str = ""
    gone_t: int = 0  # wall ns of its last sign of life once gone (goodbye, last event)
    sample: dict[str, float] = field(default_factory=dict)
    last_start: OpStart | None = None  # the start of the op that ended last
    seqs: dict[str, int] = field(default_factory=dict)  # group -> highest collective seq started
    stacks: StackStore = field(default_factory=StackStore)
    stopped: Stopped | None = None  # the watcher stopped the job while this rank ran
    windows: audit_mod.Windows = field(default_factory=audit_mod.Windows)  # recent events, for the audit
    audit: dict | None = None  # against torch's flight recorder (model/audit.py)
    nccl: NcclTally | None = None  # what NCCL itself says it ran (model/nccl.py), once it says anything

    @property
    def gone(self) -> bool:
        return self.status.gone
