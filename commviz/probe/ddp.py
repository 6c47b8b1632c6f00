"""DDP gradient buckets as `ddp_bucket` events.

DDP's all-reduces come from the C++ Reducer and never pass through Python, so the
only way to see them is DDP's comm-hook mechanism:
- a user's `register_comm_hook(state, hook)` gets `hook` wrapped (not replaced) in
  the reducer, while the model itself keeps the user's own hook (`_comm_hooks`);
- a model with no hook gets, at its first forward, a dispatcher in its reducer doing
  what the C++ default does, to the bit (`_allreduce_hook`). Because DDP accepts only
  one hook, a user who registers theirs after that first forward is swapped into the
  dispatcher instead of hitting "can only be called once"; a built-in C++ hook
  registered then is refused by torch (docs/SEEN.md).
The all_reduce a hook issues runs nested, so it is not counted a second time.
Built-in C++ hooks (`_register_builtin_comm_hook`) stay invisible; that is said once.

The model must stay the model the user built: `torch.save(ddp)` and `copy.deepcopy`
copy its `__dict__`, so commviz keeps nothing there. What it knows of a model is held
beside it (`_models`, by identity, let go with the model), the dispatcher goes to the reducer alone
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
    """What commviz knows of one DDP model, kept beside it: its `__dict__` is pickled
    with it and copied by deepcopy, and must hold only what torch put there."""

    checked: bool = False  # its first forward has been through `_pre_forward`
    hooked: bool = False  # its reducer runs a hook the user gave through commviz's register_comm_hook
    builtin: bool = False  # its reducer runs a C++ built-in hook: no bucket is visible
    dispatch: "_Dispatch | None" = None  # the hook commviz gave its reducer
    windows: int = 0  # forwards that opened a bucket-rebuild window


# By identity, not by the model's own hash or __eq__ (a subclass may define them), let
# go when the model is. A copy (deepcopy, unpickling) is a new model with a new reducer
# that torch gives no hook: it is seen afresh.
_models: dict[int, _Seen] = {}


def _seen(ddp) -> _Seen:
    key = id(ddp)
    got = _models.get(key)
    if got is None:
        got = _models[key] = _Seen()
        weakref.finalize(ddp, _models.pop, key, None)
    return got


def _allreduce_hook(process_group, bucket):
    """What DDP's C++ reducer does with no hook, to the bit: scale by 1/size (C++
    multiplies as it copies gradients into the bucket; torch's own Python
    `allreduce_hook` divides, which rounds differently at sizes that are not powers of
    two), then sum."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


@dataclasses.dataclass(frozen=True)
class _Hook:
    fn: object  # hook(state, bucket) -> Future
    state: object


class _Dispatch:
    """The hook commviz gives the reducer of a model without one; the user's hook, once
    given, runs instead (DDP takes one hook per reducer, once)."""

    def __init__(self, process_group) -> None:
        self.default = _Hook(_allreduce_hook, process_group)
        self.user: _Hook | None = None

    def __call__(self, state, bucket):
        h = self.user or self.default
        return h.fn(h.state, bucket)


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
        seen = _seen(self)
        disp = seen.dispatch
        if disp is not None and disp.user is None:
            # Our default is already in the reducer (first forward has run): run
            # theirs in it, and do the rest of what torch's own method does.
            self._check_comm_hook(hook)
            self.logger._set_comm_hook_name(hook.__qualname__)
            self._comm_hooks.append((hook, state))
            disp.user = _Hook(hook, state)
            return None
        wrapped = bucket_hook(probe, hook, self.process_group)
        try:
            result = orig_register(self, state, wrapped)
            seen.hooked = True
        finally:
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
        try:
            seen = _seen(self)
            if not seen.checked:
                seen.checked = True
                # A model whose `_comm_hooks` list a hook commviz did not see given is a
                # copy: torch rebuilt its reducer without it, and runs the C++ default.
                if (
                    not seen.hooked
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
