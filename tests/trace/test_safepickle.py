"""The pickle loader for flight-recorder dumps runs no code: every opcode that could
import, call or construct is refused before anything is loaded."""

import io
import os
import pickle
from pathlib import Path

import pytest

from commviz.trace import safepickle
from commviz.trace.safepickle import UnsafePickle

DATA = Path(__file__).parent / "data"

# One tiny pickle per opcode family that can run code or build objects.
CRAFTED = {
    "GLOBAL": b"cos\nsystem\n(S'true'\ntR.",
    "STACK_GLOBAL": b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
    "REDUCE": b"\x80\x02N)R.",
    "BUILD": b"\x80\x02}}b.",
    "INST": b"(S'true'\nios\nsystem\n.",
    "OBJ": b"\x80\x02(N)o.",
    "NEWOBJ": b"\x80\x02N)\x81.",
    "NEWOBJ_EX": b"\x80\x04N)}\x92.",
    "EXT1": b"\x80\x02\x82\x01.",
    "EXT2": b"\x80\x02\x83\x01\x00.",
    "EXT4": b"\x80\x02\x84\x01\x00\x00\x00.",
    "PERSID": b"P1\n.",
    "BINPERSID": b"\x80\x02K\x01Q.",
    "EMPTY_SET": b"\x80\x04\x8f.",
    "NEXT_BUFFER": b"\x80\x05\x97.",
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_each_code_running_opcode_is_refused_by_name(name):
    with pytest.raises(UnsafePickle, match=f"opcode {name} at offset"):
        safepickle.loads(CRAFTED[name])


class _Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_pickle_that_would_run_a_command_runs_nothing(tmp_path, protocol):
    canary = tmp_path / "ran"
    with pytest.raises(UnsafePickle):
        safepickle.loads(pickle.dumps({"entries": [_Touch(canary)]}, protocol=protocol))
    assert not canary.exists()


def test_the_unpickler_itself_refuses_classes_too():
    # the second wall, should the opcode check ever let a lookup through
    with pytest.raises(UnsafePickle, match="refuses to import os.system"):
        safepickle._Refusing(io.BytesIO(CRAFTED["STACK_GLOBAL"])).load()


def test_a_real_dump_loads_as_plain_data():
    doc = safepickle.loads((DATA / "gloo_hang_pickle" / "nccl_trace_rank_0").read_bytes())
    assert doc["version"] == "2.10"
    assert doc["entries"][0]["process_group"] == ("0", "default_pg")


def test_size_limit_and_garbage():
    with pytest.raises(UnsafePickle, match="over the"):
        safepickle.check(b"\x80" * (safepickle.MAX_BYTES + 1))
    with pytest.raises(UnsafePickle, match="not a pickle"):
        safepickle.loads(b"\x80\x02\xff\xff")
