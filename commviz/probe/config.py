"""Rank-side settings from the environment (the contract in docs/ARCHITECTURE.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeConfig:
    enabled: bool
    addr: str
    trace_dir: str | None
    queue_cap: int = 65536  # records held between the caller and the sender thread (a folded op: two events)
    flush_interval_s: float = 0.02
    stack_after_s: float = 3.0  # capture the caller's stack of ops in flight this long
    samples: bool = True  # host/GPU samples from local rank 0 (COMMVIZ_SAMPLES=0: off)
    ring: bool = False  # crash ring of recent op starts (trace/ring.py)

    @classmethod
    def from_env(cls, addr: str | None = None, trace_dir: str | None = None) -> "ProbeConfig":
        from commviz.transport.address import default_addr

        env = os.environ
        return cls(
            enabled=env.get("COMMVIZ", "1") != "0",
            addr=addr or env.get("COMMVIZ_ADDR") or default_addr(),
            trace_dir=trace_dir or env.get("COMMVIZ_TRACE_DIR") or None,
            stack_after_s=_float(env.get("COMMVIZ_STACK_AFTER"), 3.0),
            samples=env.get("COMMVIZ_SAMPLES", "1") != "0",
            # The crash ring costs 0.1-0.3 µs more per op (docs/PERFORMANCE.md): on where durability was asked for
            # (a trace dir; `commviz record/watch -- CMD` set COMMVIZ_RING=1), else off.
            ring=env.get("COMMVIZ_RING", "1" if (trace_dir or env.get("COMMVIZ_TRACE_DIR")) else "0") != "0",
        )


def _float(value: str | None, default: float) -> float:
    try:
        return float(value) if value else default
    except ValueError:
        return default
