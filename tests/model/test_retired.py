"""The keys a shedding model has counted: a floor and the few above a gap, bounded."""

import numpy as np

from commviz.model import retired
from commviz.model.retired import Retired


def test_keys_in_order_move_the_floor_and_a_gap_holds_the_rest_until_filled():
    rt = Retired()
    for s in (0, 1, 2, 5, 6):
        rt.add(s)
    assert rt.floor == 2 and rt.above == {5, 6}
    assert 1 in rt and 5 in rt and 3 not in rt and 7 not in rt
    rt.add_many(np.array([4, 3, 3, 9], np.int64))
    assert rt.floor == 6 and rt.above == {9}
    assert rt.mask(np.array([0, 6, 7, 9, 10])).tolist() == [True, True, False, True, False]


def test_a_spell_starts_above_what_was_folded_before_it():
    rt = Retired()
    rt.add_many(np.array([10, 11, 20], np.int64))
    rt.raise_floor(15)
    assert rt.floor == 15 and rt.above == {20}
    rt.raise_floor(5)  # never lowered
    assert rt.floor == 15


def test_memory_stays_bounded_past_many_gaps(monkeypatch):
    monkeypatch.setattr(retired, "MAX_ABOVE", 100)
    rt = Retired()
    for s in range(1, 1000, 2):  # every other key: a gap each
        rt.add(s)
    assert len(rt.above) <= 100
    rt.add_many(np.arange(2001, 3001, 2, dtype=np.int64))
    assert len(rt.above) <= 100 and 2999 in rt
