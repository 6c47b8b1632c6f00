"""A watcher without a screen, for fault tests: listens on ADDR, prints `ranks N`
whenever the number of ranks it has heard a hello from changes (and `gone N` when
the number that exited or died does), and on SIGTERM writes the model's summary
(plus per-rank op counts) as JSON to OUT."""

import json
import signal
import sys
import threading
import time

from commviz.watcher import LiveFeed

addr, out = sys.argv[1], sys.argv[2]
feed = LiveFeed(addr).start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
seen, seen_gone = -1, 0
print("listening", flush=True)
while not stop.wait(0.02):
    feed.drain()
    with feed.lock:
        n = sum(r.hello is not None for r in feed.model.ranks.values())
        gone = sum(r.gone for r in feed.model.ranks.values())
    if n != seen:
        seen = n
        print(f"ranks {n} {time.monotonic():.3f}", flush=True)
    if gone != seen_gone:
        seen_gone = gone
        print(f"gone {gone}", flush=True)
feed.drain()
with feed.lock:
    s = feed.model.summary()
feed.close()
with open(out, "w") as f:
    json.dump(s, f)
