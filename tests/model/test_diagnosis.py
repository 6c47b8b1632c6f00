"""The typed findings: the JSON keys users script against, and the statuses views switch on."""

from commviz.model.diagnosis import Diagnosis, Kind, RankStatus


def test_to_json_keeps_the_summary_keys_in_order():
    d = Diagnosis(Kind.HANG, "0", 7, "all_reduce", [0, 1, 3], [2], [2], "rank 2 never entered it")
    j = d.to_json()
    assert list(j) == ["kind", "group", "seq", "op", "waiting_ranks", "missing_ranks", "culprit_ranks",
                       "message", "details", "stacks"]
    assert j["kind"] == "hang" and type(j["kind"]) is str


def test_kinds_in_order_and_what_stops_a_job():
    assert sorted(Kind, key=lambda k: k.order) == [Kind.DESYNC, Kind.DEAD_RANK, Kind.P2P_DEADLOCK, Kind.HANG,
                                                    Kind.STRAGGLER]
    assert [k for k in Kind if not k.blocks] == [Kind.STRAGGLER]
    assert {k for k in Kind if k.names_missing} == {Kind.HANG, Kind.P2P_DEADLOCK, Kind.DESYNC}


def test_rank_status_gone_and_severity():
    assert {s for s in RankStatus if s.gone} == {RankStatus.DEAD, RankStatus.EXITED}
    assert min(RankStatus, key=lambda s: s.severity) is RankStatus.DEAD
    assert RankStatus.MISSING == "missing"


def test_copy_does_not_share_details():
    d = Diagnosis(Kind.DESYNC, "0", 1, "all_reduce", [0], [], [1], "m", {"died": []})
    c = d.copy()
    c.details["x"] = 1
    c.message += "!"
    assert "x" not in d.details and d.message == "m"
