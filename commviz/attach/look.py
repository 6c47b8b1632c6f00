"""What attach saw of a job, as the events a live probe would have sent, so the same
model gives the same diagnoses, roll-call and summary document.

Stacks say which torch.distributed call each thread is in (the innermost frame in
torch's distributed_c10d.py or _functional_collectives.py named as one of its ops;
`dst`/`src` among its locals give a p2p op its peer) but not how long it has been
there, nor the op's sequence number. So each rank is looked at twice, `interval`
apart: a rank in the same call at the same line both times has been in it at least
that long, and the model's hang threshold is that interval — every time in the
report is a lower bound. Without sequence numbers every rank in a collective is
taken to be in the same instance of it (#0 of its group): ranks in different
collectives of one group then read as a desync, which from stacks alone is what
can be said. A group other than the default one is named by the op's `group`
argument only where it is None; others are one group "?" of the ranks seen in it.
Where the flight recorder left dumps, their ops (with real sequence numbers) are
used instead, and the stacks say where each rank is.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

from commviz import ops as opcat
from commviz.attach.discover import Job, RankProc
from commviz.attach.pyspy import ThreadStack
from commviz.events import QUIET_OP, Batch, GroupDef, Hello, OpStart, Stack

_C10D = ("torch/distributed/distributed_c10d.py", "torch\\distributed\\distributed_c10d.py")
_FUNCOL = ("torch/distributed/_functional_collectives.py", "torch\\distributed\\_functional_collectives.py")
_PEER_LOCALS = ("dst", "src", "group_dst", "group_src", "peer")
DEFAULT_GROUP = "0"
OTHER_GROUP = "?"


@dataclass(frozen=True)
class InOp:
    op: str
    peer: int
    group: str
    thread: str
    line: int  # of the innermost user-visible frame, to tell the same place twice


@dataclass
class RankLook:
    """One look at one rank: its threads' stacks, or why they could not be read."""

    proc: RankProc
    t_mono: int
    threads: list[ThreadStack] | None
    error: str = ""
    nccl: bool = False

    def in_op(self) -> InOp | None:
        """The torch.distributed call the first thread in one is in (main first)."""
        for th in sorted(self.threads or [], key=lambda t: t.name != "MainThread"):
            hit = op_of(th)
            if hit is not None:
                return hit
        return None


def op_of(th: ThreadStack) -> InOp | None:
    for i in range(len(th.frames) - 1, -1, -1):
        f = th.frames[i]
        name = None
        if f.file.endswith(_C10D) and f.function in opcat.CATALOGUE:
            name = f.function
        elif f.file.endswith(_FUNCOL) and "funcol." + f.function in opcat.CATALOGUE:
            name = "funcol." + f.function
        if name is None:
            continue
        locs = th.locals[i] if i < len(th.locals) else {}
        peer = -1
        spec = opcat.CATALOGUE[name]
        if spec.kind == opcat.P2P:
            for k in _PEER_LOCALS:
                v = locs.get(k)
                if v is not None and v.lstrip("-").isdigit():
                    peer = int(v)
                    break
        group = DEFAULT_GROUP
        if spec.kind != opcat.P2P and locs.get("group", "None") != "None" and _names_group(th.frames[:i]):
            group = OTHER_GROUP
        return InOp(name, peer, group, th.name, th.frames[i - 1].line if i else f.line)
    return None


def _names_group(callers) -> bool:
    """Whether the user's call passed a group: several c10d functions replace a None
    `group` with the default one before they block, so the local cannot say; the
    caller's source line (this machine's file) can."""
    import linecache

    from commviz.model.stacks import USER, frame_rank

    for f in reversed(callers):
        if frame_rank(f.file) == USER:
            return "group" in linecache.getline(f.file, f.line)
    return True


def uses_nccl(pid: int) -> bool:
    """NCCL is loaded in the process (its RAS service then listens)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any("libnccl" in line for line in f)
    except OSError:
        return False


@dataclass
class Observed:
    """A job's two looks as per-rank batches for the model."""

    batches: list[Batch]
    hang_after_s: float
    now_wall: int
    unread: dict[int, str] = field(default_factory=dict)  # rank -> why its stacks are missing


