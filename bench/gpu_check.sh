#!/usr/bin/env bash
# The GPU path, for real, on the machine we are lent (one H100 or H200, no network,
# Python 3.12, torch 2.11 preinstalled), in one call of under 9 minutes; results as JSON.
#
#   bench/gpu_check.sh [--dry-run]     # from the repository root
#
# Offline: it installs only the wheels carried in .whl/ into /tmp/site and uses the
# machine's own torch. Make them here, once per checkout (it also tells git to ignore
# .whl through .git/info/exclude):
#   bash bench/gpu_wheels.sh           # msgspec, pyzmq, py-spy for cp312 manylinux
# and carry `.whl` with the call. The C extensions are built in place when a
# compiler is there; otherwise the pure-Python paths run (said in the results).
#
# The device call (one H100 or H200; ~9 minutes at most, the tool's limit is 10):
#   run(command="PYTHONUNBUFFERED=1 bash bench/gpu_check.sh", carry=[".whl"], timeout_s=590)
#
# Time: the whole script keeps to GPU_CHECK_BUDGET_S (default 520 s from its start, the
# install and build included; 1800 s with --dry-run). Each step has its own limit, cut
# to what is left; a step that would get under half its limit (or 25 s) is skipped and
# says "out of time". The steps run in the order of what is least known: sharing first,
# then world size 2, the overlap, world size 4, the launch cost, and last what earlier
# runs already had.
# After each step, every process it started is killed (by an environment mark), so no
# rank keeps the GPU into the next.
#
# Steps (a crash is its return code; "skipped" says why):
#  env         torch, CUDA, NCCL, GPU, which compiled parts loaded, py-spy
#  topo        `commviz topo --json`; nvml_dump: `commviz nvml-dump` (nvml.json)
#  share       bench/nccl_share.py --world 2 4: can N ranks share the one GPU (a host
#              id each: bench/gpushare.py)? NCCL's own answer either way: the refusal
#              text, or its version, network and each channel's transport
#  wN_<check>  for each world size N that shared, bench/nccl_world.py CHECK --world N,
#              a job of tests/gpu/jobs under `commviz record` writing its own expected
#              results, checked against `commviz summary --json`:
#                every_op  exact counts and bytes for every op kind; device time
#                          against host time per op; the flight-recorder audit with
#                          nothing unseen; NVML values in the samples under traffic
#                queued    two async all_reduces, the second queued behind the first:
#                          its device time excludes the first's
#                hang, dead, desync  diagnosed live by record (op, ranks, the lines)
#                watchdog  NCCL's watchdog ends a hang; the op ends with its error
#                attach    `commviz attach` on a plain NCCL job: RAS, dumps, stacks
#  overlap     bench/gpu_overlap.py under CUDA_DEVICE_MAX_CONNECTIONS=1 at world size
#              2 where sharing works (else 1): step-time ratio with commviz, and
#              whether the all_reduce still overlaps the matmuls (CUDA events)
#  nccl_launch bench/nccl_launch.py: host time the probe adds per NCCL launch
#  tests_gpu   tests/gpu at world size 1 (every op family, captured op, capture modes)
#  gpu_step    bench/gpu_step.py: a DDP step's wall time with commviz on, against bare
#  nccl_split  bench/nccl_split.py: where the launch's added time goes
#  fact_*      bench/gpu_facts.py, one process each
#
# Results: $OUT/gpu_check.json (or ./gpu_check_out/ when $OUT is unset), one entry per
# step: its return code, seconds, limit, and the JSON or last lines it printed; every
# step's whole output in steps.log (it and steps.jsonl, a line a step, are written as
# steps end: a call cut short still brings back what ran). What CPU tests should
# replay is packed in fixtures.tar.gz: NCCL's INFO log of each sharing try
# (nccl_share_ws<N>.log: the transport lines), flight-recorder dumps from NCCL
# (every_op_ws<N>_fr_nccl_rank<R>.json, attach_ws<N>_fr_*), RAS answers and the whole attach document (attach_ws<N>.json),
# the Sample events' values under traffic (every_op_ws<N>_samples.json), and each
# check's summary document. To commit them (five files come back; the device tool
# brings back 8 at most):
#   mkdir -p tests/gpu/fixtures/<card>_ws && tar xzf <files_at>/fixtures.tar.gz -C tests/gpu/fixtures/<card>_ws
#   cp <files_at>/nvml.json tests/gpu/fixtures/<card>_1gpu.json    # replayed by test_nvml_fixture
# (<card>: h100 or h200, as env's "gpu" says. The tar goes in a folder of its own:
# test_nvml_fixture replays every *.json directly in tests/gpu/fixtures as an NVML dump.)
# --dry-run: the same steps on the CPU with gloo (CUDA-only facts say skipped), so
# the script itself is rehearsed on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
DRY=""
[ "${1:-}" = "--dry-run" ] && DRY="--dry-run"
BUDGET=${GPU_CHECK_BUDGET_S:-$([ -n "$DRY" ] && echo 1800 || echo 520)}  # a 2-core box is slower than the GPU's 16
OUTDIR=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUTDIR"
LOGS=$(mktemp -d)
RES="$OUTDIR/steps.jsonl"  # one line a step as it ends: what comes back if the call is cut short
FIX="$LOGS/fixtures"
mkdir -p "$FIX"
: > "$RES"; : > "$OUTDIR/steps.log"
PY=${PYTHON:-python3}

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "$DRY" ] && ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch here; use --dry-run to rehearse"
    exit 2
