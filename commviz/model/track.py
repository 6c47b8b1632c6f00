"""Who has entered and who has left each collective instance (group, seq) and each
point-to-point pair, while they are in flight.

Diagnosis needs this live: a hang is "some ranks are inside (G, seq), others never
came", a desync is "they came with different arguments", a p2p deadlock is "each
waits for a match the other never posted". Memory stays bounded: an instance is
dropped (folded into the statistics by the model) once every member has left it, a
pair once both sides have finished, and both tables have hard caps for event streams
with holes in them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz import ops as opcat
from commviz.events import OpStart

MAX_PENDING = 65536  # collective instances not yet left by every member
MAX_PAIRS = 65536  # p2p pairs not yet finished on both sides

# Errors that say the user stopped the rank, not that a peer failed it.
INTERRUPTS = ("KeyboardInterrupt", "SystemExit")


def is_interrupt(error: str) -> bool:
    return error.startswith(INTERRUPTS)


@dataclass
class InFlight:
    start: OpStart
    t_wall: int


@dataclass
class Instance:
    """One collective instance (group, seq) as the ranks report it."""

    op: str
    group: str
    seq: int
    bytes: int = 0
    durations: dict[int, int] = field(default_factory=dict)  # rank -> ns, successful ends
    errors: int = 0
    ended: set[int] = field(default_factory=set)
    starts: dict[int, InFlight] = field(default_factory=dict)  # rank -> what it entered with
    failed: dict[int, tuple[int, str]] = field(default_factory=dict)  # rank -> (end wall ns, error)
    last_arrival: int = 0  # wall ns of the latest start: the data moves from then on

    def inside(self) -> list[int]:
        """Ranks that entered and have not left."""
        return sorted(r for r in self.starts if r not in self.ended)


@dataclass
class P2PSide:
    rank: int
    fl: InFlight
    end_wall: int = -1  # -1 while in flight
    error: str = ""

    @property
    def ended(self) -> bool:
        return self.end_wall >= 0


@dataclass
class P2PPair:
    """The k-th message from `src` to `dst` on `group`: its send and its recv side."""

    group: str
    src: int
    dst: int
    seq: int
    send: P2PSide | None = None  # None until the send side is posted
    recv: P2PSide | None = None  # None until the recv side is posted


def p2p_key(rank: int, s: OpStart) -> tuple[tuple[str, int, int, int], bool] | None:
    """((group, src, dst, seq), sending) for a p2p start, None when it cannot be paired
    (a recv from any source does not name its peer until it ends)."""
    spec = opcat.spec(s.op)
    if spec is None or spec.kind != opcat.P2P or s.peer < 0:
        return None
    sending = spec.direction == "send"
    src, dst = (rank, s.peer) if sending else (s.peer, rank)
    return (s.group, src, dst, s.seq), sending


class Tracker:
    """The in-flight tables. The model decides when an instance is complete (it knows
    group sizes); the tracker only records and bounds."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, int], Instance] = {}
        self.pairs: dict[tuple[str, int, int, int], P2PPair] = {}
        self.evicted_instances = 0
        self.evicted_pairs = 0

    # ----------------------------------------------------------- collectives

    def enter(self, rank: int, fl: InFlight) -> Instance:
        s = fl.start
        key = (s.group, s.seq)
        inst = self.pending.get(key)
        if inst is None:
            inst = self.pending[key] = Instance(s.op, s.group, s.seq)
        if rank not in inst.starts:
            inst.starts[rank] = fl
            if fl.t_wall > inst.last_arrival:
                inst.last_arrival = fl.t_wall
        return inst

    def leave(self, rank: int, fl: InFlight, end_wall: int, nbytes: int, error: str,
              duration_ns: int | None = -1) -> Instance:
        """`duration_ns`: the rank's time in the op (device time where measured; None:
        untimed, a captured op); -1, the host time from its start to `end_wall`."""
        inst = self.enter(rank, fl)  # its start may predate the instance (backlog order)
        inst.bytes = max(inst.bytes, nbytes)
        inst.ended.add(rank)
        if error:
            inst.errors += 1
            inst.failed[rank] = (end_wall, error)
        elif duration_ns is None:
            pass
        else:
            inst.durations[rank] = duration_ns if duration_ns >= 0 else end_wall - fl.t_wall
        return inst

    # ------------------------------------------------------------------- p2p

    def post(self, rank: int, fl: InFlight) -> None:
        k = p2p_key(rank, fl.start)
        if k is None:
            return
        key, sending = k
        pair = self.pairs.get(key)
        if pair is None:
            pair = self.pairs[key] = P2PPair(key[0], key[1], key[2], key[3])
            if len(self.pairs) > MAX_PAIRS:
                self.pairs.pop(next(iter(self.pairs)))
                self.evicted_pairs += 1
        side = P2PSide(rank, fl)
        if sending and pair.send is None:
            pair.send = side
        elif not sending and pair.recv is None:
            pair.recv = side

    def finish(self, rank: int, fl: InFlight, end_wall: int, error: str) -> P2PPair | None:
        """Mark a p2p side done; returns the pair when both sides are done (and drops it)."""
        k = p2p_key(rank, fl.start)
        if k is None:
            return None
        key, sending = k
        pair = self.pairs.get(key)
        if pair is None:
            return None
        side = pair.send if sending else pair.recv
        if side is None or side.fl is not fl:
            return None
        side.end_wall = end_wall
        side.error = error
        if pair.send is not None and pair.recv is not None and pair.send.ended and pair.recv.ended:
            del self.pairs[key]
            return pair
        return None

    # ------------------------------------------------------------ lifecycle

    def forget_rank(self, rank: int) -> None:
        """A rank restarted (new process): its old entries say nothing about the new
        one, whose sequence numbers start again at 0."""
        for key, inst in list(self.pending.items()):
            if rank in inst.starts or rank in inst.ended:
                inst.starts.pop(rank, None)
                inst.ended.discard(rank)
                inst.durations.pop(rank, None)
                inst.failed.pop(rank, None)
                if not inst.starts:
                    del self.pending[key]
                else:
                    inst.last_arrival = max(f.t_wall for f in inst.starts.values())
        for key, pair in list(self.pairs.items()):
            if pair.send is not None and pair.send.rank == rank:
                pair.send = None
            if pair.recv is not None and pair.recv.rank == rank:
                pair.recv = None
            if pair.send is None and pair.recv is None:
                del self.pairs[key]
