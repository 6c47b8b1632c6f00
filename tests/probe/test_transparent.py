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
    got = []
    transparent.when_imported("cv_later", got.append)
    assert got == [] and "cv_later" not in sys.modules  # nothing imported on the program's behalf
    import cv_later

    assert got == [cv_later] and cv_later.VALUE == 1
    assert not any(isinstance(f, transparent._AfterImport) for f in sys.meta_path)  # its finder is gone


def test_a_module_already_imported_is_patched_at_once(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "cv_now")
    import cv_now

    got = []
    transparent.when_imported("cv_now", got.append)
    assert got == [cv_now]


def test_a_failing_patch_leaves_the_import_working(tmp_path, monkeypatch, capsys):
    _module(tmp_path, monkeypatch, "cv_fails")

    def broken(module):
        raise RuntimeError("no such layout")

    transparent.when_imported("cv_fails", broken)
    import cv_fails

    assert cv_fails.VALUE == 1
    assert "not watching cv_fails: RuntimeError: no such layout" in capsys.readouterr().err


def test_every_wrapper_looks_like_torchs_function(probe):
    import inspect
    import pickle
    import pydoc

    import torch.distributed._functional_collectives  # noqa: F401  (patched as it is imported)
    from commviz.probe import patch

    checked = 0
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
        checked += 1
    assert checked > 60  # c10d in both namespaces, funcol, DDP, P2POp, Work.wait
