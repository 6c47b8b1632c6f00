"""Pickles of commviz's own state are read back building commviz's data and nothing
else: no function called, no other class made, no module imported by being named."""

import io
import pickle
import subprocess
import sys

import pytest

from commviz import ownpickle
from commviz.model.diagnosis import RankStatus
from commviz.model.document import RankRow


class _Global:
    """Pickles as a call of `fn(*args)`, as a hostile body would."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _load(obj):
    return ownpickle.load(io.BytesIO(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))


def test_commviz_data_and_containers_come_back():
    row = RankRow(3, status=RankStatus.HUNG, unseen={"broadcast": 1})
    assert _load([row, {1, 2}, (1, "a")]) == [row, {1, 2}, (1, "a")]


def test_a_commviz_function_or_working_class_is_refused(tmp_path):
    from commviz.cli import main
    from commviz.trace.file import TraceWriter

    with pytest.raises(ownpickle.RefusedPickle, match="commviz.cli.main"):
        _load(_Global(main, ["version"]))
    target = tmp_path / "made-by-a-pickle.cvz"
    with pytest.raises(ownpickle.RefusedPickle, match="TraceWriter"):
        _load(_Global(TraceWriter, str(target)))  # its constructor opens the file
    assert not target.exists()


def test_naming_a_module_does_not_import_it():
    """`commviz.run` is the rank-side entry point: importing it is running it."""
    code = (
        "import io, sys\n"
        "from commviz import ownpickle\n"
        "body = b'\\x80\\x04\\x8c\\x0bcommviz.run\\x8c\\x04main\\x93)R.'\n"
        "try:\n"
        "    ownpickle.load(io.BytesIO(body))\n"
        "except ownpickle.RefusedPickle as exc:\n"
        "    print('refused:', exc)\n"
        "print('imported' if 'commviz.run' in sys.modules else 'not imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "refused: names commviz.run.main" in out and "not imported" in out
