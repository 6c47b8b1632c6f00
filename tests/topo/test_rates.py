"""Counters to rates: NVML's cumulative KiB counters with per-value timestamps."""

from commviz.topo.fake import FakeNvml
from commviz.topo.presets import preset_fixture
from commviz.topo.rates import RateTracker

KIB = 1024


def test_rate_uses_the_readings_own_timestamps():
    r = RateTracker()
    assert r.update("l", 0, 1_000_000, scale=KIB) is None  # first reading: nothing to compare
    assert r.update("l", 25_000, 1_100_000, scale=KIB) == 25_000 * KIB / 0.1
    assert r.update("l", 25_000, 1_200_000, scale=KIB) == 0.0


def test_counter_reset_skips_that_interval_then_resumes():
    r = RateTracker()
    r.update("l", 10_000, 0)
    assert r.update("l", 20_000, 1_000_000) == 10_000.0
    assert r.update("l", 500, 2_000_000) is None  # went backwards: driver reload / GPU reset
    assert r.update("l", 1_500, 3_000_000) == 1_000.0


def test_wrap_is_a_skipped_interval_not_a_huge_rate():
    r = RateTracker()
    top = 2**64 - 100
    r.update("l", top, 0)
    assert r.update("l", 50, 1_000_000) is None
    assert r.update("l", 150, 2_000_000) == 100.0


def test_unavailable_readings_forget_the_key():
    r = RateTracker()
    r.update("l", 0, 0)
    assert r.update("l", None, 1_000_000) is None
    assert "l" not in r
    assert r.update("l", 5_000, 2_000_000) is None  # starts afresh, no rate across the gap
    assert r.update("l", 6_000, 3_000_000) == 1_000.0


def test_same_timestamp_repeats_the_last_rate_and_time_going_back_skips():
    r = RateTracker()
    r.update("l", 0, 0)
    assert r.update("l", 1_000, 1_000_000) == 1_000.0
    assert r.update("l", 1_000, 1_000_000) == 1_000.0  # NVML had not refreshed yet
    assert r.update("l", 2_000, 500_000) is None  # clock went backwards
    assert r.update("l", 3_000, 1_500_000) == 1_000.0


def test_keys_are_independent():
    r = RateTracker()
    r.update("a", 0, 0)
    r.update("b", 0, 0)
    assert r.update("a", 100, 1_000_000) == 100.0
    assert r.update("b", 300, 1_000_000) == 300.0


def test_scripted_fake_counters_wrap_reset_and_unsupported():
    fx = preset_fixture("dgx-h100")
    fx["counters"] = {"t_us": [0, 100_000, 200_000, 300_000, 400_000, 500_000],
                      "gpus": {"0": {"nvlink": {"3": {"tx_kib": [0, 2_441, 4_882, 10, 2_451, None],
                                                      "rx_kib": [0, 1_000, 2_000, 3_000, 4_000, 5_000]}}}}}
    b = FakeNvml(fx)
    r = RateTracker()
    got = []
    for _ in range(6):
        c = b.counters(0, [3])
        v, t = c["nvlink3.tx"] if c["nvlink3.tx"] else (None, None)
        got.append(r.update("tx", v, t))
    assert got[0] is None
    assert got[1] == got[2] == 2_441 * KIB / 0.1  # ~25 GB/s: one H100 link's line rate
    assert got[3] is None  # reset
    assert got[4] == 2_441 * KIB / 0.1
    assert got[5] is None  # not available at that step


def test_unsupported_counters_are_none_for_every_link():
    fx = preset_fixture("dgx-h100")
    fx["unsupported"] = ["nvlink_counters"]
    c = FakeNvml(fx).counters(0, list(range(18)))
    assert all(c[f"nvlink{lk}.{d}"] is None for lk in range(18) for d in ("tx", "rx"))
    assert c["pcie.tx"] is not None


def test_a_counter_that_wraps_at_its_width_is_unwrapped_not_dropped():
    """NVML's PCIe byte counters (fields 197/198) wrap; from the top half of the
    range to the bottom is a wrap, and the interval counts."""
    r = RateTracker()
    top = 2**32
    assert r.update("pcie", top - 1_000, 1_000_000, modulus=top) is None
    assert r.update("pcie", 3_000, 2_000_000, modulus=top) == 4_000.0


def test_a_reset_is_still_skipped_when_the_width_is_known():
    r = RateTracker()
    r.update("pcie", 1_000_000, 1_000_000, modulus=2**64)
    assert r.update("pcie", 10, 2_000_000, modulus=2**64) is None  # a driver reload, not a wrap
    assert r.update("pcie", 1_010, 3_000_000, modulus=2**64) == 1_000.0
