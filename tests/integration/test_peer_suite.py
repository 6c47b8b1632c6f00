"""A slice of torch's own distributed test suite (bench/peer_suite.py runs it whole)
has the same outcome under commviz as plainly, at an odd world size, and commviz sees
every op it runs. The slice takes each kind of op the suite runs on CPU at least once:
every collective family, async and coalesced forms, objects, sub-groups, p2p with an
any-source recv and batched, barriers (monitored, with a rank that times out), sparse
tensors, and DDP plain, with a comm hook, and saved whole with torch.save."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("expecttest")  # torch's test utilities import it

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SLICE = (
    "test_all_reduce_sum_async", "test_all_reduce_coalesced_sum", "test_all_gather_coalesced_simple",
    "test_all_gather_object_subgroup", "test_broadcast", "test_reduce_max", "test_gather", "test_scatter_object_list",
    "test_send_recv_any_source", "test_batch_isend_irecv_gloo", "test_monitored_barrier_gloo_rank_0_timeout",
    "test_sparse_all_reduce_sum", "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync_allreduce_hook",
)


def _peer_suite():
    spec = importlib.util.spec_from_file_location("peer_suite", ROOT / "bench" / "peer_suite.py")
    mod = sys.modules["peer_suite"] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(900)
def test_torchs_own_tests_pass_the_same_under_commviz_and_it_sees_every_op(tmp_path):
    ps = _peer_suite()
    plain, under = (ps.run_suite(mode, 3, tmp_path, tests=SLICE, timeout=600) for mode in ps.MODES)
    assert set(plain.outcomes) == set(SLICE), plain.tail
    assert all(o.outcome == "passed" for o in plain.outcomes.values()), plain.tail  # the slice runs here
    assert ps.compare(plain, under) == [], "\n".join(ps.report(plain, under, None))
    audit = ps.audit_trace(under.trace, under.outcomes)
    # every rank process of every test reported its recorder (some hold no entries)
    assert audit.processes + sum(audit.states.values()) == 3 * len(SLICE), audit.states
    assert audit.processes >= len(SLICE) and sum(audit.backend.values()) > 0
    assert not audit.unseen, audit.unseen_by_test
