"""The batch path's grouping of keys answers exactly as `np.unique` does."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commviz.model.keys import unique, unique_sorted

ints = st.lists(st.integers(-(1 << 62), 1 << 62) | st.integers(0, 20), max_size=300)


@settings(max_examples=300, deadline=None)
@given(ints)
def test_unique_is_numpys(xs):
    a = np.array(xs, np.int64)
    want = np.unique(a, return_index=True, return_inverse=True, return_counts=True)
    got = unique(a, index=True, inverse=True, counts=True)
    for w, g in zip(want, got):
        assert np.array_equal(w, g) and w.dtype == g.dtype and w.shape == g.shape
    assert np.array_equal(unique(a), np.unique(a))
    s = np.sort(a)
    for w, g in zip(np.unique(s, return_index=True, return_counts=True), unique_sorted(s, index=True, counts=True)):
        assert np.array_equal(w, g)


@pytest.mark.parametrize("n", [0, 1])
def test_unique_of_nothing_or_one(n):
    a = np.arange(n, dtype=np.int64)
    keys, first, inv, cnt = unique(a, index=True, inverse=True, counts=True)
    assert keys.tolist() == a.tolist() and inv.tolist() == list(range(n)) and cnt.tolist() == [1] * n
