"""Start-up hook for `commviz record/watch -- CMD` (the way coverage.py measures
subprocesses): this directory is put first on PYTHONPATH of the launched job, so
every Python process of it — torchrun and each rank — runs this file at start-up.
It arms instrumentation for when torch.distributed is imported, then hands over to
any sitecustomize the environment had before."""

import os
import sys


def _arm() -> None:
    if os.environ.get("COMMVIZ_AUTOSTART") != "1" or os.environ.get("COMMVIZ", "1") == "0":
        return
    try:
        from commviz.probe.autostart import arm

        arm()
    except Exception as exc:  # never stop the user's program from starting
        sys.stderr.write(f"commviz: auto-instrumentation is off: {type(exc).__name__}: {exc}\n")


def _chain() -> None:
    """Run the sitecustomize this one shadows, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_arm()
_chain()
