"""One per node: the node's ranks connect to it as to a watcher; it forwards their
events over TCP (with the token) to the central watcher.

Frames from the node's ranks are decoded (nothing from the wire is trusted here
either) and a rank's events are gathered for `flush_s` before going on as one frame
per rank, so the centre sees a few frames per second per rank whatever the ranks'
own flush rate, from one peer per node. A centre that is down or behind costs the
ranks nothing: the relay's own queue is bounded, and what it could not forward is
counted (and said in its status line).
"""

from __future__ import annotations

import socket
import threading
import time

from commviz.events import Batch, encode_frames
from commviz.transport.client import Client
from commviz.transport.server import Server

FLUSH_S = 0.05
MAX_EVENTS = 2048  # per forwarded frame, as the probe's own MAX_BATCH
MAX_HELD = 1_000_000  # events held for forwarding at most; past that the oldest rank's are dropped
# Frames to the centre not yet acknowledged (transport/credit.py): a node's ranks send
# one frame each per flush, so a window of many ranks' frames.
WINDOW = 64


class Relay:
    def __init__(self, listen: str, to: str, token: str | None = None, listen_token: str | None = None,
                 flush_s: float = FLUSH_S, clock=time.monotonic, sleep=time.sleep) -> None:
        self.listen, self.to = listen, to
        # The hand-over's deadline at close, and its server's timers, on one clock a
        # test can step.
        self._clock, self._sleep = clock, sleep
        self.flush_s = flush_s
        self.held: dict[int, list] = {}  # rank -> events not yet forwarded
        self.held_events = 0
        self.forwarded = 0
        self.frames_out = 0
        self.dropped = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        ident = f"relay-{socket.gethostname()}-{id(self):x}".encode()
        self.client = Client(to, identity=ident, token=token, window=WINDOW)
        self.server = Server(listen, self._on_batch, self._on_error, token=listen_token, clock=clock)
        self.addr = self.server.addr
        self._thread = threading.Thread(target=self._run, name="commviz-relay", daemon=True)

    def start(self) -> "Relay":
        self.server.start()
        self._thread.start()
        return self

    def _on_batch(self, batch: Batch, payload: bytes) -> None:
        with self._lock:
            self.held.setdefault(batch.rank, []).extend(batch.events)
            self.held_events += len(batch.events)
            while self.held_events > MAX_HELD and self.held:
                rank = next(iter(self.held))
                self.dropped += len(self.held[rank])
                self.held_events -= len(self.held.pop(rank))

    def _on_error(self, peer: str, message: str) -> None:
        with self._lock:
            self.errors.append(f"from {peer}: {message}")
            del self.errors[:-100]

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    def flush(self) -> None:
        """Forward what is held: one frame per rank (split past MAX_EVENTS), as far as
        the centre's acks allow; the rest waits for the next flush."""
        lost = self.client.poll()
        if lost:
            self.dropped += sum(lost)
        with self._lock:
            held, self.held, self.held_events = self.held, {}, 0
        for rank, events in held.items():
            done = self._forward(rank, events)
            if done < len(events):
                self._keep(rank, events[done:])

    def _forward(self, rank: int, events: list) -> int:
        """How many of `events`, in order, were dealt with (sent, or too big for the
        wire and counted) before the window filled."""
        done = 0
        for i in range(0, len(events), MAX_EVENTS):
            for payload, n in encode_frames(rank, events[i : i + MAX_EVENTS]):
                if payload is None:
                    self.dropped += n
                elif self.client.room <= 0 or not self.client.send(payload, n):
                    return done
                else:
                    self.forwarded += n
                    self.frames_out += 1
                done += n
        return done

    def _keep(self, rank: int, events: list) -> None:
        """Not forwarded now: back in front of what arrived meanwhile, in order."""
        with self._lock:
            self.held[rank] = events + self.held.get(rank, [])
            self.held_events += len(events)

    def status(self) -> str:
        bits = [f"relaying {self.addr} → {self.to}", f"{len(self.server.peers)} peers",
                f"{self.forwarded} events forwarded in {self.frames_out} frames"]
        if self.dropped:
            bits.append(f"{self.dropped} dropped (the watcher at {self.to} is down or behind)")
        if self.server.bad_frames:
            bits.append(f"{self.server.bad_frames} bad frames")
        return " · ".join(bits)

    def close(self, hand_over_s: float = 0.5) -> None:
        """Stop listening, forward what is held as far as the centre takes it within
        `hand_over_s` (the rest is counted as dropped), and give zmq its linger."""
        self._stop.set()
        self._thread.join(2)
        self.server.close()
        end = self._clock() + hand_over_s
        self.flush()
        while self.held_events and self._clock() < end:
            self._sleep(0.005)
            self.flush()
        self.dropped += self.held_events
        self.client.close()