def to_batches(job: Job, first: dict[int, RankLook], second: dict[int, RankLook], host: str | None = None,
               with_ops: bool = True) -> Observed:
    """`first` and `second`: the looks by rank. `with_ops=False` when the ops come from
    elsewhere (flight-recorder dumps): only hellos and stacks then."""
    host = host or socket.gethostname()
    mono, wall = time.monotonic_ns(), time.time_ns()
    world = job.world_size
    batches, unread = [], {}
    t_first = min((lk.t_mono for lk in first.values()), default=mono)
    t_second = max((lk.t_mono for lk in second.values()), default=mono)
    in_other = sorted(r for r, lk in second.items() if (op := lk.in_op()) is not None and op.group == OTHER_GROUP)
    for rank, lk in sorted(second.items()):
        p = lk.proc
        evs: list = [Hello(rank, p.local_rank, world, host, p.pid, "nccl" if lk.nccl else "", "", "", "", job.key,
                           mono, wall)]
        if with_ops:
            evs.append(GroupDef(DEFAULT_GROUP, list(range(world)), ""))
            if in_other:
                evs.append(GroupDef(OTHER_GROUP, in_other, ""))
        if lk.threads is None:
            unread[rank] = lk.error
            batches.append(Batch(1, rank, evs))
            continue
        op = lk.in_op()
        if with_ops and op is not None:
            before = first.get(rank)
            same = before is not None and before.in_op() == op
            t0 = before.t_mono if same else lk.t_mono
            evs.append(OpStart(1, t0, op.op, op.group, 0, 0, "", [], op.peer if op.peer >= 0 else -1))
            th = next(t for t in lk.threads if t.name == op.thread)
            evs.append(Stack(lk.t_mono, 1, th.name, th.frames))
        evs += [Stack(lk.t_mono, QUIET_OP, th.name, th.frames) for th in _main_first(lk.threads)]
        batches.append(Batch(1, rank, evs))
    # The shortest time any one rank was watched staying put: a rank looked at late in
    # the first round and early in the second was watched for less than the rounds'
    # span (py-spy reads one rank after another, ~0.1-0.2 s each on a busy box), and a
    # threshold from that span left such a rank "waiting" in the op it never left.
    gaps = [lk.t_mono - first[r].t_mono for r, lk in second.items() if r in first]
    interval_s = max(0.05, min(gaps, default=t_second - t_first) / 1e9)
    return Observed(batches, interval_s * 0.9, wall + (t_second - mono), unread)


def _main_first(threads: list[ThreadStack]) -> list[ThreadStack]:
    return sorted(threads, key=lambda t: (t.name != "MainThread", t.name))[:8]


def dump_paths(job: Job) -> list[str]:
    """Flight-recorder dumps already on disk for the job's ranks (dump on timeout, or
    after a pipe request): `<TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`."""
    from commviz.attach.discover import DUMP_FILE, started_at

    out = []
    for r in job.ranks:
        var = r.has(DUMP_FILE)
        if var:
            path = f"{r.env[var]}{r.rank}"
            t0 = started_at(r.pid)
            if os.path.isfile(path) and (t0 is None or os.stat(path).st_mtime >= t0):
                out.append(path)  # not a dump an earlier run left under the same name
    return out


def request_dumps(job: Job, wait_s: float = 5.0) -> list[str]:
    """Ask each rank's watchdog for a flight-recorder dump through its debug pipe
    (`<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`: anything written there makes it
    dump to its dump file), then wait for the files. Returns the pipes written."""
    from commviz.attach.discover import DUMP_PIPE

    written = []
    before = {p: _mtime(p) for p in dump_paths(job)}
    for r in job.ranks:
        var = r.has(DUMP_PIPE)
        if not var:
            continue
        pipe = f"{r.env[var]}{r.rank}.pipe"
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, b"1\n")
            written.append(pipe)
        except OSError:
            pass
        finally:
            os.close(fd)
    if written:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            now = {p: _mtime(p) for p in dump_paths(job)}
            if len(now) >= len(written) and all(now[p] != before.get(p) for p in now):
                break
            time.sleep(0.2)
    return written


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0
