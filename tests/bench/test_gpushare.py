"""bench/gpushare.py: the one recipe by which several NCCL ranks share a GPU, and the
wrapper that sets it for a job before the job's Python starts."""

import json
import os
import subprocess
import sys

from tests.integration.conftest import REPO

BENCH = os.path.join(REPO, "bench")
sys.path.insert(0, BENCH)

import gpushare  # noqa: E402


def test_each_rank_is_a_host_of_its_own_on_the_same_gpu():
    envs = [gpushare.share_env(r, "3") for r in range(4)]
    assert len({e["NCCL_HOSTID"] for e in envs}) == 4  # NCCL's duplicate-GPU check compares host hashes
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"3"}
    for e in envs:  # only the socket transport, on loopback, is left to NCCL
        assert e["NCCL_P2P_DISABLE"] == e["NCCL_SHM_DISABLE"] == e["NCCL_IB_DISABLE"] == "1"
        assert e["NCCL_SOCKET_IFNAME"] == "lo"


def test_apply_takes_the_local_rank_and_the_first_visible_gpu():
    env = {"LOCAL_RANK": "2", "RANK": "6", "CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}
    added = gpushare.apply(env)
    assert env["NCCL_HOSTID"] == gpushare.HOSTID_PREFIX + "2" and env["CUDA_VISIBLE_DEVICES"] == "GPU-aaa"
    assert added == gpushare.share_env(2, "GPU-aaa")
    env = {"RANK": "1"}  # no launcher's local rank, nothing visible set
    gpushare.apply(env)
    assert env["NCCL_HOSTID"].endswith("-1") and env["CUDA_VISIBLE_DEVICES"] == "0"


def test_the_wrapper_sets_the_recipe_and_runs_the_job_in_the_same_process():
    probe = ("import json, os; print(json.dumps({'pid': os.getpid(), 'argv': __import__('sys').argv[1:], "
             "**{k: os.environ.get(k) for k in ('NCCL_HOSTID', 'CUDA_VISIBLE_DEVICES', 'NCCL_SOCKET_IFNAME')}}))")
    env = dict(os.environ, LOCAL_RANK="1", CUDA_VISIBLE_DEVICES="5")
    p = subprocess.Popen([sys.executable, os.path.join(BENCH, "gpushare.py"), "-c", probe, "x", "--y"], env=env,
                         stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    doc = json.loads(out)
    assert doc["pid"] == p.pid  # exec, not a child: torchrun and commviz see the rank they started
    assert doc["argv"] == ["x", "--y"]
    assert (doc["NCCL_HOSTID"], doc["CUDA_VISIBLE_DEVICES"], doc["NCCL_SOCKET_IFNAME"]) == ("commviz-share-1", "5", "lo")


def test_the_wrapper_without_a_job_says_how_to_use_it():
    p = subprocess.run([sys.executable, os.path.join(BENCH, "gpushare.py")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "gpushare.py JOB.py" in p.stderr
