"""Names of torch objects as events carry them ("float32", "SUM"), cached: str()
of a dtype or ReduceOp costs more than the rest of an op's record."""

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
