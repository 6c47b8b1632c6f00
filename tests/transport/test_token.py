"""Every TCP listener, loopback included, admits only peers holding its token; ipc
stays token-free unless the user set one; strangers are refused and counted."""

import os
import time

import zmq

from commviz.events import encode_batch
from commviz.transport import token as tokens
from commviz.transport.client import Client
from commviz.transport.server import Server
from tests.helpers import hello
from tests.helpers import wait_for


def test_tcp_loopback_gets_a_made_up_token_said_once_and_kept_for_the_job():
    env, said = {}, []
    token = tokens.listener_token("tcp://127.0.0.1:5557", env=env, say=said.append)
    assert token and env[tokens.ENV] == token  # a launched job inherits it
    assert len(said) == 1 and f"export COMMVIZ_TOKEN={token}" in said[0]
    assert tokens.listener_token("tcp://127.0.0.1:5557", env=env, say=said.append) == token
    assert len(said) == 1  # a token the user (or we) already set is not printed again
    assert tokens.listener_token("tcp://0.0.0.0:5557", env={}, say=said.append) not in (None, token)


def test_ipc_stays_token_free_unless_one_is_set():
    said = []
    assert tokens.listener_token("ipc:///tmp/x.sock", env={}, say=said.append) is None
    assert tokens.listener_token("ipc:///tmp/x.sock", env={tokens.ENV: "abc"}, say=said.append) == "abc"
    assert said == []


class NoCtx:
    """A zmq context whose sockets do nothing: a Gate's reply is tested alone."""

    def socket(self, kind):
        class S:
            def setsockopt(self, *a): pass
            def bind(self, *a): pass
        return S()


def test_the_zap_reply_admits_the_exact_token_only():
    gate = tokens.Gate(NoCtx(), "s3cret")

    def ask(mech, *cred, domain=b"commviz"):
        return gate.reply([b"1.0", b"7", domain, b"127.0.0.1", b"", mech, *cred])[2]

    assert ask(b"PLAIN", b"commviz", b"s3cret") == b"200"
    for cred in ((b"commviz", b"s3cre"), (b"commviz", b"s3cret!"), (b"other", b"s3cret"), (b"commviz", b"")):
        assert ask(b"PLAIN", *cred) == b"400"
    assert ask(b"NULL") == b"400"
    assert ask(b"PLAIN", b"commviz", b"s3cret", domain=b"x") == b"400"
    assert gate.reply([b"1.0", b"7"])[:3] == [b"1.0", b"7", b"400"]  # malformed: no


def test_loopback_listener_refuses_peers_without_the_token_and_counts_them():
    got = []
    server = Server("tcp://127.0.0.1:0", lambda b, r: got.append(b.rank), lambda p, m: None, token="s3cret").start()
    try:
        wrong = Client(server.addr, identity=b"intruder", token="wrong")
        none = Client(server.addr, identity=b"anon", token="")  # speaks NULL: the handshake fails
        good = Client(server.addr, identity=b"rank0", token="s3cret")
        assert wait_for(lambda: good.send(encode_batch(0, [hello(0)])))
        assert wait_for(lambda: got == [0])
        for i, c in ((1, wrong), (2, none)):
            c.send(encode_batch(i, [hello(i)]))
        assert wait_for(lambda: server.denied >= 2)
        time.sleep(0.3)
        assert got == [0]  # nothing from the peers without the token
        for c in (wrong, none, good):
            c.close()
    finally:
        server.close()


def test_a_raw_zmq_peer_without_the_token_gets_nothing_through():
    got = []
    server = Server("tcp://127.0.0.1:0", lambda b, r: got.append(b.rank), lambda p, m: None, token="t").start()
    ctx = zmq.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.addr)
        raw.send(encode_batch(5, [hello(5)]))  # queued by zmq: its handshake never completes
        assert wait_for(lambda: server.denied >= 1)
        assert got == [] and server.frames == 0
        raw.close(0)
    finally:
        ctx.term()
        server.close()


def test_launched_job_inherits_the_token(monkeypatch):
    from commviz import launch

    monkeypatch.delenv(tokens.ENV, raising=False)
    try:
        token = tokens.listener_token("tcp://127.0.0.1:5557", say=lambda line: None)
        assert launch.job_env("tcp://127.0.0.1:5557")[tokens.ENV] == token
    finally:
        os.environ.pop(tokens.ENV, None)  # listener_token sets it for this process's job


def test_a_token_listener_that_cannot_bind_says_why(tmp_path):
    import pytest

    from commviz.transport.address import AddressError

    first = Server("tcp://127.0.0.1:0", lambda b, r: None, lambda p, m: None, token="t")
    try:
        with pytest.raises(AddressError, match="cannot listen"):
            Server(first.addr, lambda b, r: None, lambda p, m: None, token="t")
    finally:
        first.close()
