"""The model's findings as types: what kind of trouble (`Kind`), how each rank stands
(`RankStatus`), and one `Diagnosis`.

Views and commands switch on these, never on strings; `Diagnosis.to_json()` is the
`diagnoses` entry of `commviz summary --json` (keys are a contract, see
docs/ARCHITECTURE.md). Both enums are `str` enums so the JSON and old comparisons with
plain strings keep working.
"""

from __future__ import annotations

from dataclasses import dataclass, field

try:
    from enum import StrEnum
except ImportError:  # Python 3.10: the same behaviour, spelled out
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


class Kind(StrEnum):
    """What a diagnosis is about, most fundamental first (the order they are listed in)."""

    DESYNC = "desync"
    DEAD_RANK = "dead_rank"
    P2P_DEADLOCK = "p2p_deadlock"
    HANG = "hang"
    STRAGGLER = "straggler"

    @property
    def order(self) -> int:
        return _KIND_ORDER[self]

    @property
    def blocks(self) -> bool:
        """The job cannot go on by itself (a straggler only slows it down): `record
        --hang-timeout` stops the job on these, and `record` exits 3 on them."""
        return self is not Kind.STRAGGLER

    @property
    def names_missing(self) -> bool:
        """Its missing ranks are the ones the others wait for (shown as `missing`)."""
        return self in (Kind.HANG, Kind.P2P_DEADLOCK, Kind.DESYNC)


_KIND_ORDER = {k: i for i, k in enumerate(Kind)}


class RankStatus(StrEnum):
    """How a rank stands. The summary JSON uses the first five; `MISSING` is a live
    rank the others wait for in a diagnosis (the dashboard's rank table and flow view)."""

    OK = "ok"
    WAITING = "waiting"
    HUNG = "hung"
    DEAD = "dead"
    EXITED = "exited"
    MISSING = "missing"

    @property
    def gone(self) -> bool:
        """Its process is over (cleanly or not)."""
        return self in (RankStatus.DEAD, RankStatus.EXITED)

    @property
    def severity(self) -> int:
        """Worst first: dead, missing, hung, waiting, exited, ok (for picking rows)."""
        return _SEVERITY[self]


_SEVERITY = {
    RankStatus.DEAD: 0,
    RankStatus.MISSING: 1,
    RankStatus.HUNG: 2,
    RankStatus.WAITING: 3,
    RankStatus.EXITED: 4,
    RankStatus.OK: 5,
}


@dataclass
class Diagnosis:
    """One thing wrong with the job, in words a person can act on, and the ranks and
    op it is about."""

    kind: Kind
    group: str
    seq: int
    op: str
    waiting_ranks: list[int]
    missing_ranks: list[int]
    culprit_ranks: list[int]
    message: str
    details: dict = field(default_factory=dict)
    stacks: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        """The summary document's `diagnoses` entry (same keys, same order as ever)."""
        return {
            "kind": self.kind.value,
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "waiting_ranks": list(self.waiting_ranks),
            "missing_ranks": list(self.missing_ranks),
            "culprit_ranks": list(self.culprit_ranks),
            "message": self.message,
            "details": self.details,
            "stacks": self.stacks,
        }

    def copy(self) -> Diagnosis:
        """A copy whose details and stacks can be changed without touching this one."""
        return Diagnosis(self.kind, self.group, self.seq, self.op, list(self.waiting_ranks),
                         list(self.missing_ranks), list(self.culprit_ranks), self.message,
                         dict(self.details), list(self.stacks))

    @property
    def sort_key(self) -> tuple:
        return (self.kind.order, str(self.group), self.seq, self.message)
