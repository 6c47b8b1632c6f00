"""Python stacks of a rank's threads, read from a background thread: of those stuck
inside a collective (gloo and NCCL release the GIL while they wait, so
`sys._current_frames()` shows where the caller is), and of every thread when the rank
has started no op for a while. No ptrace, no signals, no extra privileges."""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading

from commviz.events import Frame

MAX_FRAMES = 64


def lib_dirs() -> list[str]:
    """Directories whose frames are not the user's code, as this rank sees them."""
    dirs = []
    for mod in ("torch", "commviz"):
        m = sys.modules.get(mod)
        f = getattr(m, "__file__", None)
        if f:
            dirs.append(os.path.dirname(os.path.abspath(f)) + os.sep)
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.append(os.path.abspath(p) + os.sep)
    return sorted(set(dirs))


def frames_of(frame, skip_codes=()) -> list[Frame]:
    """Outermost first, like traceback.extract_stack; our own wrapper frames left out."""
    out = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        if code not in skip_codes:
            line = frame.f_lineno or 0
            text = linecache.getline(code.co_filename, line).strip() if line else ""
            out.append(Frame(code.co_filename, line, code.co_name, text[:200]))
        frame = frame.f_back
    out.reverse()
    return out


def threads_inside(codes) -> list[tuple[str, object]]:
    """(thread name, frame) for every thread currently inside one of `codes`."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    found = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        f = frame
        while f is not None:
            if f.f_code in codes:
                found.append((names.get(ident, str(ident)), frame))
                break
            f = f.f_back
    return found


MAX_THREADS = 8  # threads of a quiet rank whose stacks are sent, the main thread first


def all_threads() -> list[tuple[str, object]]:
    """(thread name, frame) of the main thread and up to MAX_THREADS - 1 others, not
    commviz's own threads nor the calling one."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me, main = threading.get_ident(), threading.main_thread().ident
    found = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, str(ident))
        if ident == me or name.startswith("commviz"):
            continue
        found.append((ident != main, name, frame))
    found.sort(key=lambda f: (f[0], f[1]))
    return [(name, frame) for _, name, frame in found[:MAX_THREADS]]
