"""DDP gradient buckets as `ddp_bucket` events.

DDP's all-reduces come from the C++ Reducer and never pass through Python, so the
only way to see them is DDP's comm-hook mechanism:
- a user's `register_comm_hook(state, hook)` gets `hook` wrapped (not replaced) in
  the reducer, while the model itself keeps the user's own hook (`_comm_hooks`);
- a model with no hook gets, at its first forward, a dispatcher in its reducer running
  the same divide-then-all_reduce the C++ default does. Because DDP accepts only one
  hook, a user who registers theirs after that first forward is swapped into the
  dispatcher instead of hitting "can only be called once".
The all_reduce a hook issues runs nested, so it is not counted a second time.
Built-in C++ hooks (`_register_builtin_comm_hook`) stay invisible; that is said once.

The model must stay the model the user built: `torch.save(ddp)` and `copy.deepcopy`
copy its `__dict__`, so commviz keeps nothing there. What it knows of a model is held
beside it (`_models`, by weak reference), the dispatcher goes to the reducer alone
(torch leaves the reducer out of a pickle), and no torch module is imported for it:
torch's `default_hooks` is not loaded in a plain DDP run either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref

from commviz.probe import transparent
from commviz.probe.kernels import MAX_REBUILD_WINDOWS
from commviz.probe.core import DEPTH, WANT_INNER, thread_state


@dataclasses.dataclass
class _Seen:
    """What commviz knows of one DDP model."""

    checked: bool = False  # its first forward has been through `_pre_forward`
    builtin: bool = False  # it runs a C++ built-in hook: no bucket is visible
    dispatch: "_Dispatch | None" = None  # the hook commviz gave its reducer
    windows: int = 0  # forwards that opened a bucket-rebuild window


# A copy (deepcopy, unpickling) is a new model with a new reducer: it is seen afresh.
_models: "weakref.WeakKeyDictionary[object, _Seen]" = weakref.WeakKeyDictionary()


def _seen(ddp) -> _Seen:
    got = _models.get(ddp)
    if got is None:
        got = _models[ddp] = _Seen()
    return got


def _allreduce_hook(process_group, bucket):
    """What DDP's C++ reducer does with no hook, as torch's own `default_hooks.allreduce_hook`
    does it: divide by the group's size, all_reduce, hand back the buffer."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


class _Dispatch:
    """The hook registered for models without one; the user's hook, once given, runs instead."""

    def __init__(self, process_group) -> None:
        self.default = (_allreduce_hook, process_group)
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
    seen = _seen(ddp)
    if seen.windows >= MAX_REBUILD_WINDOWS:
        return contextlib.nullcontext()
    seen.windows += 1
    try:
        return k.rebuild_window(ddp.process_group)
    except Exception as exc:
        probe.health.internal("ddp rebuild window", exc)
        return contextlib.nullcontext()


def install(probe, patched: list) -> None:
    try:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception:  # pragma: no cover - torch without DDP
        return
    if getattr(DDP.register_comm_hook, "_commviz_original", None) is not None:
        return
    orig_register = DDP.register_comm_hook
    orig_builtin = DDP._register_builtin_comm_hook
    orig_pre_forward = DDP._pre_forward

    def register_comm_hook(self, state, hook):
        disp = _seen(self).dispatch
        if disp is not None and disp.user is None:
            # Our default is already in the reducer (first forward has run): run
            # theirs in it, and do the rest of what torch's own method does.
            self._check_comm_hook(hook)
            self.logger._set_comm_hook_name(hook.__qualname__)
            self._comm_hooks.append((hook, state))
            disp.user = (hook, state)
            return None
        wrapped = bucket_hook(probe, hook, self.process_group)
        result = orig_register(self, state, wrapped)
        hooks = self._comm_hooks
        if hooks and hooks[-1][0] is wrapped:
            hooks[-1] = (hook, hooks[-1][1])  # the model holds the user's hook, as without commviz
        return result

    def _register_builtin_comm_hook(self, comm_hook_type):
        _seen(self).builtin = True
        probe.health.warn_once(
            "ddp-builtin",
            f"DDP built-in comm hook {comm_hook_type} runs in C++: its buckets are not visible to commviz",
        )
        return orig_builtin(self, comm_hook_type)

    def _pre_forward(self, *inputs, **kwargs):
        seen = _seen(self)
        if not seen.checked:
            seen.checked = True
            try:
                if (
                    not self._comm_hooks
                    and not seen.builtin
                    and not getattr(self, "_use_python_reducer", False)
                    and probe.ensure_started()
                ):
                    # Straight to the reducer: torch's register_comm_hook would also
                    # list the hook on the model and name it in DDP's logging data.
                    disp = _Dispatch(self.process_group)
                    dist._register_comm_hook(self.reducer, None, bucket_hook(probe, disp, self.process_group))
                    seen.dispatch = disp
            except Exception as exc:
                probe.health.internal("ddp hook", exc)
        with _rebuild_window(probe, self):
            return orig_pre_forward(self, *inputs, **kwargs)

    for name, fn, orig in (
        ("register_comm_hook", register_comm_hook, orig_register),
        ("_register_builtin_comm_hook", _register_builtin_comm_hook, orig_builtin),
        ("_pre_forward", _pre_forward, orig_pre_forward),
    ):
        transparent.mark_method(fn, orig)
        setattr(DDP, name, fn)
        patched.append((DDP, name, orig, fn))
