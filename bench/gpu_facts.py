"""One fact about torch on this machine per run, as one JSON line, for
bench/gpu_check.sh. Each runs in its own process, so a segfault is a return code
there, not a lost check. `--dry-run`: gloo on the CPU, to rehearse without a GPU
(the facts that need CUDA say they were skipped).

    python bench/gpu_facts.py FACT [--dry-run]

Facts:
  coalesced_future  is a future set on the Work `_coalescing_manager` returns (NCCL's
                    endCoalescing sets none; commviz polls that Work and never asks)
  compile_funcol    torch.compile(fullgraph=True) of a functional all_reduce under
                    commviz: the plain result, one event for the compiled call
  dump_thread_device  the current device of a fresh thread, and of commviz's
                    long-op audit thread, when the flight recorder is dumped
  work_result       what `get_future_result()` of a completed async NCCL op holds,
                    and how long until the watchdog completes it (the probe asks it
                    instead of the deprecated `exception()`)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading


def world(dry: bool):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 300))
    dist.init_process_group("gloo" if dry else "nccl", rank=0, world_size=1)
    dev = torch.device("cpu") if dry else torch.device("cuda", 0)
    if not dry:
        torch.cuda.set_device(dev)
    return dist, dev


def coalesced_future(dry: bool) -> dict:
    import torch

    if dry:
        return {"skipped": "gloo has no coalescing (startCoalescing)"}
    dist, dev = world(dry)
    t = torch.ones(1024, device=dev)
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.all_reduce(t)
        dist.all_reduce(t)
    works = list(getattr(cm, "works", []) or [])
    out = {"works": len(works)}
    if works:
        w = works[-1]
        w.wait()
        try:
            fut = w.get_future()
            out["future"] = type(fut).__name__
            out["future_done"] = bool(fut.done())
        except Exception as exc:
            out["future_error"] = f"{type(exc).__name__}: {exc}"[:200]
    out["ok"] = True  # reaching here: get_future() did not crash the process
    return out


def compile_funcol(dry: bool) -> dict:
    os.environ.setdefault("COMMVIZ_ADDR", f"ipc://{tempfile.mkdtemp()}/nobody.sock")
    import torch

    import commviz
    from commviz.probe.patch import current

    commviz.instrument()
    dist, dev = world(dry)
    probe = current()
    assert probe is not None and probe.ensure_started(), "commviz is off: nothing would be checked"
    import torch.distributed._functional_collectives as funcol

    def f(x):
        return funcol.all_reduce(x, "sum", dist.group.WORLD) * 2

    x = torch.arange(8.0, device=dev)
    want = f(x)
    first = next(probe.ids)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    events = next(probe.ids) - first - 1
    return {"ok": bool(torch.equal(got.cpu(), want.cpu())), "events": events,
            "kernels": probe.kernels is not None and probe.kernels.lib is not None}


def dump_thread_device(dry: bool) -> dict:
    import torch

    if dry:
        return {"skipped": "needs CUDA"}
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    dist, dev = world(dry)
    t = torch.ones(1024, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    seen = {}

    def fresh():
        seen["fresh_current_device"] = torch.cuda.current_device()
        torch._C._distributed_c10d._dump_nccl_trace_json(True, False)

    th = threading.Thread(target=fresh)
    th.start()
    th.join()
    # One GPU cannot show a context opened on another; two or more can.
    seen["gpus"] = torch.cuda.device_count()
    seen["ok"] = True
    return seen


def work_result(dry: bool) -> dict:
    import time

    import torch

    dist, dev = world(dry)
    w = dist.all_reduce(torch.ones(1024, device=dev), async_op=True)
    w.wait()
    if not dry:
        torch.cuda.synchronize()
    out = {"completed": bool(w.is_completed())}
    try:
        fut = w.get_future_result()
    except Exception as exc:  # noqa: BLE001 - gloo: not implemented
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
        out["ok"] = True
        return out
    out["done_at_once"] = bool(fut.done())
    t0 = time.monotonic()
    while not fut.done() and time.monotonic() - t0 < 5:
        time.sleep(0.005)
    out["done_after_s"] = round(time.monotonic() - t0, 3)
    out["value"] = int(fut.value()) if fut.done() else None
    out["ok"] = True
    return out


FACTS = {"coalesced_future": coalesced_future, "compile_funcol": compile_funcol,
         "dump_thread_device": dump_thread_device, "work_result": work_result}


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    if len(args) != 1 or args[0] not in FACTS:
        raise SystemExit(f"usage: gpu_facts.py {{{','.join(FACTS)}}} [--dry-run]")
    out = {"fact": args[0], "dry_run": "--dry-run" in sys.argv}
    try:
        out.update(FACTS[args[0]]("--dry-run" in sys.argv))
    except Exception as exc:
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
    print(json.dumps(out), flush=True)
    os._exit(0 if out.get("ok", True) else 1)  # no teardown: a fact, not a job


if __name__ == "__main__":
    main()
