"""Credit between a sender and its watcher: how the sender knows, exactly, what the
watcher has taken.

zmq alone cannot say what happened to a frame it accepted: a frame queued for a
frozen watcher, or one still in zmq when a rank exits, is lost uncounted after the
linger (and with it the goodbye, so an exiting rank looks dead). So the watcher acks
every frame once it has dealt with it (ingested, or shed and counted), and a sender
keeps at most `window` frames unacknowledged. Everything else waits in the sender's
own backlog, whose cap and drop count are exact. What a watcher holds for a peer
that follows the protocol is then at most its window, however many peers there are.

An ack is one frame from the watcher to the peer: MAGIC, then the number of frames
it acknowledges (u32, little-endian). Peers read acks in order, so a count is enough.
"""

from __future__ import annotations

import collections
import struct

MAGIC = b"CVA1"
_ACK = struct.Struct("<4sI")
ACK_SIZE = _ACK.size


def ack_frame(n: int) -> bytes:
    return _ACK.pack(MAGIC, n)


def acked(frame: bytes) -> int:
    """Frames an ack acknowledges; 0 for anything that is not an ack."""
    if len(frame) != ACK_SIZE:
        return 0
    magic, n = _ACK.unpack(frame)
    return n if magic == MAGIC else 0


class Window:
    """Frames handed over and not yet acknowledged, each with the sender's tag (what
    it must count if the frame is lost), oldest first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._out: collections.deque = collections.deque()

    def __len__(self) -> int:
        return len(self._out)

    @property
    def room(self) -> int:
        return self.size - len(self._out)

    def sent(self, tag) -> None:
        self._out.append(tag)

    def ack(self, n: int) -> None:
        out = self._out
        for _ in range(min(n, len(out))):
            out.popleft()

    def lose(self) -> list:
        """The connection went away: what it had not acknowledged is gone."""
        lost = list(self._out)
        self._out.clear()
        return lost
