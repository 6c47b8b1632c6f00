"""Wrappers that look like torch's own functions, to the program and to torch.compile.

To the program (`look_like`): a wrapper carries its original's name, module,
qualname, docstring, signature and `__wrapped__`, so pickling it (by reference, inside
a model or a `functools.partial`), `help()`, `inspect` and logging see torch's
function. torch's own test suite pickles models holding them (bench/peer_suite.py).
And commviz imports no module of torch's on the program's behalf: what it patches in
a module it patches when the program imports it (`when_imported`).

To torch.compile: dynamo traces into any Python function a compiled region calls. Ours read
thread-locals, clocks and C++ objects it cannot trace, so each one it met was a
graph break (or, under `fullgraph=True`, an error) the job did not have without us.
Dynamo has a documented way out: a function carrying `_torchdynamo_inline` is traced
as that attribute instead (it is how `torch._dynamo.optimize(fn)` wrappers nest). So
every wrapper names its original there; dynamo then meets torch's own function and
treats it exactly as in a plain run — `dist.all_reduce` is still remapped to its
functional form, funcol still becomes `_c10d_functional` ops in the graph. What the
graph runs is seen below Python instead (probe/kernels.py).

The C wrapper is not a Python function, so dynamo would not look for the attribute
on it: it is reached through a `shim`, a Python function passing the call on as it
came (one Python call, ~100 ns on a 2-core CI box; bench/overhead.py). A shim with
the original's parameters, passing them by position, would be half that, but turns
a caller's keywords into positions, and torch's error path reads keywords
(`dist.all_reduce(t, group=123)` raises ValueError, by position AttributeError).

Calls dynamo cannot trace (a collective torch has no functional form for) break the
graph in a plain run too; the call then runs eagerly, and dynamo tries to compile
every frame it enters. Ours would be new graphs and breaks of their own, so commviz's
files are on dynamo's skip list (`skip_our_frames`), set as dynamo is imported:
importing it ourselves would cost every rank seconds at start-up.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading

_TRACE_RULES = "torch._dynamo.trace_rules"


def look_like(wrapper, orig):
    """Give `wrapper` every face of `orig` a program can look at: `__module__`,
    `__name__`, `__qualname__`, `__doc__`, annotations and attributes (so pickle finds it
    by reference, and `help()` and logs read the same), and a `__wrapped__` that
    `inspect.unwrap`, `inspect.signature` and `inspect.getsource` follow to the same
    function as without commviz: `orig`'s own where it has one (torch's c10d functions
    are decorated), else `orig`."""
    functools.update_wrapper(wrapper, orig)
    inner = getattr(orig, "__wrapped__", None)
    if inner is not None:
        wrapper.__wrapped__ = inner
    return wrapper


def mark(wrapper, orig):
    """`wrapper` stands for the function `orig`: to the program (`look_like`), to
    commviz (`_commviz_original`, so nothing is wrapped twice) and to dynamo
    (`_torchdynamo_inline`)."""
    look_like(wrapper, orig)
    wrapper._commviz_original = orig
    wrapper._torchdynamo_inline = orig
    return wrapper


def mark_method(wrapper, orig):
    """`mark` for a method put on a class. Not for dynamo: on a method it reaches
    through `_torchdynamo_inline`, a graph break inside the original makes dynamo
    resume by calling the original unbound (torch 2.13: `TypeError: missing 1
    required positional argument`). Dynamo stops at the wrapper instead (our files
    are skipped), breaking the graph where a plain run would break inside it."""
    look_like(wrapper, orig)
    wrapper._commviz_original = orig
    return wrapper


def shim(target):
    """A Python function calling `target` with the arguments exactly as given (the
    caller's keywords stay keywords: torch's own error logging reads them)."""

    def front(*args, **kwargs):
        return target(*args, **kwargs) if kwargs else target(*args)

    return front


def skip_our_frames(on_error) -> None:
    """Put commviz's files on dynamo's skip list, now if dynamo is loaded, otherwise
    the moment it is."""
    when_imported(_TRACE_RULES, _skip_commviz, on_error)


def _skip_commviz(trace_rules) -> None:
    try:
        trace_rules.add("commviz")
    except Exception:  # a dynamo without it: our frames are traced, as before
        pass


def when_imported(name: str, then, on_error) -> None:
    """Run `then(module)` once the module `name` is imported: now if it is, otherwise
    right after the program imports it. commviz never imports a module for this: a
    program must load exactly the modules it loads without commviz. `on_error(exc)`
    hears of a `then` that raised; the program's import goes on regardless."""
    hook = _AfterImport(name, then, on_error)
    sys.meta_path.insert(0, hook)  # first: an import starting from now on is caught
    mod = sys.modules.get(name)
    if mod is None:
        return
    if getattr(getattr(mod, "__spec__", None), "_initializing", False):
        # another thread is executing it, past the finders: wait for it to finish
        mod = importlib.import_module(name)
    hook.fire(mod)


class _AfterImport:
    """A meta-path finder that runs `then(module)` once, after `name` has been
    executed. It finds the module as the finders after it would and leaves the import
    itself unchanged. It stays on `sys.meta_path` once done (answering None): taking
    itself off while the import system walks the list would skip the next finder."""

    def __init__(self, name: str, then, on_error) -> None:
        self.name, self.then, self.on_error = name, then, on_error
        self.done = False
        self._busy = False  # finding the spec through the other finders
        self._lock = threading.Lock()

    def fire(self, module) -> None:
        with self._lock:
            if self.done:
                return
            self.done = True
        try:
            self.then(module)
        except Exception as exc:  # the program's import goes on, unwatched
            self.on_error(exc)

    def find_spec(self, name, path, target=None):
        if name != self.name or self.done or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then(module):
            exec_module(module)
            self.fire(module)

        loader.exec_module = exec_then
        return spec
