"""`transparent.when_imported`: commviz patches a module when the program imports it,
never importing it itself; and a fault in the patch never fails the program's import."""

import sys

from commviz.probe import transparent


def _module(tmp_path, monkeypatch, name):
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_module_is_patched_when_the_program_imports_it_and_not_before(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "cv_later")
    got, errors = [], []
    transparent.when_imported("cv_later", got.append, errors.append)
    assert got == [] and "cv_later" not in sys.modules  # nothing imported on the program's behalf
    import cv_later

    assert got == [cv_later] and cv_later.VALUE == 1 and errors == []
    monkeypatch.delitem(sys.modules, "cv_later")
    import cv_later  # noqa: F811  (imported again: patched once, by the first)

    assert len(got) == 1


def test_a_module_already_imported_is_patched_at_once(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "cv_now")
    import cv_now

    got = []
    transparent.when_imported("cv_now", got.append, None)
    assert got == [cv_now]


def test_a_failing_patch_leaves_the_import_working_and_is_reported(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "cv_fails")

    def broken(module):
        raise RuntimeError("no such layout")

    errors = []
    transparent.when_imported("cv_fails", broken, errors.append)
    import cv_fails

    assert cv_fails.VALUE == 1
    assert [str(e) for e in errors] == ["no such layout"]


def test_a_finder_done_leaves_the_finders_after_it_their_turn(tmp_path, monkeypatch):
    """A finder that took itself off sys.meta_path while the import system walked it
    made that walk skip the next finder: a module only that finder serves failed."""
    import importlib.abc
    import importlib.machinery

    served = tmp_path / "elsewhere"
    served.mkdir()
    (served / "cv_served.py").write_text("VALUE = 2\n")

    class Elsewhere(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "cv_served":
                return None
            return importlib.machinery.PathFinder.find_spec(name, [str(served)])

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    sys.meta_path.insert(0, Elsewhere())
    monkeypatch.delitem(sys.modules, "cv_served", raising=False)
    got = []
    transparent.when_imported("cv_served", got.append, None)
    import cv_served

    assert cv_served.VALUE == 2 and got == [cv_served]


def test_every_wrapper_looks_like_torchs_function(probe):
    import inspect
    import pickle
    import pydoc

    import torch.distributed._functional_collectives  # noqa: F401  (patched as it is imported)
    from commviz.probe import patch

    owners = set()
    for owner, name, orig, w in patch._patched:
        if isinstance(w, staticmethod) or orig is w:
            continue
        where = f"{getattr(owner, '__name__', owner)}.{name}"
        assert inspect.unwrap(w) is inspect.unwrap(orig), where
        builtin = inspect.isbuiltin(orig)  # C++: named where they live (probe/ddp_start.py)
        if not builtin:
            for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
                assert getattr(w, attr) == getattr(orig, attr), f"{where}: {attr}"
            assert inspect.signature(w) == inspect.signature(orig), where
        if getattr(orig, "__wrapped__", None) is not None:
            assert w.__wrapped__ is orig.__wrapped__, where
        if isinstance(owner, type(sys)):  # a module's function: pickled by reference, to itself
            assert pickle.loads(pickle.dumps(w)) is w, where
        if inspect.getdoc(orig) and not builtin:  # help() reads the same (comments above an undocumented def differ)
            assert pydoc.render_doc(w) == pydoc.render_doc(orig), where
        owners.add(getattr(owner, "__name__", owner))
    assert {"torch.distributed", "torch.distributed.distributed_c10d", "torch.distributed._functional_collectives",
            "DistributedDataParallel", "P2POp"} <= owners
