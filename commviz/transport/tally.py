"""Per-peer counts the watcher keeps on its hot path, without any lock: how many
frames each peer had turned away, and when each was last described to a person.

Peers name themselves (a zmq identity), so a stranger cycling names could grow these
maps without end; past `max_peers` names, new ones are counted under one "others"."""

from __future__ import annotations

OTHERS = b"(others)"


class Tally:
    def __init__(self, max_peers: int, say_every_s: float = 1.0) -> None:
        self.by_peer: dict[bytes, int] = {}
        self.max_peers = max_peers
        self.say_every_s = say_every_s
        self.said: dict[bytes, float] = {}  # peer -> when last described

    @property
    def total(self) -> int:
        return sum(dict(self.by_peer).values())  # a copy: the reader may be adding a peer

    def add(self, peer: bytes, now: float) -> bool:
        """Count one frame; True when it should be described (once per peer per
        `say_every_s`), so the caller formats a message only then. The server's hot
        path does the common case (a known peer, described lately) inline."""
        by = self.by_peer
        n = by.get(peer)
        if n is None:
            if len(by) >= self.max_peers:
                peer = OTHERS
                n = by.get(peer, 0)
            else:
                n = 0
        by[peer] = n + 1
        said = self.said.get(peer)
        if said is not None and now - said < self.say_every_s:
            return False
        if len(self.said) >= self.max_peers:
            self.said.clear()  # at worst a peer is described twice in a second
        self.said[peer] = now
        return True

    def top(self, n: int = 3) -> list[tuple[str, int]]:
        """The peers with the most frames counted, named for a person (safe to call
        from another thread: the map is copied first)."""
        by = dict(self.by_peer)
        return [(k.decode("utf-8", "replace"), v) for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:n]]
