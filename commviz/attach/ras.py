"""A client for NCCL's RAS service (NCCL >= 2.24): every NCCL process listens on
localhost:28028 (NCCL_RAS_ADDR) and answers, for the whole job, how many ranks each
communicator has, which are missing or dead, and per-communicator collective counts.

The protocol is lines of text (NCCL's src/ras/client.cc): the client says
`CLIENT PROTOCOL <n>`, the server `SERVER PROTOCOL <n>`; `TIMEOUT <s>` and
`SET FORMAT json` are each answered `OK`; then `STATUS` (or `VERBOSE STATUS`) is
answered by the report, up to the end of the connection. A server too old for JSON
refuses the format; the text report is asked for instead.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field

PROTOCOL = 2
DEFAULT_ADDR = "localhost:28028"
MAX_REPORT = 4 << 20  # bytes of a report read at most


class RasError(RuntimeError):
    pass


@dataclass
class RasReport:
    addr: str
    server_protocol: int
    text: str  # the report as NCCL wrote it
    doc: dict | list | None = None  # parsed, when NCCL wrote JSON
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out: dict = {"addr": self.addr, "server_protocol": self.server_protocol}
        if self.doc is not None:
            out["report"] = self.doc
        else:
            out["text"] = self.text[:20_000]
        if self.notes:
            out["notes"] = self.notes
        return out


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    try:
        return host or "localhost", int(port)
    except ValueError:
        raise RasError(f"not a host:port: {addr!r}") from None


class _Lines:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def line(self) -> str:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RasError("NCCL closed the connection")
            self.buf += chunk
            if len(self.buf) > 65536:
                raise RasError("no line end in 64 KiB: not a RAS server")
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip()

    def rest(self) -> str:
        out = [self.buf]
        size = len(self.buf)
        while size < MAX_REPORT:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            out.append(chunk)
            size += len(chunk)
        return b"".join(out).decode(errors="replace")


def query(addr: str = DEFAULT_ADDR, timeout_s: float = 10.0, verbose: bool = True, want_json: bool = True,
          collective_timeout_s: int = 5) -> RasReport:
    """The job's status, as the RAS service of the NCCL process at `addr` reports it."""
    host, port = parse_addr(addr)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise RasError(f"no NCCL RAS service at {addr} ({exc.strerror or exc}): NCCL >= 2.24 runs one in every "
                       "process unless NCCL_RAS_ENABLE=0; NCCL_RAS_ADDR moves it") from None
    with sock:
        rd = _Lines(sock)
        try:
            sock.sendall(f"CLIENT PROTOCOL {PROTOCOL}\n".encode())
            hello = rd.line()
            if not hello.upper().startswith("SERVER PROTOCOL "):
                raise RasError(f"not a RAS server at {addr}: it said {hello[:80]!r}")
            try:
                server = int(hello.split()[2])
            except (IndexError, ValueError):
                server = -1
            notes = [] if server == PROTOCOL else [f"server protocol {server}, client {PROTOCOL}"]
            sock.sendall(f"TIMEOUT {collective_timeout_s}\n".encode())
            ok = rd.line()
            if ok.upper() != "OK":
                notes.append(f"TIMEOUT refused: {ok[:80]}")
            fmt_json = False
            if want_json:
                sock.sendall(b"SET FORMAT json\n")
                ok = rd.line()
                fmt_json = ok.upper() == "OK"
                if not fmt_json:
                    notes.append("this NCCL's RAS has no JSON output: the text report is kept")
            sock.sendall(b"VERBOSE STATUS\n" if verbose else b"STATUS\n")
            text = rd.rest()
        except (OSError, socket.timeout) as exc:
            raise RasError(f"RAS at {addr}: {exc}") from None
    doc = None
    if fmt_json:
        try:
            doc = json.loads(text)
        except ValueError:
            notes.append("the JSON report did not parse: the text is kept")
    return RasReport(addr, server, text, doc, notes)
