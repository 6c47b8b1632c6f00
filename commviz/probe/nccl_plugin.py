"""NCCL's profiler plugin, loaded for the user and read by the probe.

`enable` runs when the probe is installed, before the job initializes NCCL: it points
NCCL_PROFILER_PLUGIN at commviz's plugin (probe/_ncclprof.c) and tells the plugin a
reader is here. NCCL loads it at its first communicator's init and, from then on,
reports every collective and send/recv of every communicator in the process, whoever
issued it. The probe's sender thread calls `Reader.poll` at each flush, so NCCL's
events leave the rank with the probe's own, through the same socket and trace.

The library is reached through ctypes on purpose: it has no Python symbol, so NCCL
can load it into any process, and ctypes' dlopen of the same path returns the very
copy NCCL loaded, ring and counters included. ctypes is already imported by torch.

A plugin the user named is theirs: commviz says so and stays out. NCCL reads only
the first 255 characters of the variable; a longer path is not set.
"""

from __future__ import annotations

import ctypes
import enum
import os
from dataclasses import dataclass, field

from commviz import native
from commviz.probe.nccl_ops import RECORD, Assembler, parse

PART = "commviz.probe._ncclprof"
ENV = "NCCL_PROFILER_PLUGIN"
MAX_PATH = 254  # NCCL copies the name into a 255-byte buffer
DRAIN_AT_ONCE = 4096  # records per ctypes call
STATS = ("records", "dropped", "comms", "colls", "p2ps", "kernel_ch", "captured", "no_parent", "refused",
         "version")


class PluginState(enum.Enum):
    LOADED = "loaded"  # NCCL_PROFILER_PLUGIN points at commviz's plugin, a reader is attached
    USER_PLUGIN = "user's plugin"  # the user named another plugin: commviz stays out
    NOT_BUILT = "not built"
    OFF = "off"  # COMMVIZ_NCCL_PLUGIN=0 or COMMVIZ_PURE=1
    FAILED = "failed"  # the library is there but would not load


@dataclass
class Plugin:
    state: PluginState
    why: str = ""
    path: str | None = None
    lib: object = field(default=None, repr=False)


def enable(environ=None) -> Plugin:
    """Point NCCL at the plugin and attach to it. Never raises; the result says
    what happened (commviz doctor and the probe's health report it)."""
    env = os.environ if environ is None else environ
    if native.pure() or env.get("COMMVIZ_NCCL_PLUGIN", "1") == "0":
        return Plugin(PluginState.OFF, "COMMVIZ_PURE=1" if native.pure() else "COMMVIZ_NCCL_PLUGIN=0")
    path = native.library(PART)
    if path is None:
        return Plugin(PluginState.NOT_BUILT, "reinstall with a C compiler: pip install -e .")
    theirs = env.get(ENV)
    if theirs and os.path.realpath(theirs) != os.path.realpath(path):
        return Plugin(PluginState.USER_PLUGIN, f"{ENV}={theirs} is set; commviz leaves NCCL's profiler to it",
                      path)
    if len(path) > MAX_PATH:
        return Plugin(PluginState.FAILED, f"its path is longer than NCCL reads ({len(path)} > {MAX_PATH})", path)
    try:
        lib = ctypes.CDLL(path)
        lib.cvz_drain.argtypes = (ctypes.c_void_p, ctypes.c_int)
        lib.cvz_drain.restype = ctypes.c_int
        lib.cvz_stats.argtypes = (ctypes.POINTER(ctypes.c_uint64), ctypes.c_int)
        if lib.cvz_attach() != RECORD.size:
            return Plugin(PluginState.FAILED, "the library's record layout is not this reader's", path)
    except (OSError, AttributeError) as exc:
        return Plugin(PluginState.FAILED, str(exc), path)
    env[ENV] = path
    return Plugin(PluginState.LOADED, "", path, lib)


def kernel_events(environ=None) -> bool:
    """Whether the plugin asks NCCL for per-channel kernel events (its GPU times and
    completions); COMMVIZ_NCCL_KERNEL=0 leaves them off, as the plugin reads it too."""
    env = os.environ if environ is None else environ
    return env.get("COMMVIZ_NCCL_KERNEL", "1") != "0"


class Reader:
    """Drains the plugin's ring into events, on one thread (the sender's)."""

    def __init__(self, plugin: Plugin, assembler: Assembler | None = None) -> None:
        self.lib = plugin.lib
        self.assembler = assembler or Assembler(kernel_events=kernel_events())
        self._buf = ctypes.create_string_buffer(DRAIN_AT_ONCE * RECORD.size)
        self.records = 0

    def poll(self) -> list:
        out: list = []
        while True:
            n = self.lib.cvz_drain(self._buf, DRAIN_AT_ONCE)
            if n <= 0:
                return out
            self.records += n
            out.extend(self.assembler.feed(parse(self._buf.raw, n)))
            if n < DRAIN_AT_ONCE:
                return out

    def stats(self) -> dict[str, int]:
        vals = (ctypes.c_uint64 * len(STATS))()
        n = self.lib.cvz_stats(vals, len(STATS))
        got = dict(zip(STATS[:n], vals[:n]))
        got["let_go"] = self.assembler.let_go
        got["orphans"] = self.assembler.orphans
        return got
