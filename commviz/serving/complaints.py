"""What clients did wrong, counted by kind, and said at most once a minute per kind:
a flood of bad requests is one line in the collector's log with a count, not a
traceback each (http.server wrote 44,000 lines for 2,000 dropped connections)."""

from __future__ import annotations

import collections
import enum
import logging
import time
from collections.abc import Callable

EVERY_S = 60.0


class Kind(enum.Enum):
    BAD_REQUEST = "bad request"  # not HTTP, or malformed
    TOO_LARGE = "too large"  # a request line or header over the limits
    BAD_METHOD = "method not allowed"
    UNAUTHORIZED = "no token"  # 401: no token, or not the collector's
    NOT_FOUND = "no such view"
    EVICTED = "evicted"  # idle at the connection cap (guard.py)
    REFUSED = "refused"  # at the cap, every connection busy
    TIMED_OUT = "timed out"  # asked nothing in time, or read its answer too slowly
    RESET = "reset"  # went away mid-answer
    SERVER_ERROR = "server error"  # ours: a bug, said with its traceback (once a minute)


_STATUS = {400: Kind.BAD_REQUEST, 401: Kind.UNAUTHORIZED, 404: Kind.NOT_FOUND, 405: Kind.BAD_METHOD,
           413: Kind.TOO_LARGE, 414: Kind.TOO_LARGE, 431: Kind.TOO_LARGE}


def kind_of_status(status: int) -> Kind | None:
    if status >= 500:
        return Kind.SERVER_ERROR
    return _STATUS.get(status, Kind.BAD_REQUEST if status >= 400 else None)


class Complaints:
    """`say(line)` gets one line per kind the first time, then at most once per
    `every_s`, with how many came since the last line."""

    def __init__(self, say: Callable[[str], None], every_s: float = EVERY_S, clock=time.monotonic) -> None:
        self.say = say
        self.every_s = every_s
        self.clock = clock
        self.counts: collections.Counter[Kind] = collections.Counter()
        self._since: collections.Counter[Kind] = collections.Counter()
        self._said_at: dict[Kind, float] = {}

    def count(self, kind: Kind, detail: str = "") -> None:
        self.counts[kind] += 1
        self._since[kind] += 1
        now = self.clock()
        last = self._said_at.get(kind)
        if last is not None and now - last < self.every_s:
            return
        n, self._since[kind] = self._since[kind], 0
        self._said_at[kind] = now
        many = f"{n} clients: " if n > 1 else ""
        quiet = " (said at most once a minute)" if last is None else f" in the last {now - last:.0f} s"
        try:
            self.say(f"commviz http: {kind.value}: {many}{detail}{quiet}".rstrip())
        except Exception:
            pass

    def as_dict(self) -> dict[str, int]:
        return {k.value: n for k, n in sorted(self.counts.items(), key=lambda kv: kv[0].value)}


class AiohttpLog(logging.Handler):
    """aiohttp's server logger, to `Complaints`: its parser errors (a 400 it already
    answered) and dropped connections are clients' faults, counted; anything else is
    ours and keeps its traceback, once a minute."""

    def __init__(self, complaints: Complaints, traceback_to: Callable[[str], None]) -> None:
        super().__init__(logging.DEBUG)
        self.complaints = complaints
        self.traceback_to = traceback_to
        self._last_tb = -1e18

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return  # aiohttp's debug chatter ("Ignored premature client disconnection")
        name = type(exc).__name__
        text = " ".join(str(exc).split())  # aiohttp's messages span lines: one line each here
        if isinstance(exc, (ConnectionError, TimeoutError)):
            self.complaints.count(Kind.RESET, name)
        elif name == "LineTooLong" or "too long" in text.lower() or "many headers" in text.lower():
            self.complaints.count(Kind.TOO_LARGE, f"{name}: {text[:100]}")
        elif type(exc).__module__.startswith("aiohttp.http_exceptions") or name.startswith("Bad"):
            self.complaints.count(Kind.BAD_REQUEST, f"{name}: {text[:100]}")
        else:
            self.complaints.count(Kind.SERVER_ERROR, f"{name}: {text[:200]}")
            now = self.complaints.clock()
            if now - self._last_tb >= self.complaints.every_s:
                self._last_tb = now
                try:
                    self.traceback_to(self.format(record))
                except Exception:
                    pass
