"""torch's flight recorder dumps (JSON from `_dump_*_json`, the pickles dump-on-timeout
writes) turned into commviz events, so the model diagnoses them like a live job.

A dump is one rank's ring of the last N ops its process group backend issued: per
entry the group (`process_group` = [name, desc]), the per-group collective sequence
number, the op as `backend:name`, tensor sizes and dtypes, and — where the backend
tracks it (NCCL) — when it started and completed. Gloo's recorder never marks entries
completed and leaves `pg_config` empty on most ranks, so two things are inferred, and
said: a group's members are the ranks that hold its entries (every dumped rank for
the default group), and an op is done once every member holds it or a later op of
the same group. What is left is in flight: the ranks inside it wait, the members
that never reached it are missing — exactly the model's hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz.events import SCHEMA_VERSION, Batch, Counters, Frame, GroupDef, OpEnd, OpStart, Stack
from commviz.trace import torchnames as tn

MAX_ENTRIES = 1_000_000


class DumpError(ValueError):
    """Not a flight-recorder dump; the message says what is wrong with it."""


@dataclass
class Entry:
    record_id: int
    group: str
    desc: str
    seq: int  # collective_seq_id (from 1), or p2p_seq_id for p2p entries
    op: str
    raw_op: str
    is_p2p: bool
    in_sizes: list[list[int]]
    out_sizes: list[list[int]]
    dtype: str
    itemsize: int
    state: str
    t_created: int
    t_started: int
    t_completed: int
    retired: bool
    frames: list[dict]
    thread: str = ""
    peer_group_rank: int = -1  # p2p: the other end, as a rank of the group


@dataclass
class Dump:
    rank: int
    backend: str
    version: str
    entries: list[Entry]
    group_ranks: dict[str, list[int]]  # what pg_config says, where it says anything
    written_ns: int  # when the file was written: the dump's "now"
    skipped: int = 0  # entries that were not well-formed
    tracks_completion: bool = False


def _int(v: object, default: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        return default
    return v


def _sizes(v: object) -> list[list[int]]:
    if not isinstance(v, list):
        raise ValueError("sizes are not a list")
    out = []
    for s in v:
        if not isinstance(s, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s):
            raise ValueError("a size is not a list of non-negative ints")
        out.append(s)
    return out


def _numel(sizes: list[list[int]]) -> int:
    total = 0
    for s in sizes:
        n = 1
        for x in s:
            n *= x
        total += n
    return total


def _peer(raw: str, is_p2p: bool) -> int:
    """`nccl:send 0->1` / `nccl:recv 1<-0`: the peer's group rank."""
    if not is_p2p:
        return -1
    for sep in ("->", "<-"):
        if sep in raw:
            tail = raw.rsplit(sep, 1)[1].strip()
            return int(tail) if tail.isdigit() else -1
    return -1


