#!/usr/bin/env bash
# The wheels bench/gpu_check.sh installs on the lent GPU machine, which has no network
# (Python 3.12 there; its image has torch, nvidia-ml-py, psutil and aiohttp, not
# these). Run here, where pip reaches PyPI, once per checkout, from the repository root:
#
#   bash bench/gpu_wheels.sh        # -> .whl/ (git ignores it through .git/info/exclude)
#
# then carry `.whl` with the device call. msgspec and pyzmq: commviz's wire and
# transport; py-spy: the stacks `commviz attach` reads (its check says skipped without).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d .whl msgspec pyzmq py-spy
ls -l .whl
