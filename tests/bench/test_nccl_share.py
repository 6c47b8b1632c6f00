"""bench/nccl_share.py: NCCL's answer, read from its INFO log and from the exception
torch raises, and one real rehearsal on gloo."""

import json
import os
import subprocess
import sys

import pytest

from tests.integration.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))

import nccl_share  # noqa: E402

# The shape of NCCL 2.28's INFO lines (hostname:pid:tid [cuda device]), two ranks
# sharing one GPU as two "hosts".
SHARED = """\
vm:4101:4101 [0] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>
vm:4101:4101 [0] NCCL INFO cudaDriverVersion 13000
vm:4101:4101 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:4101:4120 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
vm:4101:4120 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
vm:4101:4120 [0] NCCL INFO Using network Socket
vm:4101:4120 [0] NCCL INFO NCCL_HOSTID set by environment to commviz-share-0
vm:4101:4120 [0] NCCL INFO Channel 00/02 : 0 1
vm:4101:4120 [0] NCCL INFO Channel 01/02 : 0 1
vm:4101:4120 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
vm:4101:4120 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
vm:4101:4120 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
vm:4101:4120 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/0
vm:4101:4120 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 0
{"nccl_share_rank": 0, "ok": true, "backend": "nccl"}
"""

REFUSED = """\
vm:4101:4101 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:4101:4120 [0] init.cc:1102 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1d000
{"nccl_share_rank": 0, "ok": false, "error": "DistBackendError: NCCL error ...\\nLast error:\\nDuplicate GPU detected"}
"""

TORCH_ERROR = ("DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage "
               "(run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects "
               "invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA "
               "device 1d000")


def test_a_shared_gpu_shows_its_version_network_and_each_channels_transport():
    got = nccl_share.parse_nccl_log(SHARED)
    assert got["version"] == "2.28.9+cuda13.0" and got["network"] == "Socket"
    assert got["transports"] == {"NET/Socket/0": 4}  # the ring order lines ("Channel 00/02 : 0 1") are not channels
    assert got["channels"] == 2 and got["transport_kinds"] == ["NET/Socket"]
    assert got["env"] == {"NCCL_IB_DISABLE": "1", "NCCL_HOSTID": "commviz-share-0"}
    assert got["refusal"] is None and got["warnings"] == []


def test_a_refusal_is_quoted_in_nccls_words():
    got = nccl_share.parse_nccl_log(REFUSED)
    assert got["refusal"] == "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1d000"
    assert got["warnings"] == [got["refusal"]] and got["transports"] == {}


def test_the_refusal_is_read_from_torchs_exception_where_the_log_has_none():
    assert nccl_share.refusal_from_error(TORCH_ERROR) == \
        "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1d000"
    assert nccl_share.refusal_from_error("RuntimeError: something else") is None
    assert nccl_share.refusal_from_error("Last error:\n") is None


@pytest.mark.parametrize("via,kind", [("NET/Socket/0", "NET/Socket"), ("NET/IB/0/GDRDMA", "NET/IB"),
                                      ("P2P/CUMEM/read", "P2P"), ("SHM/direct/direct", "SHM"), ("P2P/IPC", "P2P")])
def test_transport_kind(via, kind):
    assert nccl_share.transport_kind(via) == kind


def test_the_ranks_results_are_their_tagged_json_lines_only():
    text = SHARED + '{"other": 1}\nnot json {"nccl_share_rank": 9}\n'
    assert nccl_share.rank_results(text) == [{"nccl_share_rank": 0, "ok": True, "backend": "nccl"}]


@pytest.mark.integration
def test_the_dry_run_starts_the_ranks_and_says_it_asked_no_nccl(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "nccl_share.py"), "--world", "2", "--dry-run",
                        "--log-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["dry_run"] and doc["backend"] == "gloo" and doc["shared"] == [2]
    [w] = doc["worlds"]
    assert w["ok"] and w["rcs"] == [0, 0] and all(r["allreduce_wrong"] == 0 == r["sendrecv_wrong"] for r in w["ranks"])
    assert (tmp_path / "nccl_share_ws2.log").read_text().count("nccl_share_rank") == 2
