"""Event schema shared by the probe, the wire, trace files and the model.

Events are msgspec Structs in one tagged union so a frame decodes with a single typed
decoder: anything that does not match the schema is rejected on decode, never half
trusted. Structs are array-like to keep frames small (the probe sends every op).

Schema evolution rule: new fields are appended with defaults, so an older reader
ignores nothing it needs and a newer reader fills the gaps. A new event kind raises
`SCHEMA_VERSION`; a frame is stamped with the lowest version that has every kind it
carries (`encode_batch(..., schema=)`: the writer of a new kind says so, the probe's
hot path does not scan its batches), so the probe's ordinary frames stay readable by
older watchers and only a frame with a new kind is refused (with the upgrade hint) by
a reader older than it.

Versions: 1 the first; 2 adds `Stopped` (the watcher stopped the job), `Audit` and
`HostTopology`; 3 adds `NcclComm` and `NcclOp` (NCCL's own view, from its profiler
plugin).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

# Every int on the wire and in a file must fit the model's int64 columns (msgpack can
# carry up to 2**64 - 1): a larger one is refused on decode, as a bad frame, rather
# than failing the batch it lands in.
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]

SCHEMA_VERSION = 3

# Monotonic nanoseconds are per host; `Hello.wall_ns - Hello.mono_ns` is the offset
# that turns them into wall-clock nanoseconds so several hosts line up.


class Hello(msgspec.Struct, tag="hello", array_like=True, omit_defaults=True):
    rank: I64
    local_rank: I64
    world_size: I64
    host: str
    pid: I64
    backend: str
    device: str
    torch_version: str
    commviz_version: str
    job: str
    mono_ns: I64
    wall_ns: I64
    cuda_uuid: str | None = None
    pci_bus_id: str | None = None
    ring: str = ""  # this rank's crash ring (trace/ring.py), for the watcher on the same host


class GroupDef(msgspec.Struct, tag="group", array_like=True, omit_defaults=True):
    group: str
    ranks: list[I64]
    backend: str
    name: str = ""


class OpStart(msgspec.Struct, tag="start", array_like=True, omit_defaults=True, gc=False):
    """A rank entered an op. `seq` counts top-level collectives per group; for
    point-to-point ops it counts per (direction, peer) so the k-th send a→b pairs
    with the k-th recv on b from a."""

    id: I64
    t: I64
    op: str
    group: str
    seq: I64
    bytes: I64
    dtype: str = ""
    shape: list[I64] = []
    peer: I64 = -1
    root: I64 = -1
    is_async: bool = False
    reduce_op: str = ""
    batched: bool = False  # one P2POp of a batch_isend_irecv
    bucket: I64 = -1  # DDP gradient bucket index (op "ddp_bucket")
    params: I64 = 0  # parameters in that bucket


class OpEnd(msgspec.Struct, tag="end", array_like=True, omit_defaults=True, gc=False):
    """The op finished (or failed). `bytes`/`peer` >= 0 override the start's when
    they are only known at the end (object collectives, recv from any source).

    CUDA ops: `t` is when the probe saw the op complete (host clock, within a poll of
    it). `device_ns` >= 0 is the op's duration on the GPU: NCCL's own timing where the
    job keeps it (TORCH_NCCL_ENABLE_TIMING=1), else CUDA events recorded on the
    tensor's stream before and after it, counted from the previous op's end on the
    same communicator where that was later: queueing behind earlier kernels and ops
    is excluded, waiting for peers and the transfer are in it (docs/NUMBERS.md). `enqueue_ns` is the host
    time the call took to return (the launch). `captured`: the op was recorded into a
    CUDA graph: nothing ran then, it runs at each replay of the graph. `first`: the
    first op this rank ran on its communicator, whose time is mostly NCCL setting the
    communicator up (it does so lazily); time statistics leave it out."""

    id: I64
    t: I64
    error: str = ""
    bytes: I64 = -1
    peer: I64 = -1
    device_ns: I64 = -1
    enqueue_ns: I64 = -1
    captured: bool = False
    first: bool = False


# The probe queues ops as plain tuples in the array-like encoding of OpStart and
# OpEnd (tag first, then the fields in order), so they are encoded as they are: no
# Struct is built per op. This is that one layout; code that builds or reads a
# queued record uses these names (the hot path in probe/patch.py builds it inline;
# tests/trace/test_ring.py and tests/probe/test_patch_fake_pg.py pin that both
# decode as the events).
START = OpStart.__struct_config__.tag
END = OpEnd.__struct_config__.tag
_AT = {f: i + 1 for i, f in enumerate(OpStart.__struct_fields__)}
S_ID, S_T, S_BYTES, S_DTYPE, S_SHAPE = _AT["id"], _AT["t"], _AT["bytes"], _AT["dtype"], _AT["shape"]
E_ID, E_T = 1 + OpEnd.__struct_fields__.index("id"), 1 + OpEnd.__struct_fields__.index("t")
E_ERROR = 1 + OpEnd.__struct_fields__.index("error")


def start_record(op_id: int, t: int, op: str, group: str, seq: int, nbytes: int, dtype: str = "", shape=(),
                 peer: int = -1, root: int = -1, is_async: bool = False, reduce_op: str = "",
                 batched: bool = False, bucket: int = -1, params: int = 0) -> tuple:
    """An OpStart as the probe queues it (trailing defaults left off, as msgspec would)."""
    rec = (START, op_id, t, op, group, seq, nbytes, dtype, shape, peer, root, is_async, reduce_op)
    if bucket >= 0 or params:
        return rec + (batched, bucket, params)
    return rec + (True,) if batched else rec


def end_record(op_id: int, t: int, error: str = "", nbytes: int = -1, peer: int = -1, device_ns: int = -1,
               enqueue_ns: int = -1, captured: bool = False, first: bool = False) -> tuple:
    """An OpEnd as the probe queues it; the CUDA fields only when set."""
    if first:
        return (END, op_id, t, error, nbytes, peer, device_ns, enqueue_ns, captured, True)
    if captured:
        return (END, op_id, t, error, nbytes, peer, device_ns, enqueue_ns, True)
    if device_ns >= 0 or enqueue_ns >= 0:
        return (END, op_id, t, error, nbytes, peer, device_ns, enqueue_ns)
    return (END, op_id, t, error, nbytes, peer)


class Sample(msgspec.Struct, tag="sample", array_like=True, omit_defaults=True):
    t: I64
    values: dict[str, float] = {}


class Mark(msgspec.Struct, tag="mark", array_like=True, omit_defaults=True):
    t: I64
    text: str


class Counters(msgspec.Struct, tag="counters", array_like=True, omit_defaults=True):
    """Probe health, sent periodically: totals since the rank started."""

    t: I64
    dropped: I64 = 0
    internal_errors: I64 = 0
    trace_errors: I64 = 0
    # events left out while a watcher was connected but not taking them (its credit
    # window full, the backlog over its bound): the watcher is behind, so it sheds
    # detail. Traced or not, unlike `dropped`; a watcher older than this field skips it.
    # A watcher counts its rises from the first Counters it gets: what the probe left
    # out before it connected was another watcher's loss.
    behind: I64 = 0


class Goodbye(msgspec.Struct, tag="bye", array_like=True, omit_defaults=True):
    t: I64
    dropped: I64 = 0
    reason: str = "exit"


class Stopped(msgspec.Struct, tag="stopped", array_like=True, omit_defaults=True):
    """The watcher stopped the job (`record --hang-timeout`, Ctrl-C): written into the
    trace under each rank, in that rank's clock, just before the signal, so a post-mortem
    says who ended the ranks rather than blaming them for dying. `after_s` is the wait
    that made it stop (the hang timeout), 0 when it was asked to."""

    t: I64
    by: str  # "commviz record"
    reason: str = ""  # the diagnosis kinds, or "Ctrl-C"
    after_s: float = 0.0

    def text(self) -> str:
        after = f" after {self.after_s:g} s" if self.after_s else ""
        why = f" ({self.reason})" if self.reason else ""
        return f"stopped by {self.by}{after}{why}"


class Frame(msgspec.Struct, array_like=True, omit_defaults=True):
    """One Python frame of a captured stack: where the code was, not its locals."""

    file: str
    line: I64
    function: str = ""
    text: str = ""  # the source line, stripped, when the probe could read it


QUIET_OP = -1  # Stack.op_id of a stack taken because the rank started no op for a while


class Stack(msgspec.Struct, tag="stack", array_like=True, omit_defaults=True):
    """The Python stack of the thread that called op `op_id`, captured by the probe
    when the rank has been inside that op longer than its threshold (a background
    thread can read it: the GIL is released while the backend waits). `op_id`
    QUIET_OP: one of every thread's stacks, taken together at time `t` because the
    rank had started no op for that long — in an op or not.

    `frames` are outermost first, innermost last, as `traceback.extract_stack` gives
    them. `lib_dirs` are this rank's directories whose frames are not the user's code
    (torch's and commviz's package directories, the standard library): the watcher
    may run elsewhere, so only the rank knows them; the model also recognises the
    usual layouts by path when they are absent."""

    t: I64
    op_id: I64
    thread: str = ""
    frames: list[Frame] = []
    lib_dirs: list[str] = []


class BackendOp(msgspec.Struct, array_like=True):
    """One entry of torch's flight recorder: the group's name, the op as the recorder
    names it (without its `gloo:`/`nccl:` prefix) and when the backend was handed it
    (wall-clock ns, the recorder's clock)."""

    group: str
    op: str
    t_wall: I64


class Audit(msgspec.Struct, tag="audit", array_like=True, omit_defaults=True):
    """What this rank's backend ran, read from torch's flight recorder at `t`
    (`wall_ns` is the wall clock at that moment: it places the recorder's times on
    this rank's clock). `state` says why there is nothing to compare (recorder off,
    empty, wrapped, unreadable); then `ops` is empty."""

    t: I64
    wall_ns: I64
    state: str = ""
    ops: list[BackendOp] = []


class HostTopology(msgspec.Struct, tag="topology", array_like=True, omit_defaults=True):
    """The GPU topology of the host a rank runs on (`host` as in its Hello), as
    `commviz topo --json` prints it, sent once by each host's local rank 0 after it
    has read NVML: the watcher maps each host's ranks against their own host's GPUs,
    not against the machine it runs on."""

    t: I64
    host: str
    document: dict[str, Any] = {}


class NcclComm(msgspec.Struct, tag="ncclcomm", array_like=True, omit_defaults=True):
    """A communicator NCCL created (or, with `ended`, finalized) in this rank's process,
    as commviz's NCCL profiler plugin saw it (probe/_ncclprof.c). `comm` is NCCL's
    commHash in hex, the name its logs and flight-recorder dumps use."""

    t: I64
    comm: str
    rank: I64
    nranks: I64
    nodes: I64 = 1
    name: str = ""
    ended: bool = False


class NcclOp(msgspec.Struct, tag="ncclop", array_like=True, omit_defaults=True):
    """One operation NCCL ran, as its profiler plugin saw it: every collective and
    send/recv on any communicator of this process, whoever issued it (torch's Python
    API, a C++ comm hook, vLLM's ctypes calls, a CUDA-graph replay). Sent once the op is
    done: when every channel's kernel has reported its end, or at enqueue when NCCL
    reports no kernel. `t` is when NCCL started enqueueing it (the probe's clock);
    `device_ns` spans the first channel's start to the last one's stop on the GPU's own
    timer; `replays` counts a captured op's graph replays this event stands for."""

    t: I64
    comm: str
    func: str
    count: I64
    dtype: str = ""
    bytes: I64 = -1
    seq: I64 = -1
    peer: I64 = -1
    root: I64 = -1
    algo: str = ""
    proto: str = ""
    channels: I64 = 0
    enqueue_ns: I64 = -1
    device_ns: I64 = -1
    done_t: I64 = -1
    captured: bool = False
    replays: I64 = 0


Event = Union[Hello, GroupDef, OpStart, OpEnd, Sample, Mark, Counters, Goodbye, Stack, Stopped, Audit, HostTopology,
              NcclComm, NcclOp]
BASE_SCHEMA = 1  # the version of every kind but those below
STOPPED_SINCE = 2
AUDIT_SINCE = 2
HOST_TOPOLOGY_SINCE = 2
NCCL_SINCE = 3  # NcclComm, NcclOp: NCCL's own view, from its profiler plugin


class Batch(msgspec.Struct, array_like=True):
    """One frame: a run of events from one rank. The rank lives here once rather
    than in every event."""

    schema: I64
    rank: I64
    events: list[Event]


def batch_len(b) -> int:
    """How many events a decoded frame holds: a `Batch`, or a frame read into columns
    (`model.store.ColFrame`, whose `count` says it without making its events)."""
    n = getattr(b, "count", None)
    return len(b.events) if n is None else n


class FrameError(ValueError):
    """A frame that is not a valid batch; the message says why."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Batch)
_head_decoder = msgspec.msgpack.Decoder(tuple[int, int, list[msgspec.Raw]])


def _msgspec_batch(schema: int, rank: int, events: list, _encode_one=None) -> bytes:
    return _encoder.encode(Batch(schema, rank, events))


class _Folded:
    """The first item of a folded op's record (below); compared by identity."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FOLDED"


# A blocking op's start with its end folded in (probe/_fastwrap.c, where FOLDS): the
# start's list of START_LEN items with FOLDED in place of START, and the end's time
# after them. It stands for the start and its end_record(id, time): the frame
# encoder writes the two events, events_in() counts both, cuts() keeps them in
# one frame.
FOLDED = _Folded()
START_LEN = len(start_record(0, 0, "", "", 0, 0))
FOLDS = False


def is_folded(ev) -> bool:
    return type(ev) is list and len(ev) == START_LEN + 1 and ev[0] is FOLDED


def unfold(events: list) -> list:
    """`events` with each folded op as its two records."""
    out = []
    for ev in events:
        if is_folded(ev):
            out.append([START, *ev[1:START_LEN]])
            out.append(end_record(ev[S_ID], ev[START_LEN]))
        else:
            out.append(ev)
    return out


def events_in(events: list) -> int:
    return len(events)


def cuts(events: list, most: int) -> list[int]:
    """Where to cut `events` into runs that stand for at most `most` events."""
    return list(range(most, len(events), most)) + ([len(events)] if events else [])


def _fold(c_encode, set_fold) -> bool:
    """Folding on where the C encoder writes folded ops as msgspec writes their two
    records; off (nothing is folded) where not."""
    end = end_record(0, 0)
    if (E_ID, E_T) != (1, 2) or len(end) >= 16 or START_LEN >= 16 or not 0 < S_ID < START_LEN:
        return False
    enc = _encoder.encode
    set_fold(FOLDED, bytes([0x90 | START_LEN]) + enc(START), bytes([0x90 | len(end)]) + enc(END),
             b"".join(enc(v) for v in end[E_T + 1 :]), START_LEN, S_ID)
    folded = [FOLDED, 2**40, 2**62, "all_reduce", "0", 300, 70_000, "bfloat16", (8, 1024), -40, -1, True, "SUM",
              2**62 + 5]
    sample = [folded, end_record(7, 8), [*folded[:START_LEN], -(2**40)], GroupDef("g", [0, 1], "gloo"),
              [START, *folded[1:START_LEN]], [FOLDED, 1, 2, "é", "", 0, 0, "", [], -1, -1, False, "", 1],
              [*folded[:START_LEN], True]]  # a batched start's flag, not a time: not folded
    try:
        ok = (c_encode(3, 70_000, sample[:-1], enc) == _msgspec_batch(3, 70_000, unfold(sample[:-1]))
              and c_encode(3, 70_000, sample[-1:], enc) is NotImplemented)
    except Exception:
        ok = False
    if not ok:
        set_fold(None, b"", b"", b"", 0, 0)
    return ok


def _c_batch_encoder():
    """commviz/_fastpack.c's frame encoder (the probe's records packed without Python
    per value) where it is built and writes, for a frame of every kind of record, the
    bytes msgspec writes; else msgspec's. msgspec encodes what it hands back (a
    frame whose head is not a list and two 64-bit ints)."""
    global FOLDS, events_in, cuts
    from commviz import native

    fp = native.load("commviz._fastpack")
    if fp is None:
        return _msgspec_batch
    c_cuts, c_encode, c_events_in, set_fold = fp.cuts, fp.encode_batch, fp.events_in, fp.set_fold
    sample = [start_record(2**40, 2**62, "all_reduce", "0", 300, 70_000, "bfloat16", (8, 1024), peer=-40,
                           is_async=True, reduce_op="SUM"), end_record(2**40, -(2**40), "x" * 40, 5),
              GroupDef("g", [0, 1], "gloo"), [START, 1, 2, "é", "", 0, 0, "", [], -1, -1, False, ""]]
    try:
        if c_encode(3, 70_000, sample, _encoder.encode) != _msgspec_batch(3, 70_000, sample):
            native.declined("commviz._fastpack", "its frames differ from msgspec's")
            return _msgspec_batch
    except Exception as exc:
        native.declined("commviz._fastpack", f"it failed on a sample frame ({exc})")
        return _msgspec_batch
    FOLDS = _fold(c_encode, set_fold)
    if FOLDS:
        events_in, cuts = c_events_in, c_cuts

    def encode(schema: int, rank: int, events: list, encode_one) -> bytes:
        out = c_encode(schema, rank, events, encode_one)
        return _msgspec_batch(schema, rank, unfold(events)) if out is NotImplemented else out

    return encode


def encode_batch(rank: int, events: list, schema: int = BASE_SCHEMA) -> bytes:
    """`schema`: the lowest version that has every kind in `events` (`STOPPED_SINCE`
    for a `Stopped`)."""
    return _encode_batch(schema, rank, events, _encoder.encode)


# The largest frame on the wire. A watcher's memory for peers that do not follow the
# protocol is a few frames per connection, so this bounds it; a batch of 4,096 ops is
# ~200 KB (sent as two frames), a host's topology ~20 KB. Trace files allow more
# (trace/file.py).
MAX_WIRE_FRAME = 128 * 1024


_encode_batch = _c_batch_encoder()


def encode_frames(rank: int, events: list, schema: int = BASE_SCHEMA, limit: int = MAX_WIRE_FRAME):
    """`events` as frames of at most `limit` bytes, in order: (payload, events in it).
    A run too big is cut into pieces that should fit by its bytes per event (each
    piece checked the same way); a single event bigger than the limit comes as
    (None, 1), for the caller to count as lost. Callers size their runs to fit (the
    sender's MAX_BATCH), so the first encoding is nearly always the only one."""
    payload = encode_batch(rank, events, schema)
    if len(payload) <= limit:
        yield payload, events_in(events)
    elif len(events) == 1 and is_folded(events[0]):  # its end goes on its own
        yield from encode_frames(rank, unfold(events), schema, limit)
    elif len(events) == 1:
        yield None, 1
    else:
        n = min(len(events) // 2, max(1, len(events) * limit * 9 // (10 * len(payload))))
        for i in range(0, len(events), n):
            yield from encode_frames(rank, events[i : i + n], schema, limit)


def _newer(schema: int) -> FrameError:
    return FrameError(
        f"frame uses event schema {schema}, this commviz reads up to "
        f"{SCHEMA_VERSION}: upgrade commviz (pip install -U commviz)"
    )


def decode_batch(data: bytes) -> Batch:
    """Decode and validate one frame; raise FrameError with a reason a person can act on."""
    try:
        batch = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        # An event kind we do not know, in a frame from a newer writer: say so.
        try:
            schema = _head_decoder.decode(data)[0]
        except (msgspec.DecodeError, IndexError):
            schema = 0
        if schema > SCHEMA_VERSION:
            raise _newer(schema) from None
        raise FrameError(f"undecodable frame ({len(data)} bytes): {exc}") from None
    if batch.schema > SCHEMA_VERSION:
        raise _newer(batch.schema)
    if batch.rank < 0:
        raise FrameError(f"frame names a negative rank ({batch.rank})")
    return batch
