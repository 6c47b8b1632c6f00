"""torch's own distributed test suite, as torch runs it (the shape of torch's
`test/distributed/test_distributed_spawn.py`): every test of
`DistributedTest._DistTestBase`, each in WORLD_SIZE freshly spawned processes, on the
backend named by BACKEND. bench/peer_suite.py runs this file plainly and under
commviz and compares the outcomes; it is never imported by commviz itself.

    BACKEND=gloo WORLD_SIZE=2 python -m pytest bench/peer/suite.py
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.testing._internal.common_utils import NO_MULTIPROCESSING_SPAWN, run_tests

if not dist.is_available():
    print("torch.distributed is not available here", file=sys.stderr)
    sys.exit(0)

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

BACKEND = os.environ["BACKEND"]

if BACKEND in ("gloo", "nccl", "ucc") and not NO_MULTIPROCESSING_SPAWN:

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


if __name__ == "__main__":
    run_tests()
