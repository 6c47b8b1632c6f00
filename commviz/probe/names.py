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


# A compressed sparse layout's index tensors, by layout name (values come on top).
_COMPRESSED = {"sparse_csr": ("crow_indices", "col_indices"), "sparse_csc": ("ccol_indices", "row_indices"),
               "sparse_bsr": ("crow_indices", "col_indices"), "sparse_bsc": ("ccol_indices", "row_indices")}


def tensor_nbytes(x) -> int:
    """The bytes an op moves of `x`. A sparse tensor has no `nbytes` (torch raises):
    its indices and values are what a backend sends (gloo's sparse all_reduce
    all-gathers both). Callers on the hot path read `x.nbytes` and come here only when
    it raises."""
    try:
        return x.nbytes
    except RuntimeError:
        layout = str(x.layout).replace("torch.", "")
        if layout == "sparse_coo":
            return x._indices().nbytes + x._values().nbytes
        parts = _COMPRESSED.get(layout)
        if parts is None:
            raise
        return sum(getattr(x, p)().nbytes for p in parts) + x.values().nbytes
