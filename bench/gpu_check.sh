#!/usr/bin/env bash
# The GPU path, for real, in under 5 minutes on a 1-GPU machine (issues 15 and 17).
#
#   bench/gpu_check.sh            # from the repository root, on a machine with a GPU
#
# 1. `commviz topo` (and --json), as a user would first run it;
# 2. `commviz nvml-dump`, kept as tests/gpu/fixtures/<gpu>-<host>.json: commit it, and
#    tests/gpu/test_nvml_fixture.py replays it on every machine from then on;
# 3. NVLink / PCIe counters read twice through the real backend, and the rates;
# 4. tests/gpu: every op family on NCCL, world size 1, under `commviz record`: exact
#    counts and bytes, CUDA-event device time on every CUDA op, a captured collective
#    marked captured, no synchronizing call from the probe (torch's sync debug mode),
#    the GPU named without set_device, the host topology sent, the probe's CUDA thread
#    in thread-local capture mode and a raw global-mode capture on another thread
#    left valid by its polls;
# 5. bench/nccl_launch.py: the host time the probe adds to an NCCL all_reduce launch.
# Every step has its own time limit; the figures are the lines starting with "==>".
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
fail=0
step() { echo; echo "---- $*"; }

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch here; nothing to check (the GPU tests skip)."
    exit 2
fi
$PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', torch.cuda.nccl.version(), '|', torch.cuda.get_device_name(0))"

step "1. commviz topo"
timeout 60 $PY -m commviz.cli topo || fail=1
timeout 60 $PY -m commviz.cli topo --json > /tmp/commviz-topo.json || fail=1

step "2. commviz nvml-dump (kept as a test fixture)"
name=$($PY -c "import torch, re; print(re.sub(r'[^A-Za-z0-9]+', '-', torch.cuda.get_device_name(0)).strip('-').lower())")
fixture="tests/gpu/fixtures/${name}-$(hostname -s).json"
if timeout 60 $PY -m commviz.cli nvml-dump "$fixture"; then
    echo "==> NVML dump: $fixture (commit it)"
    timeout 60 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_nvml_fixture.py || fail=1
else
    fail=1
fi

step "3. NVLink and PCIe counters"
timeout 60 $PY - <<'PYEOF' || fail=1
import time
from commviz.topo.backend import open_backend
from commviz.topo.discover import discover
from commviz.topo.rates import RateTracker

b = open_backend()
if not b.available:
    print(f"==> NVML: not available ({b.reason})")
    raise SystemExit(0)
t, r = discover(b), RateTracker()


def rate(key, c):
    return r.update(key, c[0], c[1], modulus=c[2] if len(c) > 2 else None)


for g in t.gpus:
    links = [lk.link for lk in g.up_links]
    first = b.counters(g.index, links)
    time.sleep(0.3)
    second = b.counters(g.index, links)
    rates = {}
    for k, c in second.items():
        if c is not None and first.get(k) is not None:
            rate(k, first[k])
            rates[k] = rate(k, c)
    have = sorted(k for k, v in second.items() if v is not None)
    print(f"==> gpu{g.index} {g.name}: {len(links)} NVLinks up; counters read: {have or 'none'}; "
          f"GPM NVLink rates: {b.nvlink_rates(g.index, links) is not None}")
    for k, v in rates.items():
        print(f"    {k}: {v if v is None else round(v)} B/s")
b.close()
PYEOF

step "4. every op family on NCCL under commviz record (tests/gpu)"
timeout 180 $PY -m pytest -q -p no:cacheprovider -rs tests/gpu/test_nccl_path.py || fail=1

step "5. probe's added host time on an NCCL all_reduce launch"
timeout 90 $PY -m torch.distributed.run --standalone --nproc-per-node 1 bench/nccl_launch.py --rounds 20 \
    | sed 's/^probe added/==> probe added/' || fail=1

echo
if [ $fail -eq 0 ]; then echo "gpu_check: all steps passed"; else echo "gpu_check: some step FAILED (above)"; fi
exit $fail
