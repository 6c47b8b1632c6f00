"""Export a trace as Parquet, a file per rank (`rank-<R>.parquet`), one row per op,
for DuckDB, Polars or Spark when a trace is past what one machine's memory holds.

Streams: the trace is read in bounded memory (`trace.stream`) and rows go out in
row groups, so the export of a day of trace needs no more memory than an hour's.
Times are wall-clock ns (each rank's stamps plus its hello offset, as everywhere);
`busbw_factor` is nccl-tests' factor for the op's group size (`ops.busbw_factor`),
so busbw = bytes / duration_ns * busbw_factor in GB/s. `duration_ns` is host time
(call to the end the probe saw); a CUDA op also has `device_ns`, its GPU time from
NCCL's own timing or CUDA events around it, which `summary` uses where present:
`coalesce(device_ns, duration_ns)` over rows not `captured` and not `first` is the
time summary times an op by (`enqueue_ns`: the host time the call took to return;
`captured`: recorded into a CUDA graph, nothing ran then; `first`: the rank's first
op on that communicator, mostly NCCL's setup).
An op that never ended has
no end and no duration, and `error` "unfinished". pyarrow is an optional extra
(`pip install 'commviz[parquet]'`).
"""

from __future__ import annotations

import os
from typing import Iterable

from commviz import ops as opcat
from commviz.events import Event, GroupDef, Hello, OpEnd, OpStart
from commviz.model.state import SeenIds

ROW_BUDGET = 262_144  # rows held across all ranks before the biggest buffers are written

COLUMNS = ("rank", "host", "op", "group", "group_size", "seq", "bytes", "dtype", "peer", "root", "reduce_op",
           "t_start_ns", "t_end_ns", "duration_ns", "error", "busbw_factor", "device_ns", "enqueue_ns", "captured",
           "first")


class MissingPyarrow(ImportError):
    pass


def _schema():
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise MissingPyarrow("Parquet export needs pyarrow: pip install 'commviz[parquet]'") from exc
    i64, s = pa.int64(), pa.string()
    return pa.schema([("rank", i64), ("host", s), ("op", s), ("group", s), ("group_size", i64), ("seq", i64),
                      ("bytes", i64), ("dtype", s), ("peer", i64), ("root", i64), ("reduce_op", s),
                      ("t_start_ns", i64), ("t_end_ns", i64), ("duration_ns", i64), ("error", s),
                      ("busbw_factor", pa.float64()), ("device_ns", i64), ("enqueue_ns", i64),
                      ("captured", pa.bool_()), ("first", pa.bool_())])


class _Rank:
    __slots__ = ("rank", "host", "offset", "open", "seen", "rows", "writer")

    def __init__(self, rank: int) -> None:
        self.rank, self.host, self.offset = rank, "", 0
        self.open: dict[int, tuple[OpStart, int]] = {}  # op id -> (start, wall ns)
        self.seen = SeenIds()
        self.rows: list[tuple] = []
        self.writer = None


class ParquetExport:
    """Fed the trace's events in order (`add`), writes `DIR/rank-<R>.parquet`."""

    def __init__(self, out_dir: str) -> None:
        self.schema = _schema()
        self.dir = out_dir
        os.makedirs(out_dir, exist_ok=True)
        self.ranks: dict[int, _Rank] = {}
        self.sizes: dict[str, int] = {}
        self.held = 0
        self.rows = 0

    def add(self, t: int, rank: int, ev: Event) -> None:
        r = self.ranks.get(rank)
        if r is None:
            r = self.ranks[rank] = _Rank(rank)
        if isinstance(ev, OpStart):
            if ev.id not in r.seen:  # a start resent after a reconnect is the same op
                r.seen.add(ev.id)
                r.open[ev.id] = (ev, t)
        elif isinstance(ev, OpEnd):
            got = r.open.pop(ev.id, None)
            if got is not None:
                self._row(r, got[0], got[1], ev, t)
        elif isinstance(ev, Hello):
            r.host = ev.host
        elif isinstance(ev, GroupDef):
            self.sizes[ev.group] = len(ev.ranks)

    def _row(self, r: _Rank, s: OpStart, t0: int, e: OpEnd | None, t1: int | None) -> None:
        n = self.sizes.get(s.group, 0)
        nbytes = e.bytes if e is not None and e.bytes >= 0 else s.bytes
        peer = e.peer if e is not None and e.peer >= 0 else s.peer
        r.rows.append((r.rank, r.host, s.op, s.group, n, s.seq, nbytes, s.dtype, peer, s.root, s.reduce_op, t0, t1,
                       None if t1 is None else t1 - t0, "unfinished" if e is None else e.error,
                       opcat.busbw_factor(s.op, n),
                       e.device_ns if e is not None and e.device_ns >= 0 else None,
                       e.enqueue_ns if e is not None and e.enqueue_ns >= 0 else None,
                       e is not None and e.captured, e is not None and e.first))
        self.held += 1
        if self.held >= ROW_BUDGET:
            for big in sorted(self.ranks.values(), key=lambda x: -len(x.rows))[: max(1, len(self.ranks) // 4)]:
                self._write(big)

    def _write(self, r: _Rank) -> None:
        if not r.rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = list(zip(*r.rows))
        table = pa.table({name: pa.array(col, type=self.schema.field(name).type) for name, col in zip(COLUMNS, cols)})
        if r.writer is None:
            r.writer = pq.ParquetWriter(os.path.join(self.dir, f"rank-{r.rank}.parquet"), self.schema)
        r.writer.write_table(table)
        self.held -= len(r.rows)
        self.rows += len(r.rows)
        r.rows = []

    def close(self) -> list[str]:
        """Write what is held (unfinished ops too) and close; the files written."""
        out = []
        for r in self.ranks.values():
            for s, t0 in r.open.values():
                self._row(r, s, t0, None, None)
            r.open.clear()
            self._write(r)
            if r.writer is not None:
                r.writer.close()
                out.append(os.path.join(self.dir, f"rank-{r.rank}.parquet"))
        return sorted(out)


def export_parquet(events: Iterable[tuple[int, int, Event]], out_dir: str) -> tuple[list[str], int]:
    """Write the events (in the one order) as Parquet; (files, rows)."""
    ex = ParquetExport(out_dir)
    for t, rank, ev in events:
        ex.add(t, rank, ev)
    files = ex.close()
    return files, ex.rows
