"""The probe's flushing thread: turns queued records into events, batches them to
the watcher and the per-rank trace file, and captures the stacks of long ops. The
training thread only appends to a deque; all I/O happens here. CUDA completions are
polled on their own thread (probe/cuda.py) and NVML sampled on another
(samplers.SamplerThread): a stalled event query or a 40 ms NVML call delays no flush."""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time

from commviz import native
from commviz.events import (BASE_SCHEMA, NCCL_SINCE, E_ID, END, HOST_TOPOLOGY_SINCE, MAX_WIRE_FRAME, S_BYTES, S_DTYPE, S_ID, S_SHAPE, S_T,
                             START, Counters, Goodbye, GroupDef, Hello, HostTopology, cuts, encode_batch, encode_frames)
from commviz.probe.health import Health
from commviz.probe.names import dtype_name, tensor_nbytes

_fw = native.load("commviz.probe._fastwrap")  # optional (commviz/native.py)
_c_drain, _c_take = (_fw.drain, _fw.take) if _fw is not None else (None, None)
_LAYOUT = (S_ID, S_BYTES, S_DTYPE, S_SHAPE, E_ID)

# The training thread queues ops as plain tuples in the layout events.py defines
# (start_record / end_record); rarer events are queued as Structs.

COUNTERS_EVERY_S = 1.0
MAX_BATCH = 2048  # events per frame: ~75 KB of ops, under the wire's 128 KiB (events.MAX_WIRE_FRAME)
# Frames the watcher has not taken yet (none running, just starting, frozen) are kept
# up to this many events and retried, so a watcher that starts a moment after the
# job still gets everything; beyond it the oldest are dropped and counted.
BACKLOG_EVENTS = 100_000
EXIT_GRACE_S = 0.25  # at exit, wait at most this long for ops still completing
EXIT_HANDOVER_S = 0.5  # and this long (twice: the rest, then the goodbye) for a watcher taking frames
# With no watcher when last asked and nothing of ours in flight, the socket is asked
# again only this much later: asking costs a few µs a flush (more after a quiet
# while, when zmq works through its queued commands), and zmq itself retries the
# connection every 0.1–0.5 s (transport/client.py), so a watcher that comes up is
# reached no later than before, within a second.
RESYNC_EVERY_S = 0.1
QUIET_MAX_EVERY_S = 60.0  # a quiet rank's stacks are sent again at least this often