fi
# The C extensions for this Python, if a compiler is there (quietly: the results say).
[ -z "$DRY" ] && timeout 90 $PY setup.py -q build_ext --inplace >/dev/null 2>&1

# reap MARK: kill every process of ours still carrying GPU_CHECK_STEP=MARK (a step's
# torchrun workers live in sessions of their own; a timeout does not reach them).
reap() {
    $PY - "$1" <<'PYEOF'
import os, signal, sys
mark = f"GPU_CHECK_STEP={sys.argv[1]}".encode()
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == os.getpid():
        continue
    try:
        with open(f"/proc/{d}/environ", "rb") as f:
            if mark in f.read().split(b"\0"):
                os.kill(int(d), signal.SIGKILL)
    except OSError:
        pass
PYEOF
}

# skip NAME WHY: record a step that did not run.
skip() {
    echo "---- $1: skipped: $2"
    $PY -c 'import json, sys; print(json.dumps({"step": sys.argv[1], "rc": None, "skipped": sys.argv[2]}))' \
        "$1" "$2" >> "$RES"
}

# step NAME LIMIT CMD...: run it (STEP_LIMIT in its environment), record rc, seconds,
# its limit and the JSON lines it printed; kill what it left behind.
step() {
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET - (SECONDS - START) - 10))
    if [ "$left" -lt 25 ] || [ "$left" -lt $((limit / 2)) ]; then  # cut to under half, it would fail, not skip
        skip "$name" "out of time (GPU_CHECK_BUDGET_S=$BUDGET)"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "---- $name (limit ${limit}s)"
    local t0=$SECONDS log="$LOGS/$name.log" mark="$name.$$"
    GPU_CHECK_STEP=$mark STEP_LIMIT=$limit timeout -k 5 "$limit" "$@" > "$log" 2>&1
    local rc=$?
    reap "$mark"
    tail -n 3 "$log" | cut -c1-400
    { echo "==== $name (rc $rc)"; cat "$log"; } >> "$OUTDIR/steps.log"
    $PY - "$name" "$rc" "$((SECONDS - t0))" "$limit" "$log" >> "$RES" <<'PYEOF'
import json, sys
name, rc, secs, limit, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lines = open(log, errors="replace").read().splitlines()
facts = []
for line in lines:
    try:
        doc = json.loads(line)
    except ValueError:
        continue
    if isinstance(doc, dict):
        facts.append(doc)
print(json.dumps({"step": name, "rc": rc, "seconds": secs, "limit": limit, "json": facts, "tail": lines[-8:]}))
PYEOF
}

TORCHRUN="$PY -m torch.distributed.run --standalone --nproc-per-node"  # then N SCRIPT ARGS...

