"""Whether each compiled part earns its keep: the same work with it and without
(`COMMVIZ_PURE=1`, each in its own process), in one run so the ratios compare.

- _fastpack: encoding a rank's frame of 200 queued op records (the sender's flush).
- _fastcols: the watcher's model ingest of 64 ranks' frames (bench/ingest_model.py's
  batches mode, decoded into columns).

    python bench/native_parts.py [--repeat 3]

Prints µs per frame encoded and events per CPU-second ingested, compiled vs pure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ENCODE = r"""
import time
from commviz.events import encode_batch, start_record, end_record
recs = []
for i in range(100):
    recs.append(start_record(i, 10**12 + i, "all_reduce", "0", i, 4096, "float32", (1024,), reduce_op="SUM"))
    recs.append(end_record(i, 10**12 + i + 500))
n = 3000
t0 = time.process_time()
for _ in range(n):
    encode_batch(3, recs)
print((time.process_time() - t0) / n * 1e6)
"""


def run(code_or_args: list[str], pure: bool) -> str:
    env = {**os.environ, "COMMVIZ_PURE": "1" if pure else "0"}
    p = subprocess.run([sys.executable, *code_or_args], env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    return p.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    for _ in range(a.repeat):
        c, p = (float(run(["-c", ENCODE], pure)) for pure in (False, True))
        print(f"_fastpack: a frame of 200 records encoded in {c:.1f} µs compiled, {p:.1f} µs pure ({p / c:.1f}x)")
        ingest = [os.path.join(HERE, "ingest_model.py"), "--ranks", "64", "--rounds", "20"]
        c, p = (run(ingest, pure).rsplit(": ", 1)[1] for pure in (False, True))
        print(f"_fastcols: model ingest {c} compiled, {p} pure")


if __name__ == "__main__":
    main()
