"""How fast this box is right now, in two numbers that do not depend on commviz: a
pure-Python loop (what the model's per-rank and per-frame steps cost) and a numpy
sort (what its batch phases cost). The box's speed moves by up to ~1.8× from one
session to the next (docs/PERFORMANCE.md); a figure recorded with these beside it can
be compared with one recorded on another day.

    python bench/yardstick.py

Best of 7 of each; lower is faster.
"""

from __future__ import annotations

import time

import numpy as np


def python_loop(n: int = 300_000) -> float:
    """ns per step of a loop of dict lookups, int arithmetic and a method call."""
    d = {i: i for i in range(1024)}
    out = []
    t = time.perf_counter()
    acc = 0
    for i in range(n):
        acc += d[i & 1023] * 3 + (i >> 2)
        if not i & 255:
            out.append(acc)
    return (time.perf_counter() - t) / n * 1e9


def numpy_sort(n: int = 1 << 20) -> float:
    """ms to argsort a million int64 keys (stable, as the batch path sorts)."""
    a = np.random.default_rng(0).integers(0, 1 << 40, n)
    t = time.perf_counter()
    a.argsort(kind="stable")
    return (time.perf_counter() - t) * 1e3


def main() -> int:
    py = min(python_loop() for _ in range(7))
    sort = min(numpy_sort() for _ in range(7))
    print(f"python loop {py:.0f} ns/step, numpy stable argsort of 1M int64 {sort:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
