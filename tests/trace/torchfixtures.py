"""NCCL-shaped flight-recorder dumps and profiler traces, built from the fields torch
documents (no GPU here): what `_dump_nccl_trace_json()` and `export_chrome_trace` write
on an NCCL job."""

from __future__ import annotations

import json

T0 = 1_790_000_000_000_000_000


def fr_entry(rid: int, seq: int, op: str = "all_reduce", numel: int = 1024, dtype: str = "Float",
             state: str = "completed", t0: int = 0, dur: int = 1000, pg=("0", "default_pg"), p2p_seq: int = 0,
             out_numel: int | None = None) -> dict:
    """One recorder entry; `op` may be "send 0->1" / "recv 1<-0" for p2p."""
    p2p = " " in op
    done = state == "completed"
    return {
        "record_id": rid, "pg_id": 0, "process_group": list(pg), "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": p2p_seq if p2p else 0, "op_id": rid + 1, "profiling_name": f"nccl:{op}",
        "time_created_ns": T0 + t0, "input_sizes": [[numel]], "input_dtypes": [dtype],
        "output_sizes": [[out_numel if out_numel is not None else numel]], "output_dtypes": [dtype],
        "state": state, "time_discovered_started_ns": T0 + t0 + 10 if state != "scheduled" else None,
        "time_discovered_completed_ns": T0 + t0 + dur if done else None, "retired": done,
        "timeout_ms": 600000, "is_p2p": p2p, "thread_name": "pt_main_thread", "thread_id": "1",
        "frames": [{"name": "train_step", "filename": "/home/u/train.py", "line": 42}],
    }


def fr_dump(entries: list[dict], ranks=(0, 1)) -> dict:
    return {
        "version": "2.10", "comm_lib_version": "2.21.5", "entries": entries,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(ranks))}},
        "pg_status": {"0": {"last_enqueued_collective": len(entries), "last_started_collective": -1,
                            "last_completed_collective": -1}},
        "nccl_comm_state": {},
    }


def rpc(name: str, ts_us: float, dur_us: float, xid: int, rank: int, nelems: int, out_nelems: int | None = None,
        dtype: str = "Float", seq: int | None = None, ranks=(0, 1), pg: str = "0", peer: int | None = None) -> dict:
    """A `record_param_comms` CPU op, as ProcessGroupNCCL records it."""
    args = {
        "External id": xid, "Collective name": name, "In msg nelems": nelems,
        "Out msg nelems": out_nelems if out_nelems is not None else nelems, "dtype": dtype,
        "Group size": len(ranks), "Process Group Name": pg, "Process Group Description": "default_pg",
        "Process Group Ranks": json.dumps(list(ranks)), "Rank": rank, "In split size": "[]", "Out split size": "[]",
    }
    if seq is not None:
        args["Seq"] = seq
    if peer is not None:
        args["Dst Rank" if name == "send" else "Src Rank"] = peer
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts_us,
            "dur": dur_us, "args": args}


def kernel(name: str, ts_us: float, dur_us: float, xid: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{name}(ncclDevKernelArgsStorage<4096ul>)",
            "pid": 0, "tid": 7, "ts": ts_us, "dur": dur_us, "args": {"External id": xid, "device": 0, "stream": 7}}


def profile(rank: int, events: list[dict], world: int = 2) -> dict:
    return {
        "schemaVersion": 1, "baseTimeNanoseconds": T0, "displayTimeUnit": "ms", "traceEvents": events,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                           "pg_size": world, "ranks": list(range(world))}], "nccl_version": "2.21.5"},
    }