def parse_entry(e: object) -> Entry:
    if not isinstance(e, dict):
        raise ValueError("entry is not a mapping")
    raw = e.get("profiling_name")
    pg = e.get("process_group")
    if not isinstance(raw, str) or not isinstance(pg, (list, tuple)) or len(pg) != 2 or not all(isinstance(x, str) for x in pg):
        raise ValueError("no profiling_name or process_group")
    is_p2p = bool(e.get("is_p2p", False)) or " " in raw
    seq = _int(e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id"), -1)
    dtypes = e.get("input_dtypes") or e.get("output_dtypes") or []
    dt = tn.dtype(dtypes[0]) if isinstance(dtypes, list) and dtypes else None
    frames = e.get("frames")
    return Entry(
        record_id=_int(e.get("record_id"), -1), group=pg[0], desc=pg[1], seq=seq,
        op=tn.op_name(raw), raw_op=raw, is_p2p=is_p2p,
        in_sizes=_sizes(e.get("input_sizes", [])), out_sizes=_sizes(e.get("output_sizes", [])),
        dtype=dt[0] if dt else "", itemsize=dt[1] if dt else 0,
        state=e.get("state") if isinstance(e.get("state"), str) else "",
        t_created=_int(e.get("time_created_ns")), t_started=_int(e.get("time_discovered_started_ns")),
        t_completed=_int(e.get("time_discovered_completed_ns")), retired=e.get("retired") is True,
        frames=[f for f in frames if isinstance(f, dict)] if isinstance(frames, list) else [],
        thread=e.get("thread_name") if isinstance(e.get("thread_name"), str) else "",
        peer_group_rank=_peer(raw, is_p2p),
    )


def parse_dump(doc: object, rank: int, written_ns: int) -> Dump:
    """Validate a loaded dump (JSON or plain-data pickle). Malformed entries are
    skipped and counted; a document that is no dump at all raises DumpError."""
    if not isinstance(doc, dict) or not isinstance(doc.get("entries", []), list) or "version" not in doc:
        raise DumpError("not a flight-recorder dump (no version and entries)")
    raw_entries = doc.get("entries", [])
    if len(raw_entries) > MAX_ENTRIES:
        raise DumpError(f"{len(raw_entries)} entries, over the {MAX_ENTRIES} limit")
    entries, skipped = [], 0
    for e in raw_entries:
        try:
            entries.append(parse_entry(e))
        except (ValueError, TypeError):
            skipped += 1
    groups: dict[str, list[int]] = {}
    cfg = doc.get("pg_config")
    if isinstance(cfg, dict):
        for name, c in cfg.items():
            ranks = tn.parse_ranks(c.get("ranks")) if isinstance(c, dict) else None
            if isinstance(name, str) and name and ranks:
                groups[name] = ranks
    backends = {e.raw_op.split(":", 1)[0] for e in entries if ":" in e.raw_op}
    return Dump(
        rank=rank, backend=backends.pop() if len(backends) == 1 else "", version=str(doc.get("version")),
        entries=entries, group_ranks=groups,
        written_ns=max([written_ns] + [max(e.t_created, e.t_completed) for e in entries]),
        skipped=skipped,
        tracks_completion=any(e.state in ("started", "completed") or e.t_completed for e in entries),
    )


@dataclass
class _Groups:
    members: dict[str, list[int]] = field(default_factory=dict)
    inferred: list[str] = field(default_factory=list)


def _groups(dumps: dict[int, Dump]) -> _Groups:
    out = _Groups()
    holders: dict[str, set[int]] = {}
    default: set[str] = set()
    for d in dumps.values():
        for e in d.entries:
            holders.setdefault(e.group, set()).add(d.rank)
            if e.desc == "default_pg":
                default.add(e.group)
        for name, ranks in d.group_ranks.items():
            out.members.setdefault(name, ranks)
    for name, ranks in holders.items():
        if name in out.members:
            continue
        out.members[name] = sorted(dumps) if name in default else sorted(ranks)
        out.inferred.append(name)
    return out


def _done(e: Entry, rank: int, members: list[int], reached: dict[tuple[int, str], int], tracked: bool) -> bool:
    """Whether an entry's op finished: the recorder says so, or (where it does not
    track completion) every member of its group got to it or past it."""
    if e.state == "completed" or e.t_completed or e.retired:
        return True
    if tracked or e.is_p2p:
        return False
    return all(reached.get((m, e.group), 0) >= e.seq for m in members)


def to_batches(dumps: dict[int, Dump], job: str) -> tuple[list[Batch], list[str]]:
    """One batch per rank, and notes on what these files cannot tell."""
    groups = _groups(dumps)
    reached: dict[tuple[int, str], int] = {}
    for d in dumps.values():
        for e in d.entries:
            if not e.is_p2p:
                key = (d.rank, e.group)
                reached[key] = max(reached.get(key, 0), e.seq)
    world = max([len(dumps)] + [r + 1 for r in dumps] + [max(m) + 1 for m in groups.members.values() if m])
    batches = [_rank_batch(d, groups.members, reached, world, job) for d in sorted(dumps.values(), key=lambda d: d.rank)]
    return batches, _notes(dumps, groups)


def _rank_batch(d: Dump, members: dict[str, list[int]], reached, world: int, job: str) -> Batch:
    t0 = min([e.t_created for e in d.entries if e.t_created] + [d.written_ns])
    evs: list = [tn.hello(d.rank, world, d.backend, job, t0)]
    evs += [GroupDef(g, list(r), d.backend or "?") for g, r in sorted(members.items())]
    p2p_seq: dict[tuple[str, int], int] = {}
    for i, e in enumerate(sorted(d.entries, key=lambda e: (e.t_created, e.record_id))):
        start = _start(e, i, d, members, p2p_seq)
        if start is None:
            continue
        evs.append(start)
        if _done(e, d.rank, members.get(e.group, []), reached, d.tracks_completion):
            evs.append(OpEnd(i, max(e.t_completed, e.t_created)))
        elif e.frames:
            evs.append(Stack(d.written_ns, i, e.thread, [Frame(str(f.get("filename", "?")), _int(f.get("line")),
                                                               str(f.get("name", ""))) for f in reversed(e.frames)]))
    evs.append(Counters(d.written_ns))  # the dump's moment: the last this rank was heard from
    return Batch(SCHEMA_VERSION, d.rank, evs)


def _start(e: Entry, op_id: int, d: Dump, members: dict[str, list[int]], p2p_seq: dict) -> OpStart | None:
    sizes = e.out_sizes if tn.payload_from_output(e.op) else e.in_sizes
    nbytes = _numel(sizes) * e.itemsize
    shape = sizes[0] if len(sizes) == 1 else []
    if not e.is_p2p:
        return OpStart(op_id, e.t_created, e.op, e.group, e.seq - 1, nbytes, e.dtype, shape)
    group = members.get(e.group, [])
    if not 0 <= e.peer_group_rank < len(group):
        return None  # a peer we cannot place
    peer = group[e.peer_group_rank]
    direction = "send" if e.op in ("send", "isend") else "recv"
    k = p2p_seq[(direction, peer)] = p2p_seq.get((direction, peer), -1) + 1
    return OpStart(op_id, e.t_created, direction, e.group, k, nbytes, e.dtype, shape, peer=peer)


def _notes(dumps: dict[int, Dump], groups: _Groups) -> list[str]:
    notes = []
    untracked = sorted(d.rank for d in dumps.values() if d.entries and not d.tracks_completion)
    if untracked:
        notes.append(f"flight recorder of rank(s) {_ranks(untracked)} does not record completion: an op counts as "
                     "done once every member of its group reached it or a later one; latencies and bandwidths "
                     "read 0 (no completion times)")
    if any(d.backend == "gloo" for d in dumps.values()):
        notes.append("gloo's flight recorder does not record send/recv: point-to-point ops are not in these files")
    for g in sorted(groups.inferred):
        notes.append(f"group {g}: members {_ranks(groups.members[g])} inferred from the ranks whose dump holds "
                     "its entries (the recorder left its ranks empty)")
    for d in sorted(dumps.values(), key=lambda d: d.rank):
        if d.skipped:
            notes.append(f"rank {d.rank}: {d.skipped} malformed flight-recorder entries skipped")
    return notes


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))
