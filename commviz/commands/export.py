"""`commviz export FILE --perfetto OUT`: a trace as Chrome trace JSON for Perfetto.
`commviz export FILE --parquet DIR`: one row per op, a Parquet file per rank, for
DuckDB / Polars / Spark. Both stream: any length of trace in bounded memory."""

from __future__ import annotations

import sys

from commviz.commands._trace import add_path_arguments, open_stream
from commviz.commands.base import Command
from commviz.errors import CommvizError


def add_arguments(p) -> None:
    add_path_arguments(p)
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--perfetto", metavar="OUT", help="JSON file to write")
    to.add_argument("--parquet", metavar="DIR", help="directory for rank-<R>.parquet (needs commviz[parquet])")


def run(args, cmd: list[str]) -> int:
    if args.parquet:
        return parquet(args.path, args.parquet, args.rank_map)
    return perfetto(args.path, args.perfetto, args.rank_map)


def perfetto(path: str, out: str, rank_map: list[str] | None = None) -> int:
    """Streams: the model keeps no op, each is written as it ends
    (`trace.perfetto.export_stream`)."""
    from commviz.trace.perfetto import export_stream

    stream = open_stream(path, rank_map=rank_map)  # notes on what the first pass found
    seen = len(stream.problems)
    w = export_stream(stream, out)
    for p in dict.fromkeys(stream.problems[seen:]):  # frames that did not decode (once, if read twice)
        print(f"commviz: note: {p}", file=sys.stderr)
    print(f"{w.ops} ops written to {out}: open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


def parquet(path: str, out_dir: str, rank_map: list[str] | None = None) -> int:
    from commviz.trace.parquet import MissingPyarrow, export_parquet

    stream = open_stream(path, rank_map=rank_map)
    try:
        files, rows = export_parquet(stream.events(), out_dir)
    except MissingPyarrow as exc:
        raise CommvizError(str(exc)) from exc
    print(f"{rows} ops of {len(files)} ranks written to {out_dir}/rank-<R>.parquet; e.g. "
          f"duckdb -c \"SELECT op, rank, sum(bytes) / sum(duration_ns) * any_value(busbw_factor) AS busbw_gbps "
          f"FROM '{out_dir}/*.parquet' GROUP BY op, rank ORDER BY op, rank\"")
    return 0


COMMAND = Command("export", "a trace as Chrome trace JSON for Perfetto, or as Parquet for DuckDB/Polars/Spark",
                  add_arguments, run)
