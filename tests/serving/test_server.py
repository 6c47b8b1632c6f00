"""The asyncio server itself, in this process: a cap that idle connections cannot
fill against a real client, deadlines, bounded requests, few threads."""

import socket
import threading
import urllib.error
import urllib.request

import pytest

from commviz.serving.server import HttpServer, Lane, Later, Reply, listening_socket


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def served():
    made = []

    def make(answer=None, **kw):
        said = []
        server = HttpServer(answer or (lambda ask: Later(lambda: Reply(200, "text/plain", b"ok " + ask.path.encode()),
                                                           Lane.STATE)), say=said.append, **kw)
        site = server.listen(listening_socket("127.0.0.1", 0))
        made.append(server)
        return server, site, said

    yield make
    for s in made:
        s.close()


def get(site, path="/x", timeout=5.0):
    with urllib.request.urlopen(site.url + path, timeout=timeout) as r:
        return r.status, r.read()


def half(site, n):
    out = []
    for _ in range(n):
        s = socket.create_connection((site.host, site.port), timeout=5)
        s.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n")
        out.append(s)
    return out


def closed_by_server(s, timeout=5.0) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_idle_connections_at_the_cap_give_way_to_a_client_that_asks(served):
    server, site, said = served(cap=8)
    assert get(site) == (200, b"ok /x")
    threads = threading.active_count()  # the loop's and a lane's
    idle = half(site, 40)
    try:
        assert get(site) == (200, b"ok /x")
        assert closed_by_server(idle[0])  # the oldest went first
        assert len(server.guard) <= 8
        assert server.complaints.counts and "evicted" in server.complaints.as_dict()
        assert threading.active_count() == threads  # no thread per connection
        assert len([line for line in said if "evicted" in line]) == 1  # once a minute
    finally:
        for s in idle:
            s.close()


def test_a_connection_that_never_finishes_asking_is_closed_at_its_deadline(served):
    clock = Clock()
    server, site, _ = served(deadline_s=10, clock=clock)
    (s,) = half(site, 1)
    assert not closed_by_server(s, timeout=0.6)  # a sweep has run: not yet due
    clock.now = 11.0
    assert closed_by_server(s)
    assert server.complaints.as_dict().get("timed out") == 1
    s.close()


def test_oversized_headers_are_refused_and_counted_not_logged_with_a_traceback(served):
    server, site, said = served()
    with socket.create_connection((site.host, site.port), timeout=5) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nX-Big: " + b"a" * 50_000 + b"\r\n\r\n")
        got = s.recv(100)
    assert got.split(b" ")[1].startswith(b"4")
    with socket.create_connection((site.host, site.port), timeout=5) as s:
        s.sendall(b"\x16\x03\x01garbage\r\n\r\n")
        s.recv(100)
    assert get(site) == (200, b"ok /x")  # and it still answers
    counts = server.complaints.as_dict()
    assert counts.get("too large") == 1 and counts.get("bad request") == 1
    assert not any("Traceback" in line for line in said)


def test_an_answer_that_fails_is_a_500_said_with_its_traceback(served):
    def answer(ask):
        return Later(lambda: {}["missing"], Lane.STATE)

    server, site, said = served(answer)
    with pytest.raises(urllib.error.HTTPError, match="500"):
        get(site)
    assert server.complaints.as_dict() == {"server error": 1}
    assert any("KeyError" in line for line in said)


def test_a_request_that_is_not_a_get_is_refused(served):
    _, site, _ = served()
    req = urllib.request.Request(site.url + "/x", data=b"x" * 10, method="POST")
    with pytest.raises(urllib.error.HTTPError, match="405"):
        urllib.request.urlopen(req, timeout=5)
