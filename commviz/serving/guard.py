"""Which connections a server keeps, and which it lets go: a cap on how many are
open, and a deadline for each to have asked something.

Pure: it is told what happens, with the time, and answers which connections to
close. The server (server.py) does the closing.

A connection that is not inside a request handler is *idle*: one that has sent half
a request, one reading its answer slowly, one kept alive between requests. Idle
connections cost the server nothing but a socket, and that is what an attacker (or a
buggy client) piles up. So at the cap the oldest idle one makes room for the new one:
the legitimate client that just connected and is sending its request right now is
the newest, and the last to go. Only when every open connection is inside a handler
is a new one refused."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Hashable

CAP = 256  # open connections; a thread-free server holds these for a socket each
DEADLINE_S = 10.0  # a connection must have asked (or asked again) within this long


class Why(enum.Enum):
    """Why a connection was closed by the server (complaints.py counts them)."""

    EVICTED = "evicted"  # idle, the oldest, when the cap was reached
    REFUSED = "refused"  # new, at the cap with every other one inside a handler
    TIMED_OUT = "timed out"  # idle past its deadline


@dataclasses.dataclass
class _Conn:
    deadline: float
    busy: bool = False


class Guard:
    def __init__(self, cap: int = CAP, deadline_s: float = DEADLINE_S) -> None:
        self.cap = cap
        self.deadline_s = deadline_s
        self._conns: dict[Hashable, _Conn] = {}  # in the order they opened

    def __len__(self) -> int:
        return len(self._conns)

    def opened(self, key: Hashable, now: float) -> list[tuple[Hashable, Why]]:
        """A connection was accepted: what to close to keep the cap (possibly `key`)."""
        out: list[tuple[Hashable, Why]] = []
        if len(self._conns) >= self.cap:
            victim = next((k for k, c in self._conns.items() if not c.busy), None)
            if victim is None:
                return [(key, Why.REFUSED)]
            del self._conns[victim]
            out.append((victim, Why.EVICTED))
        self._conns[key] = _Conn(now + self.deadline_s)
        return out

    def asked(self, key: Hashable) -> None:
        """Its request reached the handler: it is no longer idle."""
        c = self._conns.get(key)
        if c is not None:
            c.busy = True

    def answered(self, key: Hashable, now: float) -> None:
        """The handler is done: the answer is being written, and the next request (or
        the close) is due within the deadline."""
        c = self._conns.get(key)
        if c is not None:
            c.busy = False
            c.deadline = now + self.deadline_s

    def closed(self, key: Hashable) -> None:
        self._conns.pop(key, None)

    def expired(self, now: float) -> list[tuple[Hashable, Why]]:
        """Idle connections past their deadline, forgotten here; the caller closes them."""
        late = [k for k, c in self._conns.items() if not c.busy and c.deadline <= now]
        for k in late:
            del self._conns[k]
        return [(k, Why.TIMED_OUT) for k in late]
