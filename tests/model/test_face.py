"""Diagnosis and the summary document read the model through `face.ModelFace` only:
a small fake that has nothing else is enough to find a hang, and the real `Model`
is still one (a member the readers start to need shows up here, not in the field)."""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz.events import Counters, GroupDef, Hello, OpStart, Stopped
from commviz.model import Model
from commviz.model.diagnosis import Diagnosis, Kind, RankStatus
from commviz.model.document import rank_rows, summary
from commviz.model.face import ModelFace, RankFace
from commviz.model.findings import Findings, diagnose
from commviz.model.nccl import NcclTally
from commviz.model.stacks import StackStore
from commviz.model.thresholds import Thresholds
from commviz.model.track import InFlight, Instance, P2PPair
from tests.helpers import WALL0, group, hello, op

S = 1_000_000_000


@dataclass
class FakeRank:
    rank: int
    hello: Hello | None = None
    offset_ns: int = WALL0
    status: RankStatus = RankStatus.OK
    gone_reason: str = ""
    gone_t: int = 0
    stopped: Stopped | None = None
    last_seen: int = 0
    inflight: dict[int, InFlight] = field(default_factory=dict)
    last_start: OpStart | None = None
    last_op: str = ""
    last_op_end: int = 0
    seqs: dict[str, int] = field(default_factory=dict)
    ops_done: int = 0
    bytes_done: int = 0
    per_op: dict[str, list[int]] = field(default_factory=dict)
    dropped: int = 0
    stacks: StackStore = field(default_factory=StackStore)
    audit: dict | None = None
    nccl: NcclTally | None = None

    @property
    def gone(self) -> bool:
        return self.status.gone


@dataclass
class NoPairs:
    pairs: dict[tuple[str, int, int, int], P2PPair] = field(default_factory=dict)


@dataclass
class NoStragglers:
    def find(self, th: Thresholds, members_of: dict[str, list[int]]) -> list[Diagnosis]:
        return []


@dataclass
class FakeModel:
    """What the readers read, as plain fields; its answers as simply as they can be given."""

    ranks: dict[int, FakeRank]
    groups: dict[str, GroupDef]
    pending: dict[tuple[str, int], Instance]
    last_t: int
    thresholds: Thresholds = field(default_factory=Thresholds)
    world_size: int = 2
    backend: str = "gloo"
    events: int = 0
    decode_errors: int = 0
    tracker: NoPairs = field(default_factory=NoPairs)
    stragglers: NoStragglers = field(default_factory=NoStragglers)
    desync_history: dict[tuple, Diagnosis] = field(default_factory=dict)

    def gone_note(self, rank: int) -> str | None:
        return None

    def current_op(self, r: FakeRank) -> InFlight | None:
        return min(r.inflight.values(), key=lambda f: f.t_wall, default=None)

    def rank_status(self, r: FakeRank, now: int, hung: set[int] | frozenset[int] = frozenset()) -> RankStatus:
        if r.rank in hung:
            return RankStatus.HUNG
        return RankStatus.WAITING if r.inflight else RankStatus.OK

    def view_status(self, r: FakeRank, now: int, found: Findings) -> RankStatus:
        st = self.rank_status(r, now, found.hung)
        return RankStatus.MISSING if r.rank in found.missing else st

    def group_size(self, group: str) -> int:
        g = self.groups.get(group)
        return len(g.ranks) if g is not None else 0

    def stats_now(self) -> dict:
        return {}

    def findings(self, now: int | None = None) -> Findings:
        return diagnose(self, self.last_t if now is None else now)


def _start(op_id: int, seq: int) -> OpStart:
    return OpStart(op_id, 0, "all_reduce", "0", seq, 4096, "float32", [1024])


def one_rank_never_came() -> tuple[FakeModel, int]:
    """Rank 0 has waited in all_reduce #3 since 1 s; rank 1 finished #2 at 0.9 s and
    is still heard from at 20 s, but never entered #3."""
    entered = InFlight(_start(3, 3), WALL0 + 1 * S)
    ranks = {
        0: FakeRank(0, hello(0), last_seen=WALL0 + 20 * S, inflight={3: entered}, seqs={"0": 3},
                    last_start=_start(2, 2), last_op="all_reduce", last_op_end=WALL0 + S * 9 // 10, ops_done=3),
        1: FakeRank(1, hello(1), last_seen=WALL0 + 20 * S, seqs={"0": 2},
                    last_start=_start(2, 2), last_op="all_reduce", last_op_end=WALL0 + S * 9 // 10, ops_done=3),
    }
    pending = {("0", 3): Instance("all_reduce", "0", 3, starts={0: entered}, last_arrival=entered.t_wall)}
    return FakeModel(ranks, {"0": group("0", (0, 1))}, pending, last_t=WALL0 + 20 * S), WALL0 + 20 * S


def test_a_fake_with_only_the_face_gets_the_hang_named_on_the_missing_rank():
    model, now = one_rank_never_came()
    assert isinstance(model, ModelFace) and all(isinstance(r, RankFace) for r in model.ranks.values())
    found = diagnose(model, now)
    [d] = found.diagnoses
    assert d.kind is Kind.HANG
    assert (d.group, d.seq, d.op) == ("0", 3, "all_reduce")
    assert d.waiting_ranks == [0] and d.missing_ranks == [1] and d.culprit_ranks == [1]
    assert "(ranks 0,1)" in d.message and "rank 0 waiting 19.0 s" in d.message
    assert "rank 1 never entered it — no op in flight — last op all_reduce #2 on group 0 ended 19.1 s ago" in d.message
    assert found.hung == {0} and found.missing == {1}


def test_the_summary_and_rank_rows_of_the_fake():
    model, now = one_rank_never_came()
    doc = summary(model, now)
    assert [(r["rank"], r["status"]) for r in doc["ranks"]] == [(0, "hung"), (1, "ok")]
    assert [(d["kind"], d["missing_ranks"]) for d in doc["diagnoses"]] == [("hang", [1])]
    assert doc["world_size"] == 2 and doc["ops"] == []
    rows = rank_rows(model, now)
    assert [(r.rank, r.status, r.op) for r in rows] == [(0, RankStatus.HUNG, "all_reduce#3"),
                                                        (1, RankStatus.MISSING, "")]


def test_a_real_model_fed_the_same_story_is_a_face_and_says_the_same():
    m = Model()
    for r in (0, 1):
        m.ingest(r, hello(r))
        m.ingest(r, group("0", (0, 1)))
        for seq in range(3):
            for ev in op(seq, seq * S // 10, seq * S // 10 + S * 7 // 10 if seq == 2 else seq * S // 10 + 1, seq=seq):
                m.ingest(r, ev)
    m.ingest(0, OpStart(3, 1 * S, "all_reduce", "0", 3, 4096, "float32", [1024]))
    for r in (0, 1):
        m.ingest(r, Counters(20 * S))
    assert isinstance(m, ModelFace) and all(isinstance(r, RankFace) for r in m.ranks.values())
    fake, now = one_rank_never_came()
    assert [d.to_json() for d in m.findings(now).diagnoses] == [d.to_json() for d in diagnose(fake, now).diagnoses]
