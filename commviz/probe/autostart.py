"""Instrument a process as soon as it imports torch.distributed, without touching
the user's script. Used by the start-up hook and by `python -m commviz.run`."""

from __future__ import annotations

import importlib.abc
import sys

_TARGET = "torch.distributed"


class _Finder(importlib.abc.MetaPathFinder):
    """Lets torch.distributed load normally, then instruments it."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            from commviz import instrument

            instrument()

        loader.exec_module = exec_module
        return spec


def arm() -> None:
    if _TARGET in sys.modules:
        from commviz import instrument

        instrument()
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
