"""The audit where people read it: unseen collectives named under the rank table, a
recorder that could not be compared said once per reason, and a dashboard alert."""

from commviz.report import render_summary
from commviz.model.document import RankRow
from commviz.view.alerts import alert_rows


def doc(per_rank):
    return {"world_size": 2, "backend": "gloo", "ranks": [], "ops": [], "per_rank": per_rank, "diagnoses": []}


def test_unseen_ops_are_named_under_the_rank_table():
    text = render_summary(doc([
        {"rank": 0, "ops": {}, "audit": {"backend": {"all_reduce": 3, "broadcast": 1},
                                         "seen": {"all_reduce": 1, "broadcast": 1}, "unseen": {"all_reduce": 2}}},
        {"rank": 1, "ops": {}, "audit": {"backend": {"all_reduce": 1}, "seen": {"all_reduce": 1}, "unseen": {}}},
    ]))
    assert "rank 0: unseen by commviz: 2 all_reduce of 4 backend ops" in text
    assert "rank 1:" not in text


def test_ranks_that_could_not_be_audited_share_a_line():
    text = render_summary(doc([{"rank": r, "ops": {}, "audit": {"state": "off: recorder off"}} for r in (0, 1)]))
    assert "audit of ranks 0,1: off: recorder off" in text


def test_the_dashboard_alerts_on_a_rank_with_unseen_collectives():
    rows = alert_rows([], [RankRow(3, unseen={"broadcast": 1}), RankRow(0)], 0, "")
    [row] = rows
    assert row.key == "unseen:3" and row.kind == "unseen" and row.where == "rank 3"
    assert "rank 3's backend ran collectives commviz did not see: 1 broadcast" in row.message
