"""A watcher that counts what reaches it, for conservation tests: listens on ADDR
with the real transport server and prints `hello RANK` on a rank's first frame,
then `bye RANK DROPPED DELIVERED` when its goodbye arrives, DELIVERED being every
event received from it outside resync frames (those open with a hello). Every
50 ms while frames arrive it prints `at T`, T the newest op time received: a test
knows the watcher has caught up with the rank once T passes a time it picked."""

import signal
import sys
import threading
import time

from commviz.events import Goodbye, Hello, OpEnd, OpStart
from commviz.transport.server import Server

addr = sys.argv[1]
delivered: dict[int, int] = {}
lock = threading.Lock()
last_print = [0.0]


def on_batch(batch, payload):
    evs = batch.events
    with lock:
        if batch.rank not in delivered:
            delivered[batch.rank] = 0
            print(f"hello {batch.rank}", flush=True)
        if evs and isinstance(evs[0], Hello):
            return  # a resync: who we are and what is in flight, sent again
        delivered[batch.rank] += len(evs)
        for e in evs:
            if isinstance(e, Goodbye):
                print(f"bye {batch.rank} {e.dropped} {delivered[batch.rank]}", flush=True)
        now = time.monotonic()
        if now - last_print[0] >= 0.05:
            ts = [e.t for e in evs if isinstance(e, (OpStart, OpEnd))]
            if ts:
                last_print[0] = now
                print(f"at {max(ts)}", flush=True)


def on_error(peer, msg):
    print(f"error {peer}: {msg}", flush=True)


server = Server(addr, on_batch, on_error).start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
print("listening", flush=True)
stop.wait()
server.close()
