"""One rank on torch's `fake` backend (no peers needed) issuing all_reduce as fast
as it can, streaming to COMMVIZ_ADDR: a load that reaches every cap of the probe.

Every 20 ms it prints `state MONO_NS OPS DROPPED BACKLOG RSS` (its own op count and
the probe's counters); it stops when its stdin closes, prints `done OPS`, shuts the
probe down (its goodbye) and prints `emitted EVENTS OP_RECORDS`: what the sender
emitted, counted by a spy on it (the queue's own drops are the op records missing)."""

import os
import sys
import threading
import time

import commviz
from commviz.probe import sender as sender_mod

# A spy on everything the sender emits, from its very first frame.
emitted = [0, 0]
_emit = sender_mod.Sender._emit


def spy(self, events):
    emitted[0] += len(events)
    emitted[1] += sum(not hasattr(e, "__struct_fields__") for e in events)  # op records: plain sequences
    _emit(self, events)


sender_mod.Sender._emit = spy
commviz.instrument()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from commviz.probe.patch import current  # noqa: E402

dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
t = torch.ones(4)
dist.all_reduce(t)
probe = current()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
page = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page


n = 1
print("ready", flush=True)
next_report = 0.0
while not stop.is_set():
    for _ in range(100):
        dist.all_reduce(t)
    n += 100
    now = time.monotonic()
    if now >= next_report:
        next_report = now + 0.02
        s = probe.sender
        print(f"state {time.monotonic_ns()} {n} {probe.health.dropped} {s.backlog_events} {rss()}", flush=True)
print(f"done {n}", flush=True)
probe.shutdown()
print(f"emitted {emitted[0]} {emitted[1]}", flush=True)
dist.destroy_process_group()
