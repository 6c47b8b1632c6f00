"""`commviz nvml-dump FILE`: this machine's NVML view as a fixture file, for
`commviz topo --fixture` and the tests."""

from __future__ import annotations

from commviz.commands.base import Command
from commviz.errors import CommvizError


def add_arguments(p) -> None:
    p.add_argument("path", metavar="FILE")
    p.add_argument("--samples", type=int, default=3, help="counter readings to capture (default 3)")
    p.add_argument("--interval", type=float, default=0.2, metavar="S", help="seconds between readings")


def run(args, cmd: list[str]) -> int:
    from commviz.topo.dump import fixture_from, fixture_text
    from commviz.topo.real import RealNvml

    backend = RealNvml()
    if not backend.available:
        raise CommvizError(f"cannot dump: {backend.reason}. Run `commviz nvml-dump FILE` on the GPU machine "
                           "you want to capture; `commviz topo --fixture FILE` shows the result anywhere.")
    try:
        doc = fixture_from(backend, samples=args.samples, interval_s=args.interval)
    finally:
        backend.close()
    try:
        with open(args.path, "w", encoding="utf-8") as f:
            f.write(fixture_text(doc))
    except OSError as exc:
        raise CommvizError(f"cannot write {args.path}: {exc.strerror or exc}") from exc
    print(f"fixture of {len(doc['gpus'])} GPU(s) on {doc['host']} written to {args.path}"
          f"  (commviz topo --fixture {args.path})")
    return 0


COMMAND = Command("nvml-dump", "write this machine's GPU topology and counters as a fixture file", add_arguments,
                  run, description="Capture this machine's NVML view (topology and a few counter readings) "
                  "as a fixture for `commviz topo --fixture` and the tests.")
