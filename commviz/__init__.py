"""commviz: live torch.distributed traffic in your terminal.

Public API: `instrument()` to stream this rank's ops to `commviz watch` (or to
COMMVIZ_TRACE_DIR), and `mark(text)` to put a label on the timelines.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["instrument", "mark", "__version__"]


def instrument(addr: str | None = None, trace_dir: str | None = None) -> bool:
    """Wrap torch.distributed in this process. Idempotent, never raises: a probe
    that cannot start says why on stderr and the job runs on uninstrumented.
    Returns True when instrumentation is on (False with COMMVIZ=0)."""
    try:
        from commviz.probe.patch import install

        return install(addr, trace_dir) is not None
    except Exception as exc:  # pragma: no cover - defensive: never break the job
        import sys

        sys.stderr.write(f"commviz: instrumentation is off: {type(exc).__name__}: {exc}\n")
        return False


def mark(text: str) -> None:
    """Label this moment on every timeline (e.g. "step 10"); no-op if not instrumented."""
    try:
        from commviz.probe.patch import current

        p = current()
        if p is not None:
            p.mark(text)
    except Exception:  # pragma: no cover
        pass
