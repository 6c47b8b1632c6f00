"""Event schema shared by the probe, the wire, trace files and the model.

Events are msgspec Structs in one tagged union so a frame decodes with a single typed
decoder: anything that does not match the schema is rejected on decode, never half
trusted. Structs are array-like to keep frames small (the probe sends every op).

Schema evolution rule: new fields are appended with defaults, so an older reader
ignores nothing it needs and a newer reader fills the gaps. A reader refuses a frame
whose schema version is newer than its own (`SCHEMA_VERSION`).
"""

from __future__ import annotations

from typing import Union

import msgspec

SCHEMA_VERSION = 1

# Monotonic nanoseconds are per host; `Hello.wall_ns - Hello.mono_ns` is the offset
# that turns them into wall-clock nanoseconds so several hosts line up.


class Hello(msgspec.Struct, tag="hello", array_like=True, omit_defaults=True):
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    backend: str
    device: str
    torch_version: str
    commviz_version: str
    job: str
    mono_ns: int
    wall_ns: int
    cuda_uuid: str | None = None
    pci_bus_id: str | None = None
    ring: str = ""  # this rank's crash ring (trace/ring.py), for the watcher on the same host


class GroupDef(msgspec.Struct, tag="group", array_like=True, omit_defaults=True):
    group: str
    ranks: list[int]
    backend: str
    name: str = ""


class OpStart(msgspec.Struct, tag="start", array_like=True, omit_defaults=True):
    """A rank entered an op. `seq` counts top-level collectives per group; for
    point-to-point ops it counts per (direction, peer) so the k-th send a→b pairs
    with the k-th recv on b from a."""

    id: int
    t: int
    op: str
    group: str
    seq: int
    bytes: int
    dtype: str = ""
    shape: list[int] = []
    peer: int = -1
    root: int = -1
    is_async: bool = False
    reduce_op: str = ""
    batched: bool = False  # one P2POp of a batch_isend_irecv
    bucket: int = -1  # DDP gradient bucket index (op "ddp_bucket")
    params: int = 0  # parameters in that bucket


class OpEnd(msgspec.Struct, tag="end", array_like=True, omit_defaults=True):
    """The op finished (or failed). `bytes`/`peer` >= 0 override the start's when
    they are only known at the end (object collectives, recv from any source)."""

    id: int
    t: int
    error: str = ""
    bytes: int = -1
    peer: int = -1


class Sample(msgspec.Struct, tag="sample", array_like=True, omit_defaults=True):
    t: int
    values: dict[str, float] = {}


class Mark(msgspec.Struct, tag="mark", array_like=True, omit_defaults=True):
    t: int
    text: str


class Counters(msgspec.Struct, tag="counters", array_like=True, omit_defaults=True):
    """Probe health, sent periodically: totals since the rank started."""

    t: int
    dropped: int = 0
    internal_errors: int = 0
    trace_errors: int = 0


class Goodbye(msgspec.Struct, tag="bye", array_like=True, omit_defaults=True):
    t: int
    dropped: int = 0
    reason: str = "exit"


class Frame(msgspec.Struct, array_like=True, omit_defaults=True):
    """One Python frame of a captured stack: where the code was, not its locals."""

    file: str
    line: int
    function: str = ""
    text: str = ""  # the source line, stripped, when the probe could read it


class Stack(msgspec.Struct, tag="stack", array_like=True, omit_defaults=True):
    """The Python stack of the thread that called op `op_id`, captured by the probe
    when the rank has been inside that op longer than its threshold (a background
    thread can read it: the GIL is released while the backend waits).

    `frames` are outermost first, innermost last, as `traceback.extract_stack` gives
    them. `lib_dirs` are this rank's directories whose frames are not the user's code
    (torch's and commviz's package directories, the standard library): the watcher
    may run elsewhere, so only the rank knows them; the model also recognises the
    usual layouts by path when they are absent."""

    t: int
    op_id: int
    thread: str = ""
    frames: list[Frame] = []
    lib_dirs: list[str] = []


class BackendOp(msgspec.Struct, array_like=True):
    """One entry of torch's flight recorder: the group's name, the op as the recorder
    names it (without its `gloo:`/`nccl:` prefix) and when the backend was handed it
    (wall-clock ns, the recorder's clock)."""

    group: str
    op: str
    t_wall: int


class Audit(msgspec.Struct, tag="audit", array_like=True, omit_defaults=True):
    """What this rank's backend ran, read from torch's flight recorder at `t`
    (`wall_ns` is the wall clock at that moment: it places the recorder's times on
    this rank's clock). `state` says why there is nothing to compare (recorder off,
    empty, wrapped, unreadable); then `ops` is empty."""

    t: int
    wall_ns: int
    state: str = ""
    ops: list[BackendOp] = []


Event = Union[Hello, GroupDef, OpStart, OpEnd, Sample, Mark, Counters, Goodbye, Stack, Audit]


class Batch(msgspec.Struct, array_like=True):
    """One frame: a run of events from one rank. The rank lives here once rather
    than in every event."""

    schema: int
    rank: int
    events: list[Event]


class FrameError(ValueError):
    """A frame that is not a valid batch; the message says why."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Batch)


def encode_batch(rank: int, events: list) -> bytes:
    return _encoder.encode(Batch(SCHEMA_VERSION, rank, events))


def decode_batch(data: bytes) -> Batch:
    """Decode and validate one frame; raise FrameError with a reason a person can act on."""
    try:
        batch = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise FrameError(f"undecodable frame ({len(data)} bytes): {exc}") from None
    if batch.schema > SCHEMA_VERSION:
        raise FrameError(
            f"frame uses event schema {batch.schema}, this commviz reads up to "
            f"{SCHEMA_VERSION}: upgrade commviz (pip install -U commviz)"
        )
    if batch.rank < 0:
        raise FrameError(f"frame names a negative rank ({batch.rank})")
    return batch