step env 60 $PY - $DRY <<'PYEOF'
import json, shutil, sys
import torch
dry = "--dry-run" in sys.argv
info = {"torch": torch.__version__, "python": sys.version.split()[0], "dry_run": dry, "py-spy": shutil.which("py-spy")}
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
for mod in ("msgspec", "zmq", "pynvml", "psutil"):
    try:
        m = importlib.import_module(mod)
        info[mod] = getattr(m, "__version__", "present")
    except Exception as exc:
        info[mod] = f"missing: {exc}"
print(json.dumps(info))
PYEOF
step topo 60 $PY -m commviz.cli topo --json
if [ -z "$DRY" ]; then
    step nvml_dump 60 $PY -m commviz.cli nvml-dump --samples 3 "$OUTDIR/nvml.json"
else
    skip nvml_dump "no GPU (dry run)"
fi

# Can several ranks share the GPU? The world sizes that can are read from its JSON.
step share 150 $PY bench/nccl_share.py --world 2 4 --timeout 60 --log-dir "$FIX" $DRY
SHARED=$($PY - "$LOGS/share.log" <<'PYEOF'
import json, sys
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []
for line in reversed(lines):
    try:
        doc = json.loads(line)
    except ValueError:
        continue
    if isinstance(doc, dict) and doc.get("fact") == "nccl_share":
        print(" ".join(str(n) for n in doc["shared"]))
        break
PYEOF
)
echo "---- shared world sizes: ${SHARED:-none}"

# world_checks N: every check of bench/nccl_world.py at world size N, or why not.
CHECKS="every_op queued hang dead desync watchdog attach"
declare -A LIMIT=([every_op]=150 [queued]=120 [hang]=90 [dead]=90 [desync]=90 [watchdog]=100 [attach]=120)
world_checks() {
    local n=$1 c
    for c in $CHECKS; do
        if [[ " $SHARED " == *" $n "* ]]; then
            step "w${n}_$c" "${LIMIT[$c]}" $PY bench/nccl_world.py "$c" --world "$n" --fixtures "$FIX" $DRY
        else
            skip "w${n}_$c" "$n ranks could not share the GPU (see the share step)"
        fi
    done
}

world_checks 2
if [[ " $SHARED " == *" 2 "* ]]; then
    step overlap 120 $TORCHRUN 2 bench/gpu_overlap.py --share --rounds 6 $DRY
else
    step overlap 120 $TORCHRUN 1 bench/gpu_overlap.py --rounds 6 $DRY
fi
world_checks 4

step nccl_launch 120 $TORCHRUN 1 bench/nccl_launch.py --rounds 12 $DRY
if [ -z "$DRY" ]; then
    step tests_gpu 180 $PY -m pytest -q -p no:cacheprovider -rs tests/gpu
else
    step tests_gpu 120 $PY -m pytest -q -p no:cacheprovider -rs tests/gpu/test_nvml_fixture.py
fi
step gpu_step 150 $TORCHRUN 1 bench/gpu_step.py --rounds 6 $DRY
step nccl_split 120 $TORCHRUN 1 bench/nccl_split.py --rounds 6 $DRY
for fact in coalesced_future dump_thread_device compile_funcol work_result; do
    step "fact_$fact" 90 $PY bench/gpu_facts.py "$fact" $DRY
done

tar czf "$OUTDIR/fixtures.tar.gz" -C "$FIX" . 2>/dev/null
$PY - "$RES" "$OUTDIR/gpu_check.json" "$((SECONDS - START))" "$BUDGET" "$FIX" <<'PYEOF'
import json, os, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
ran = [s for s in steps if s["rc"] is not None]
doc = {"passed": all(s["rc"] == 0 for s in ran), "seconds": int(sys.argv[3]), "budget_s": int(sys.argv[4]),
       "skipped": {s["step"]: s["skipped"] for s in steps if s["rc"] is None},
       "fixtures": sorted(os.listdir(sys.argv[5])), "steps": steps}
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print(f"gpu_check: {len(ran)} steps ran in {doc['seconds']} s,",
      "all passed" if doc["passed"] else "FAILED: " + ", ".join(s["step"] for s in ran if s["rc"] != 0),
      f"({len(doc['skipped'])} skipped)" if doc["skipped"] else "", "->", sys.argv[2])
sys.exit(0 if doc["passed"] else 1)
PYEOF
