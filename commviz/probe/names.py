"""Names of torch objects as events carry them ("float32", "SUM"), cached: str()
of a dtype or ReduceOp costs more than the rest of an op's record; and the bytes of
any tensor."""

from __future__ import annotations

_DTYPE_NAMES: dict = {}
_REDUCE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    n = _DTYPE_NAMES.get(dtype)
    if n is None:
        n = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return n


def reduce_name(op) -> str:
    try:
        n = _REDUCE_NAMES.get(op)
    except TypeError:  # unhashable custom op
        return str(op)
    if n is None:
        n = _REDUCE_NAMES[op] = str(op).rsplit(".", 1)[-1]
    return n


def tensor_nbytes(x) -> int:
    """The bytes an op moves of `x`. A sparse COO tensor has no `nbytes` (torch
    raises): its indices and values are what a backend sends (gloo's sparse all_reduce
    all-gathers both). The per-op paths read `x.nbytes` themselves and come here only
    when it raises; the rest (object and list ops, buckets, the drain) come here."""
    try:
        return x.nbytes
    except RuntimeError:
        if not x.is_sparse:  # COO; torch's compressed layouts have an nbytes
            raise
        return x._indices().nbytes + x._values().nbytes
