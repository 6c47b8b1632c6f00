"""`commviz export --parquet`: a file per rank, one row per op, that DuckDB queries
as the README shows."""

import pytest

from commviz.cli import main
from commviz.events import encode_batch
from commviz.trace.file import TraceWriter
from tests.helpers import group, hello, op

pa = pytest.importorskip("pyarrow")

README_QUERY = ("SELECT op, rank, sum(bytes) / sum(coalesce(device_ns, duration_ns)) * any_value(busbw_factor) "
                "AS busbw_gbps FROM '{dir}/*.parquet' WHERE NOT captured GROUP BY op, rank ORDER BY op, rank")


def write_trace(p):
    w = TraceWriter(p)
    for r in (0, 1):
        w.write(encode_batch(r, [hello(r, world=2, mono=1000 * r), group()]))
    for i in range(10):
        for r in (0, 1):
            w.write(encode_batch(r, op(i, 1000 * r + 100 * i, 1000 * r + 100 * i + 50 + r, seq=i, nbytes=4096)))
    w.write(encode_batch(0, op(10, 1000, 0, name="isend", seq=0, peer=1)[:1]))  # never ended
    w.close()


def test_a_file_per_rank_and_the_readme_query_runs(tmp_path, capsys):
    duckdb = pytest.importorskip("duckdb")
    trace, out = tmp_path / "t.cvz", tmp_path / "pq"
    write_trace(trace)
    assert main(["export", str(trace), "--parquet", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["rank-0.parquet", "rank-1.parquet"]
    assert "21 ops of 2 ranks" in capsys.readouterr().out
    rows = duckdb.sql(README_QUERY.format(dir=out)).fetchall()
    # all_reduce of 4096 B, 2 ranks: factor 2(n-1)/n = 1; rank 0 took 50 ns, rank 1 51 ns per op
    assert [(o, r) for o, r, _ in rows] == [("all_reduce", 0), ("all_reduce", 1), ("isend", 0)]
    assert rows[0][2] == pytest.approx(4096 / 50) and rows[1][2] == pytest.approx(4096 / 51)
    assert rows[2][2] is None  # unfinished: no duration
    [(err, t_end)] = duckdb.sql(f"SELECT error, t_end_ns FROM '{out}/rank-0.parquet' WHERE op = 'isend'").fetchall()
    assert err == "unfinished" and t_end is None


def test_rows_carry_wall_clock_times_and_group_size(tmp_path):
    import pyarrow.parquet as pq

    trace, out = tmp_path / "t.cvz", tmp_path / "pq"
    write_trace(trace)
    main(["export", str(trace), "--parquet", str(out)])
    t = pq.read_table(out / "rank-1.parquet").to_pylist()
    assert len(t) == 10 and {r["group_size"] for r in t} == {2} and [r["seq"] for r in t] == list(range(10))
    h = hello(1, world=2, mono=1000)
    assert t[0]["t_start_ns"] == 1000 + (h.wall_ns - h.mono_ns)  # its stamp + the hello's offset
    assert t[0]["duration_ns"] == 51 and t[0]["host"] == "h"
