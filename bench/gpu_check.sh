#!/usr/bin/env bash
# The GPU path, for real, on the machine we are lent (one H200, no network,
# Python 3.12, torch 2.11 preinstalled), in under 8 minutes; results as JSON.
#
#   bench/gpu_check.sh [--dry-run]     # from the repository root
#
# Offline: it installs only the wheels carried in .whl/ (msgspec, pyzmq; the TUI's
# textual is not needed here), into /tmp/site, and uses the machine's own torch.
# Make them here (cp312, manylinux), once:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl msgspec pyzmq
# and carry `.whl` with the call. The C extensions are built in place when a
# compiler is there; otherwise the pure-Python paths run (said in the results).
#
# Steps (each with its own time limit; a crash is its return code):
#  0. environment: torch, CUDA, NCCL, GPU, which compiled parts loaded
#  1. facts, one process each (bench/gpu_facts.py): a future on a coalesced Work;
#     a fresh thread's device when the flight recorder is dumped; torch.compile
#     fullgraph of a funcol all_reduce under commviz; a completed Work's result future
#  2. tests/gpu: every op family on NCCL under `commviz record`
#  3. bench/nccl_launch.py: host time the probe adds per NCCL launch, probe asserted on;
#     bench/nccl_split.py: where that time goes (the poller's wakes, each CUDA call);
#     bench/gpu_step.py: a DDP step's wall time with commviz on, against bare
#  4. `commviz topo --json`, and `commviz nvml-dump` (nvml.json: commit it under
#     tests/gpu/fixtures/ so the fake NVML replays a real machine on CI)
# Results: $OUT/gpu_check.json (or ./gpu_check_out/ when $OUT is unset), one entry
# per step: its return code, seconds, and the JSON or last lines it printed; every
# step's whole output in steps.log (the device tool brings back at most 8 files).
# --dry-run: the same steps on the CPU with gloo (CUDA-only facts say skipped), so
# the script itself is rehearsed on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=""
[ "${1:-}" = "--dry-run" ] && DRY="--dry-run"
OUTDIR=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUTDIR"
RES="$OUTDIR/steps.jsonl"
LOGS=$(mktemp -d)
: > "$RES"; : > "$OUTDIR/steps.log"
PY=${PYTHON:-python3}

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "$DRY" ] && ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch here; use --dry-run to rehearse"
    exit 2
fi
# The C extensions for this Python, if a compiler is there (quietly: the results say).
timeout 120 $PY setup.py -q build_ext --inplace >/dev/null 2>&1 || true

# step NAME LIMIT CMD...: run it, record rc, seconds and the tail of its output.
step() {
    local name=$1 limit=$2; shift 2
    echo "---- $name"
    local t0=$SECONDS log="$LOGS/$name.log"
    timeout "$limit" "$@" > "$log" 2>&1
    local rc=$?
    tail -n 5 "$log"
    { echo "==== $name (rc $rc)"; cat "$log"; } >> "$OUTDIR/steps.log"
    $PY - "$name" "$rc" "$((SECONDS - t0))" "$log" >> "$RES" <<'PYEOF'
import json, sys
name, rc, secs, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lines = open(log, errors="replace").read().splitlines()
facts = []
for line in lines:
    try:
        doc = json.loads(line)
    except ValueError:
        continue
    if isinstance(doc, dict):
        facts.append(doc)
print(json.dumps({"step": name, "rc": rc, "seconds": secs, "json": facts, "tail": lines[-8:]}))
PYEOF
}

step env 60 $PY - $DRY <<'PYEOF'
import json, sys
import torch
dry = "--dry-run" in sys.argv
info = {"torch": torch.__version__, "python": sys.version.split()[0], "dry_run": dry}
if not dry:
    info.update(cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())),
                gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count())
import importlib
for mod in ("commviz._fastpack", "commviz.model._fastcols", "commviz.probe._fastwrap", "commviz.transport._fastrecv"):
    try:
        importlib.import_module(mod)
        info[mod] = "loaded"
    except ImportError as exc:
        info[mod] = f"not loaded: {exc}"[:120]
for mod in ("msgspec", "zmq"):
    try:
        info[mod] = importlib.import_module(mod).__version__
    except Exception as exc:
        info[mod] = f"missing: {exc}"
print(json.dumps(info))
PYEOF
for fact in coalesced_future dump_thread_device compile_funcol work_result; do
    step "fact_$fact" 120 $PY bench/gpu_facts.py "$fact" $DRY
done
if [ -z "$DRY" ]; then
    step tests_gpu 240 $PY -m pytest -q -p no:cacheprovider -rs tests/gpu
else
    step tests_gpu 240 $PY -m pytest -q -p no:cacheprovider -rs tests/gpu/test_nvml_fixture.py
fi
step nccl_launch 120 $PY -m torch.distributed.run --standalone --nproc-per-node 1 bench/nccl_launch.py \
    --rounds 20 $DRY
step nccl_split 120 $PY -m torch.distributed.run --standalone --nproc-per-node 1 bench/nccl_split.py \
    --rounds 10 $DRY
step gpu_step 150 $PY -m torch.distributed.run --standalone --nproc-per-node 1 bench/gpu_step.py $DRY
step topo 60 $PY -m commviz.cli topo --json
[ -z "$DRY" ] && step nvml_dump 60 $PY -m commviz.cli nvml-dump --samples 3 "$OUTDIR/nvml.json"

$PY - "$RES" "$OUTDIR/gpu_check.json" <<'PYEOF'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
doc = {"passed": all(s["rc"] == 0 for s in steps), "steps": steps}
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print("gpu_check:", "all steps passed" if doc["passed"] else
      "FAILED: " + ", ".join(s["step"] for s in steps if s["rc"] != 0), "->", sys.argv[2])
sys.exit(0 if doc["passed"] else 1)
PYEOF
