"""`commviz export FILE --perfetto OUT`: a trace as Chrome trace JSON for Perfetto."""

from __future__ import annotations

import json

from commviz.commands._trace import add_path_arguments, load_trace
from commviz.commands.base import Command


def add_arguments(p) -> None:
    add_path_arguments(p)
    p.add_argument("--perfetto", required=True, metavar="OUT", help="JSON file to write")


def run(args, cmd: list[str]) -> int:
    from commviz.model import Model
    from commviz.trace.perfetto import to_chrome_trace

    loaded = load_trace(args.path, rank_map=args.rank_map)
    model = Model(keep_ops=True)  # every paired op, for the export
    model.ingest_trace(loaded.batches, cut_off=loaded.truncated, snapshot=loaded.snapshot)
    doc = to_chrome_trace(model)
    with open(args.perfetto, "w") as f:
        json.dump(doc, f)
    n = sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    print(f"{n} ops written to {args.perfetto}: open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


COMMAND = Command("export", "a trace as Chrome trace JSON for Perfetto / chrome://tracing", add_arguments, run)
