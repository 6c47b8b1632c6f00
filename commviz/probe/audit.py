"""Reading torch's flight recorder on the rank, so the watcher can compare what the
backend ran with what commviz saw (model/audit.py). Read at exit and when an op
passes the stack-capture threshold — about 20 ms for 2,000 entries, so never per op
and never on the caller's thread: at exit on the exiting thread, otherwise on a
short-lived thread of its own, one at a time."""

from __future__ import annotations

import json
import os
import threading
import time

from commviz.events import AUDIT_SINCE, Audit, BackendOp

_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def read(backend: str) -> Audit:
    """The recorder's entries now, or an Audit whose `state` says why there are none."""
    t, wall = time.monotonic_ns(), time.time_ns()
    try:
        doc = json.loads(_dump(backend))
    except Exception as exc:
        return Audit(t, wall, f"unreadable: {type(exc).__name__}: {exc}"[:300])
    entries = doc.get("entries") or [] if isinstance(doc, dict) else []
    if not entries:
        if not any(os.environ.get(v, "0").strip() not in ("", "0") for v in _BUFFER_VARS):
            return Audit(t, wall, "off: torch's flight recorder is off (set TORCH_FR_BUFFER_SIZE=2000 on the job)")
        return Audit(t, wall, "empty: the flight recorder holds no entries")
    first = min(e.get("record_id", 0) for e in entries)
    if first > 0:
        return Audit(t, wall, f"wrapped: the flight recorder kept its last {len(entries)} of {first + len(entries)} "
                              "entries (raise TORCH_FR_BUFFER_SIZE to audit the whole run)")
    ops = []
    for e in entries:
        name = str(e.get("profiling_name", ""))
        name = name.split(":", 1)[1] if ":" in name else name
        pg = e.get("process_group") or ["", ""]
        ops.append(BackendOp(str(pg[0]), name.split(" ", 1)[0], int(e.get("time_created_ns") or 0)))
    return Audit(t, wall, "", ops)


def _dump(backend: str):
    import torch._C._distributed_c10d as c10d

    if "nccl" in backend and hasattr(c10d, "_dump_nccl_trace_json"):
        return c10d._dump_nccl_trace_json(True, False)  # collectives, not only active ones
    return c10d._dump_fr_trace_json(True, False)


class Auditor:
    """Pushes an Audit into the probe's queue; one read at a time. An Audit is a kind
    of event schema 2, so from the first one on this rank's frames are stamped 2
    (audits come at exit or once an op is long overdue; checking every batch for the
    kind would cost as much as encoding it)."""

    def _push(self, audit) -> None:
        if getattr(self.probe, "sender", None) is not None:
            self.probe.sender.schema = AUDIT_SINCE
        self.probe.push(audit)

    def __init__(self, probe) -> None:
        self.probe = probe
        self._busy = threading.Lock()
        self._last_backend = ""

    def remember(self) -> None:
        """The default group is about to be destroyed: keep its backend, so the exit
        audit still reads NCCL's recorder, not the generic one."""
        g = self.probe.default_group
        if g is not None:
            self._last_backend = g.backend

    def backend(self) -> str:
        g = self.probe.default_group
        return g.backend if g is not None else self._last_backend

    def _on_the_ranks_device(self) -> bool:
        """Make this fresh thread's current device the rank's before the recorder's
        dump queries CUDA events: on a thread of its own, device 0 is current, and a
        query there opens a ~500 MiB context on GPU 0 of every rank but rank 0's GPU.
        False when CUDA is up and the rank's GPU is not known yet: then no read."""
        cuda = getattr(self.probe, "cuda_module", None)  # a stand-in in tests
        if cuda is None:
            import torch.cuda as cuda
        if not getattr(cuda, "_initialized", False):
            return True  # no CUDA in this process: nothing to open
        hello = getattr(self.probe, "hello", None)
        device = getattr(hello, "device", "") or ""
        if not device.startswith("cuda:"):
            return False
        cuda.set_device(int(device.split(":", 1)[1]))
        return True

    def now(self) -> None:
        """At exit, on the exiting thread; a read already under way (a long op's) will
        push its own result, and exit never waits long for it."""
        if not self._busy.acquire(timeout=0.5):
            return
        try:
            self._push(read(self.backend()))
        finally:
            self._busy.release()

    def soon(self) -> None:
        """An op passed the stack threshold: read on a thread of its own."""
        if self._busy.locked():
            return

        def run():
            if self._busy.acquire(blocking=False):
                try:
                    if not self._on_the_ranks_device():
                        return  # the exit read, on the rank's own thread, still comes
                    self._push(read(self.backend()))
                except Exception as exc:
                    self.probe.health.internal("audit", exc)
                finally:
                    self._busy.release()

        threading.Thread(target=run, name="commviz-audit", daemon=True).start()
