"""The links panel's utilisation figure."""

from commviz.tui.widgets.links import util_text


def test_utilisation_under_one_percent_still_says_how_much_in_five_columns():
    """A CPU lesson on a simulated DGX moves MB/s over GB/s links: the ratio between
    edges must stay visible (0.1% on PCIe against 0.01% on NVLink)."""
    assert [util_text(f) for f in (0, 0.5, 0.012, 0.0011, 0.00011, 0.000016)] == [
        "  0%", " 50%", "  1%", "0.1%", "0.01%", "<.01%"]
    assert max(len(util_text(f / 1e6)) for f in range(1, 10**6, 997)) <= 5