class Sender:
    def __init__(self, rank: int, hello: Hello, addr: str | None, trace_dir: str | None,
                 health: Health, queue: collections.deque, flush_interval_s: float = 0.02,
                 stack_after_s: float = 3.0, on_long_op=None, on_quiet=None, sources=(), *,
                 clock=time.monotonic, sleep=time.sleep) -> None:
        self.rank = rank
        # What the timers (flush, resync, counters, stacks, the exit's deadlines) read
        # and wait on, so a test steps time instead of outlasting it. Events are still
        # stamped with time.monotonic_ns: the ops they sit among are (probe/core.py).
        self._clock, self._sleep = clock, sleep
        # () -> list of events, polled at each flush: NCCL's own view (probe/nccl_plugin.py)
        self.sources = tuple(sources)
        self.schema = BASE_SCHEMA  # raised by the first Audit (probe/audit.py)
        self.hello = hello
        self.health = health
        self.queue = queue
        self.flush_interval_s = flush_interval_s
        self.groups: list[GroupDef] = []
        self.topology: HostTopology | None = None  # this host's, if this rank sent it
        self.inflight: dict[int, tuple] = {}  # op id -> its start record
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.connected = False
        self.resync_every_s = RESYNC_EVERY_S
        self._resync_at = 0.0  # while not connected: when to ask the socket again
        self.backlog: collections.deque = collections.deque()  # (payload, n_events, in the trace)
        self.backlog_events = 0
        self.backlog_untraced = 0  # of those, events the trace does not hold either
        self._carry: list = []  # drained at exit, sent with the final flush
        self.client = None
        self.trace = None
        self._last_counters = 0.0
        if addr:
            try:
                from commviz.transport.client import Client

                self.client = Client(addr, identity=f"rank{rank}-pid{os.getpid()}".encode())
            except Exception as exc:
                health.internal("connect", exc)
        if trace_dir:
            self._open_trace(trace_dir)
        self.thread = threading.Thread(target=self._run, name="commviz-sender", daemon=True)
        # Ops in flight longer than this get their caller's stack captured, once.
        self.stack_after_ns = int(stack_after_s * 1e9)
        self.on_long_op = on_long_op  # (op_id) -> Stack | None
        self._stacked: set[int] = set()
        self._next_stack_check = 0.0
        # A rank that starts no op for stack_after_s sends every thread's stack, again
        # each time the quiet doubles (at most every QUIET_MAX_EVERY_S): the rank a
        # hang waits for is often in no op at all (a data loader, a checkpoint, an
        # `.item()`), and its line is the one that matters.
        self.on_quiet = on_quiet  # () -> list[Stack]
        self._ops_drained = 0
        self._ops_seen = 0
        self._active_at = clock()
        self._quiet_next = self._active_at + stack_after_s  # quiet from the start counts from the start

    def _open_trace(self, trace_dir: str) -> None:
        from commviz.trace.file import TraceWriter

        try:
            os.makedirs(trace_dir, exist_ok=True)
            self.trace = TraceWriter(os.path.join(trace_dir, f"rank-{self.rank}.cvz"))
            self.trace.write(encode_batch(self.rank, [self.hello]))
        except OSError as exc:
            self.health.trace_errors += 1
            self.health.warn_once("trace", f"cannot write the trace in {trace_dir} ({exc}); the job goes on without it")
            self.trace = None

    def start(self) -> None:
        self.thread.start()

    # ----------------------------------------------------------------- thread

    def _run(self) -> None:
        clock = self._clock
        next_flush = clock() + self.flush_interval_s
        while not self._stop.is_set():
            try:
                self._wake.wait(max(0.0, next_flush - clock()))
                self._wake.clear()
                now = clock()
                if now >= next_flush:
                    self.flush()
                    next_flush = now + self.flush_interval_s
                if now >= self._next_stack_check:
                    self._next_stack_check = now + 0.25
                    self._capture_long_ops()
                    self._capture_if_quiet(now)
            except Exception as exc:  # never let the thread die
                self.health.internal("sender", exc)
                self._sleep(self.flush_interval_s)

    def _capture_long_ops(self) -> None:
        """Stacks for ops stuck longer than the threshold: what a hang diagnosis
        shows as 'the line of code at fault'."""
        if self.on_long_op is None or not self.inflight:
            self._stacked.clear()
            return
        cutoff = int(self._clock() * 1e9) - self.stack_after_ns  # the ops' stamps are this clock's, in ns
        for op_id, start in list(self.inflight.items()):
            if start[S_T] <= cutoff and op_id not in self._stacked:
                self._stacked.add(op_id)
                stack = self.on_long_op(op_id)
                if stack is not None:
                    self.queue.append(stack)
        self._stacked &= set(self.inflight)

    def _capture_if_quiet(self, now: float) -> None:
        if self.on_quiet is None:
            return
        if self._ops_drained != self._ops_seen:
            self._ops_seen = self._ops_drained
            self._active_at = now
            self._quiet_next = now + self.stack_after_ns / 1e9
            return
        if now < self._quiet_next:
            return
        quiet_for = now - self._active_at
        self._quiet_next = now + min(max(quiet_for, self.stack_after_ns / 1e9), QUIET_MAX_EVERY_S)
        self.queue.extend(self.on_quiet())

    def _drain(self) -> list:
        q = self.queue
        if _c_take is not None and type(q) is collections.deque:
            out = _c_take(q)
        else:
            out = list(itertools.starmap(q.popleft, itertools.repeat((), len(q))))  # popleft × len, in C
        if _c_drain is not None:  # the loop below, in C (probe/_fastwrap.c)
            others = _c_drain(out, self.inflight, self._tensor_fields, START, END, _LAYOUT)
            self._ops_drained += len(out) - len(others)
            self._note(others)
            return out
        inflight = self.inflight
        # A start queued as a list carries its tensor in the bytes field (probe/patch.py's
        # deferred path): its bytes, dtype and shape are read here, once per tensor per
        # batch. The cache holds each tensor while it does, so an id stands for one
        # tensor throughout the batch.
        tensors: dict = {}
        others = []
        for rec in out:
            kind = type(rec)
            if kind is list:
                x = rec[S_BYTES]
                hit = tensors.get(id(x))
                if hit is None:
                    hit = tensors[id(x)] = self._tensor_fields(x)
                _, rec[S_BYTES], rec[S_DTYPE], rec[S_SHAPE] = hit
                inflight[rec[S_ID]] = rec
            elif kind is tuple:
                if rec[0] == START:
                    inflight[rec[S_ID]] = rec
                else:
                    inflight.pop(rec[E_ID], None)
            else:
                others.append(rec)
        self._ops_drained += len(out) - len(others)
        self._note(others)
        return out

    def _note(self, others: list) -> None:
        """What the sender keeps of records that are not ops: groups and the host's
        topology, for a watcher that connects later."""
        for rec in others:
            if isinstance(rec, GroupDef):
                self.groups.append(rec)
            elif isinstance(rec, HostTopology):
                # schema 2's kind, queued once by the sampler thread: this rank's frames
                # say 2 from here on (as after an Audit), a resync's too
                self.topology = rec
                self.schema = max(self.schema, HOST_TOPOLOGY_SINCE)

    def _tensor_fields(self, x) -> tuple:
        try:
            return x, tensor_nbytes(x), dtype_name(x.dtype), x.shape
        except Exception as exc:
            self.health.internal("tensor metadata", exc)
            return x, 0, "", ()

    def flush(self) -> None:
        events = self._carry + self._drain() + self._poll_sources()
        self._carry = []
        now = self._clock()
        if now - self._last_counters >= COUNTERS_EVERY_S:
            self._last_counters = now
            events.append(self._counters())
        self._emit_all(events)
        if self.client is not None:
            self._send_backlog()  # acks free the window; a watcher may have come up

    def _poll_sources(self) -> list:
        out: list = []
        for poll in self.sources:
            try:
                out.extend(poll())
            except Exception as exc:  # a source's failure costs its events, not the flush
                self.health.internal("source", exc)
        if out:
            self.schema = max(self.schema, NCCL_SINCE)
        return out

    def _counters(self) -> Counters:
        h = self.health
        return Counters(time.monotonic_ns(), h.dropped, h.internal_errors, h.trace_errors, h.behind)

    def _emit_all(self, events: list) -> None:
        """In frames of at most MAX_BATCH events (a folded op is two, events.py)."""
        lo = 0
        for hi in cuts(events, MAX_BATCH):
            self._emit(events[lo:hi])
            lo = hi

    def _emit(self, events: list) -> None:
        for payload, n in encode_frames(self.rank, events, self.schema):
            if payload is None:
                self.health.dropped += n
                self.health.warn_once("oversize", f"an event over {MAX_WIRE_FRAME >> 10} KiB was left out")
                continue
            traced = self._write_trace(payload)
            if self.client is None:
                if not traced:
                    self.health.dropped += n
                continue
            self.backlog.append((payload, n, traced))
            self.backlog_events += n
            self.backlog_untraced += 0 if traced else n
            while self.backlog_events > BACKLOG_EVENTS and len(self.backlog) > 1:
                self._pop_backlog(lost=True)

    def _write_trace(self, payload: bytes) -> bool:
        if self.trace is not None:
            try:
                self.trace.write(payload)
            except OSError as exc:
                self.health.trace_errors += 1
                self.health.warn_once("trace-write", f"trace write failed ({exc}); the job goes on, trace stops here")
                self.trace = None
        return self.trace is not None

    def _pop_backlog(self, lost: bool) -> None:
        """`dropped` counts events that reached neither a watcher nor the trace."""
        _, n, traced = self.backlog.popleft()
        self.backlog_events -= n
        if lost and self.connected:  # a watcher is there but not taking them: it is behind
            self.health.behind += n
        if not traced:
            self.backlog_untraced -= n
            if lost:
                self.health.dropped += n

    def _send_backlog(self, extra: int = 0) -> None:
        """Hand frames to the watcher as far as its acks allow (transport/credit.py):
        what it has not acknowledged is at most the window (`extra` more for the
        goodbye), and what a dropped connection took with it is counted here, exactly."""
        client = self.client
        if not self.connected and not len(client.window) and self._clock() < self._resync_at:
            return  # nobody listened when last asked, and no frame of ours is out to be acked or lost
        lost = client.poll()
        if lost is not None:
            self.connected = False
            self.health.dropped += sum(n for n, traced in lost if not traced)
        if not self.connected:
            if client.room + extra <= 0 or not client.writable() or not client.send(self._resync(), (0, True)):
                self._resync_at = self._clock() + self.resync_every_s
                return
            self.connected = True
        while self.backlog and client.room + extra > 0:
            payload, n, traced = self.backlog[0]
            if not client.send(payload, (n, traced)):
                self.connected = False
                return
            self._pop_backlog(lost=False)

    def _resync(self) -> bytes:
        """What a (re)connected watcher must learn first: who we are, our groups and
        what is in flight (the newest of it, if all of it would not fit one frame)."""
        inflight = list(self.inflight.values())
        tail, schema = ([self.topology], HOST_TOPOLOGY_SINCE) if self.topology is not None else ([], BASE_SCHEMA)
        while True:
            payload = encode_batch(self.rank, [self.hello, *self.groups, *inflight, *tail], schema)
            if len(payload) <= MAX_WIRE_FRAME or not inflight:
                return payload
            inflight = inflight[len(inflight) // 2 + 1 :]

    def _hand_over(self, extra: int = 0) -> None:
        """At exit: for EXIT_HANDOVER_S at most, hand the backlog to a watcher that is
        taking it and let it take what the window holds (so a goodbye after it is not
        queued behind frames the watcher may not read in zmq's linger); what is still
        in the backlog then is lost, unless traced. A watcher that is gone costs no
        wait; a frozen one, the deadline. `extra` as for _send_backlog."""
        deadline = self._clock() + EXIT_HANDOVER_S
        while self.backlog or len(self.client.window):
            self._send_backlog(extra)
            if not self.connected or self._clock() >= deadline:
                break
            if self.backlog or len(self.client.window):
                self._sleep(0.002)
        while self.backlog:
            self._pop_backlog(lost=True)

    def stop(self, reason: str = "exit", timeout: float = 1.0) -> None:
        """Last flush with a goodbye; bounded in time so exit is never held up."""
        self._stop.set()
        self._wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
        # Async ops whose completion is in flight (a future callback waiting for the
        # GIL, a waiter thread) get a moment to land, so the last op is not lost.
        end = self._clock() + EXIT_GRACE_S
        self._resync_at = 0.0  # at exit a watcher that has come up is asked for at once
        while True:
            self._carry.extend(self._drain())
            if not self.inflight or self._clock() >= end:
                break
            self._sleep(0.005)
        try:
            events = self._carry + self._poll_sources() + [self._counters()]
            self._carry = []
            self._emit_all(events)
            if self.client is not None:
                self._hand_over()
            # The goodbye counts what neither the watcher nor the trace got before it.
            # It may go one past the window (and past a resync), so a watcher that is
            # taking frames gets it even when the window is full; then it is waited for.
            self._emit([Goodbye(time.monotonic_ns(), self.health.dropped, reason)])
            if self.client is not None:
                self._hand_over(extra=2)
        finally:
            if self.trace is not None:
                self.trace.close()
            if self.client is not None:
                self.client.close()
