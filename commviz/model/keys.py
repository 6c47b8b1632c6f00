"""Grouping int64 keys, as `np.unique` does, for the batch path's columns.

`np.unique` sorts with quicksort. A batch's keys come as runs already in order (a
rank's frame holds its ops by id, a collective's seqs rise), and numpy's stable sort
(timsort for int64) finds those runs: the same answer in about half the time on the
watcher's batches (bench/ingest_model.py)."""

from __future__ import annotations

import numpy as np


def unique(keys: np.ndarray, index: bool = False, inverse: bool = False, counts: bool = False):
    """`np.unique(keys, return_index=index, return_inverse=inverse, return_counts=counts)`
    for a 1-D integer array: the sorted distinct keys, then what was asked for, in that
    order (`index`: each key's first position, as the stable sort gives it)."""
    if keys.ndim != 1:
        raise ValueError("keys.unique groups 1-D keys only")
    n = len(keys)
    if not n:
        e = np.zeros(0, np.intp)
        return (keys[:0],) + (e,) * (index + inverse + counts) if index or inverse or counts else keys[:0]
    order = np.argsort(keys, kind="stable")
    s = keys[order]
    head = np.empty(n, bool)
    head[0] = True
    np.not_equal(s[1:], s[:-1], out=head[1:])
    out = [s[head]]
    if index:
        out.append(order[head])
    if inverse:
        inv = np.empty(n, np.intp)
        inv[order] = np.cumsum(head) - 1
        out.append(inv)
    if counts:
        out.append(np.diff(np.append(np.flatnonzero(head), n)))
    return tuple(out) if len(out) > 1 else out[0]


def unique_sorted(keys: np.ndarray, index: bool = False, counts: bool = False):
    """`unique` for keys already in ascending order (a column after the sort of a
    key it leads), where even a stable sort would be a pass for nothing."""
    n = len(keys)
    head = np.empty(n, bool)
    if n:
        head[0] = True
        np.not_equal(keys[1:], keys[:-1], out=head[1:])
    first = np.flatnonzero(head)
    out = [keys[first]]
    if index:
        out.append(first)
    if counts:
        out.append(np.diff(np.append(first, n)))
    return tuple(out) if len(out) > 1 else out[0]
