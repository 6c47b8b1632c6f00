"""What torch's own files call things, in commviz's words: dtype names and sizes, op
names, the bytes rule (docs/ARCHITECTURE.md) applied to sizes a file lists, and the group-ranks
strings the files carry ("[0, 1, 2]"), parsed — never evaluated."""

from __future__ import annotations

import re

from commviz.events import Hello

# c10 ScalarType names (flight recorder, profiler "dtype") and C++ type names
# (profiler "Input type") -> (torch dtype name, bytes per element)
_DTYPES: dict[str, tuple[str, int]] = {}
for _names, _torch, _size in [
    (("Float", "float"), "float32", 4),
    (("Double", "double"), "float64", 8),
    (("Half", "c10::Half"), "float16", 2),
    (("BFloat16", "c10::BFloat16"), "bfloat16", 2),
    (("Long", "long int", "long", "int64_t"), "int64", 8),
    (("Int", "int"), "int32", 4),
    (("Short", "short int", "short"), "int16", 2),
    (("Char", "signed char", "int8_t"), "int8", 1),
    (("Byte", "unsigned char", "uint8_t"), "uint8", 1),
    (("Bool", "bool"), "bool", 1),
    (("ComplexHalf", "c10::complex<c10::Half>"), "complex32", 4),
    (("ComplexFloat", "c10::complex<float>"), "complex64", 8),
    (("ComplexDouble", "c10::complex<double>"), "complex128", 16),
    (("UInt16",), "uint16", 2),
    (("UInt32",), "uint32", 4),
    (("UInt64",), "uint64", 8),
    (("Float8_e4m3fn", "c10::Float8_e4m3fn"), "float8_e4m3fn", 1),
    (("Float8_e5m2", "c10::Float8_e5m2"), "float8_e5m2", 1),
    (("Float8_e4m3fnuz",), "float8_e4m3fnuz", 1),
    (("Float8_e5m2fnuz",), "float8_e5m2fnuz", 1),
]:
    for _n in _names:
        _DTYPES[_n] = (_torch, _size)


def dtype(name: object) -> tuple[str, int] | None:
    """(torch name, item size) for a dtype as a file spells it; None if unknown."""
    return _DTYPES.get(name) if isinstance(name, str) else None


# Backend and profiler op names -> the catalogue's name for the same collective, so
# busbw factors and desync checks apply. Names not listed are kept as the file says.
_ALIASES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "_allgather_base": "_all_gather_base",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_coalesced",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "recvAnySource": "recv",
    "recv_any_source": "recv",
    "monitored_barrier": "monitored_barrier",
}


def op_name(raw: str) -> str:
    """`gloo:all_reduce`, `nccl:_allgather_base`, `allreduce` → the catalogue name."""
    name = raw.split(":", 1)[1] if ":" in raw else raw
    name = name.split(" ", 1)[0]  # "send 0->1"
    return _ALIASES.get(name, name)


_GATHERED = {"all_gather", "_all_gather_base", "all_gather_into_tensor", "all_gather_coalesced", "gather"}


def payload_from_output(op: str) -> bool:
    """Whether the bytes rule reads the output (gathered total) rather than the input."""
    return op in _GATHERED


_RANKS = re.compile(r"\[\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\]")
MAX_GROUP = 1 << 20


def parse_ranks(text: object) -> list[int] | None:
    """`"[0, 1, 2]"` (or a list of ints) → [0, 1, 2]; None for anything else."""
    if isinstance(text, list):
        if len(text) <= MAX_GROUP and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_GROUP for x in text):
            return list(text)
        return None
    if not isinstance(text, str) or len(text) > 16 * MAX_GROUP or not _RANKS.fullmatch(text.strip()):
        return None
    ranks = [int(x) for x in re.findall(r"\d+", text)]
    return ranks if all(r < MAX_GROUP for r in ranks) else None


def hello(rank: int, world: int, backend: str, job: str, t0: int) -> Hello:
    """The hello a rank of torch's files never said: times in these files are already
    wall-clock ns, so the offset is 0, and the rank appears when its first op does."""
    return Hello(rank, -1, world, "", 0, backend or "?", "cuda" if backend == "nccl" else "cpu", "", "", job, t0, t0)
