"""Clients' errors: every one counted, each kind said at most once a minute."""

import logging

from commviz.serving.complaints import AiohttpLog, Complaints, Kind, kind_of_status


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_flood_of_one_kind_is_one_line_a_minute_with_its_count():
    said, clock = [], Clock()
    c = Complaints(said.append, every_s=60, clock=clock)
    for i in range(1000):
        clock.now = i * 0.1  # 100 s of them
        c.count(Kind.BAD_REQUEST, "from 10.0.0.9")
    assert c.counts[Kind.BAD_REQUEST] == 1000
    assert len(said) == 2
    assert said[0].startswith("commviz http: bad request: from 10.0.0.9")
    assert "600 clients" in said[1] and "in the last 60 s" in said[1]


def test_each_kind_has_its_own_minute():
    said, clock = [], Clock()
    c = Complaints(said.append, clock=clock)
    c.count(Kind.EVICTED)
    c.count(Kind.UNAUTHORIZED)
    c.count(Kind.EVICTED)
    assert len(said) == 2 and c.as_dict() == {"evicted": 2, "no token": 1}


def test_statuses_map_to_kinds():
    assert kind_of_status(200) is None and kind_of_status(304) is None
    assert kind_of_status(401) is Kind.UNAUTHORIZED and kind_of_status(404) is Kind.NOT_FOUND
    assert kind_of_status(431) is Kind.TOO_LARGE and kind_of_status(500) is Kind.SERVER_ERROR


def test_aiohttps_log_records_become_counts_and_only_our_own_errors_keep_a_traceback():
    from aiohttp.http_exceptions import BadStatusLine, LineTooLong

    said, tracebacks, clock = [], [], Clock()
    c = Complaints(said.append, clock=clock)
    log = logging.Logger("t")
    log.addHandler(AiohttpLog(c, tracebacks.append))
    for exc in (BadStatusLine("\\x16\\x03"), LineTooLong("line", 8190), ConnectionResetError(), KeyError("bug")):
        try:
            raise exc
        except Exception:
            log.exception("Error handling request")
    log.debug("Ignored premature client disconnection")
    assert c.as_dict() == {"bad request": 1, "reset": 1, "server error": 1, "too large": 1}
    assert len(tracebacks) == 1 and "KeyError" in tracebacks[0]
