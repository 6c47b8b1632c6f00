"""The RAS client against a server speaking NCCL's protocol (src/ras/client.cc):
handshake, TIMEOUT, SET FORMAT json, VERBOSE STATUS, the report to EOF."""

import json
import socket
import threading

import pytest

from commviz.attach import ras

REPORT = {"nccl_version": "2.27.3", "communicators": [{"hash": "0x1", "ranks": 4, "missing_ranks": [2]}]}


def server(json_ok: bool = True, greeting: bytes = b"SERVER PROTOCOL 2\n"):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    seen = []

    def serve():
        conn, _ = srv.accept()
        f = conn.makefile("rb")
        seen.append(f.readline())
        conn.sendall(greeting)
        while True:
            line = f.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith(b"TIMEOUT"):
                conn.sendall(b"OK\n")
            elif line.startswith(b"SET FORMAT"):
                conn.sendall(b"OK\n" if json_ok else b"ERROR: unknown command\n")
            elif line.endswith(b"STATUS\n"):
                body = json.dumps(REPORT).encode() if json_ok else b"Job summary\n===========\n4 ranks, 1 missing\n"
                conn.sendall(body)
                break
        conn.close()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}", seen


def test_the_json_report_is_read_whole():
    addr, seen = server()
    rep = ras.query(addr)
    assert rep.doc == REPORT and rep.server_protocol == 2
    assert seen == [b"CLIENT PROTOCOL 2\n", b"TIMEOUT 5\n", b"SET FORMAT json\n", b"VERBOSE STATUS\n"]
    assert rep.to_json()["report"] == REPORT


def test_an_nccl_without_json_gives_its_text_report():
    addr, _ = server(json_ok=False)
    rep = ras.query(addr)
    assert rep.doc is None and "1 missing" in rep.text and any("no JSON" in n for n in rep.notes)


def test_something_else_on_the_port_is_named_not_parsed():
    addr, _ = server(greeting=b"HTTP/1.1 400 Bad Request\n")
    with pytest.raises(ras.RasError, match="not a RAS server"):
        ras.query(addr)


def test_nothing_listening_says_how_ras_is_enabled():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ras.RasError, match="NCCL_RAS_ENABLE"):
        ras.query(f"127.0.0.1:{port}", timeout_s=2)
