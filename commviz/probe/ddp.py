"""DDP gradient buckets as `ddp_bucket` events.

DDP's all-reduces come from the C++ Reducer and never pass through Python, so the
only way to see them is DDP's comm-hook mechanism:
- a user's `register_comm_hook(state, hook)` gets `hook` wrapped (not replaced);
- a model with no hook gets, at its first forward, a dispatcher running torch's own
  `allreduce_hook` (the same divide-then-all_reduce the C++ default does). Because
  DDP accepts only one hook, a user who registers theirs after that first forward
  is swapped into the dispatcher instead of hitting "can only be called once".
The all_reduce a hook issues runs nested, so it is not counted a second time.
Built-in C++ hooks (`_register_builtin_comm_hook`) stay invisible; that is said once.
"""

from __future__ import annotations

import contextlib
import functools

from commviz.probe import transparent
from commviz.probe.kernels import MAX_REBUILD_WINDOWS
from commviz.probe.core import DEPTH, WANT_INNER, thread_state


class _Dispatch:
    """The hook registered for models without one; the user's hook, once given, runs instead."""

    def __init__(self, default_hook, default_state) -> None:
        self.default = (default_hook, default_state)
        self.user = None

    def __call__(self, state, bucket):
        hook, st = self.user or self.default
        return hook(st, bucket)


def bucket_hook(probe, hook, pg):
    tls, health = probe.tls, probe.health

    @functools.wraps(hook)
    def hooked(state, bucket):
        try:
            rec = probe.begin_bucket(pg, bucket)
        except Exception as exc:
            health.internal("ddp_bucket", exc)
            rec = None
        if rec is None:
            return hook(state, bucket)
        st = thread_state(tls)
        depth, want_inner = st[DEPTH], st[WANT_INNER]
        st[DEPTH] = depth + 1
        st[WANT_INNER] = False
        try:
            fut = hook(state, bucket)
        except BaseException as exc:
            st[DEPTH], st[WANT_INNER] = depth, want_inner
            probe.fail(rec, exc)
            raise
        st[DEPTH], st[WANT_INNER] = depth, want_inner
        try:
            probe.track_future(rec, fut)
        except Exception as exc:
            health.internal("ddp_bucket completion", exc)
        return fut

    return hooked


def _rebuild_window(probe, ddp):
    """The window in which the reducer's bucket-rebuild broadcasts are seen
    (probe/kernels.py), for a forward that can rebuild; an empty one for every other."""
    import torch

    k = probe.kernels
    if (k is None or getattr(ddp, "_has_rebuilt_buckets", True) or not torch.is_grad_enabled()
            or getattr(ddp, "_use_python_reducer", False)
            or getattr(ddp, "find_unused_parameters", False) and not getattr(ddp, "static_graph", False)):
        # rebuilt already, or never rebuilds (torch's `should_rebuild_buckets`)
        return contextlib.nullcontext()
    n = getattr(ddp, "_commviz_windows", 0)
    if n >= MAX_REBUILD_WINDOWS:
        return contextlib.nullcontext()
    ddp._commviz_windows = n + 1
    try:
        return k.rebuild_window(ddp.process_group)
    except Exception as exc:
        probe.health.internal("ddp rebuild window", exc)
        return contextlib.nullcontext()


def install(probe, patched: list) -> None:
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception:  # pragma: no cover - torch without DDP
        return
    if getattr(DDP.register_comm_hook, "_commviz_original", None) is not None:
        return
    orig_register = DDP.register_comm_hook
    orig_builtin = DDP._register_builtin_comm_hook
    orig_pre_forward = DDP._pre_forward

    def register_comm_hook(self, state, hook):
        disp = getattr(self, "_commviz_dispatch", None)
        if disp is not None and disp.user is None:
            # Our default is already registered (first forward has run): run theirs in it.
            self._check_comm_hook(hook)
            self.logger._set_comm_hook_name(hook.__qualname__)
            self._comm_hooks.append((hook, state))
            disp.user = (hook, state)
            return None
        return orig_register(self, state, bucket_hook(probe, hook, self.process_group))

    def _register_builtin_comm_hook(self, comm_hook_type):
        self._commviz_builtin = True
        probe.health.warn_once(
            "ddp-builtin",
            f"DDP built-in comm hook {comm_hook_type} runs in C++: its buckets are not visible to commviz",
        )
        return orig_builtin(self, comm_hook_type)

    def _pre_forward(self, *inputs, **kwargs):
        if not getattr(self, "_commviz_checked", False):
            self._commviz_checked = True
            try:
                if (
                    not self._comm_hooks
                    and not getattr(self, "_commviz_builtin", False)
                    and not getattr(self, "_use_python_reducer", False)
                    and probe.ensure_started()
                ):
                    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

                    disp = _Dispatch(allreduce_hook, self.process_group)
                    functools.update_wrapper(disp, allreduce_hook)
                    orig_register(self, None, bucket_hook(probe, disp, self.process_group))
                    self._commviz_dispatch = disp
            except Exception as exc:
                probe.health.internal("ddp hook", exc)
        with _rebuild_window(probe, self):
            return orig_pre_forward(self, *inputs, **kwargs)

    for name, fn, orig in (
        ("register_comm_hook", register_comm_hook, orig_register),
        ("_register_builtin_comm_hook", _register_builtin_comm_hook, orig_builtin),
        ("_pre_forward", _pre_forward, orig_pre_forward),
    ):
        functools.update_wrapper(fn, orig)
        transparent.mark_method(fn, orig)
        setattr(DDP, name, fn)
        patched.append((DDP, name, orig, fn))
