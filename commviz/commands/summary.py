"""`commviz summary FILE_OR_DIR [--json]`: the per-op table and the diagnoses of a trace
(a `.cvz` file, a COMMVIZ_TRACE_DIR of per-rank traces, or torch's flight-recorder
dumps and profiler traces), read in bounded memory; or, with `--live ADDR`, of a
running `commviz serve`, now. `--json` gives the document scripts read
(docs/ARCHITECTURE.md, "commviz summary --json")."""

from __future__ import annotations

import json
import os

from commviz.commands._trace import add_path_arguments, open_stream
from commviz.commands.base import JSON_HELP, Command
from commviz.errors import CommvizError
from commviz.model import traces


def add_arguments(p) -> None:
    add_path_arguments(p, optional=True)
    p.add_argument("--live", metavar="ADDR", help="the summary of a running `commviz serve` now, instead of a "
                   "trace: its --http HOST:PORT (e.g. 127.0.0.1:9400), or on this machine the address its ranks "
                   "use (ipc://…, tcp://…); your own collectors' tokens are found by themselves, COMMVIZ_TOKEN for "
                   "another's")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--hang-after", type=float, default=1.0, metavar="S",
                   help="ops still waiting this long at the end of the trace count as a hang (default 1)")


def run(args, cmd: list[str]) -> int:
    from commviz.model import Model
    from commviz.report import render_summary
    from commviz.trace import readahead

    if args.live:
        from commviz.httpview import fetch_summary

        if args.path:
            raise CommvizError(f"give a trace ({args.path}) or --live {args.live}, not both")

        s = fetch_summary(args.live, os.environ.get("COMMVIZ_TOKEN"))
        print(json.dumps(s, indent=2) if args.json else render_summary(s, s.get("notes")))
        return 0
    if not args.path:
        raise CommvizError("summary needs a trace (FILE_OR_DIR) or --live URL of a running `commviz serve --http`")

    # Read in bounded memory: frames stream through the model, which keeps aggregates.
    loaded = open_stream(args.path, note=False, rank_map=args.rank_map)  # problems go into the summary itself
    model = Model(hang_after_s=args.hang_after, flows=False)  # the summary shows no flows
    chunks = readahead.chunks(loaded)
    try:
        traces.ingest_chunks(model, chunks, cut_off=loaded.truncated, snapshot=loaded.snapshot)
    finally:  # the child's files stay open until the model is done with its last tail
        if isinstance(chunks, readahead.ChildMerge):
            chunks.close()
    s = model.summary()
    if loaded.problems:
        s["problems"] = loaded.problems
    if loaded.notes:
        s["notes"] = loaded.notes  # what torch's files cannot tell
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(render_summary(s, loaded.problems + loaded.notes))
    return 0


COMMAND = Command("summary", "per-op table (or --json) of a trace file or COMMVIZ_TRACE_DIR, or of torch's "
                  "flight-recorder dumps / profiler traces", add_arguments, run, description=__doc__)
