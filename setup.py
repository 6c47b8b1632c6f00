"""The compiled parts, each optional and needing only the Python headers: the
watcher's reader loop (commviz/transport/_fastrecv.c; without it pyzmq does the
reading, slower: commviz/transport/reader.py) and the probe's per-op wrapper for
the common case (commviz/probe/_fastwrap.c; without it the Python wrapper in
commviz/probe/patch.py does everything, slower), and msgpack for the crash ring's slots and
the wire's frames (commviz/_fastpack.c; without it trace/ring.py's Python writers
and msgspec, slower), and frames read straight into the batch path's columns, and a batch's columns read
from event objects (commviz/model/_fastcols.c; without it msgspec decodes every event
and model/store.py reads them, slower), and NCCL's profiler plugin
(commviz/probe/_ncclprof.c; without it commviz sees only what passes through
torch.distributed's Python API)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("commviz.transport._fastrecv", ["commviz/transport/_fastrecv.c"], optional=True),
    Extension("commviz.probe._fastwrap", ["commviz/probe/_fastwrap.c"], optional=True),
    Extension("commviz._fastpack", ["commviz/_fastpack.c"], optional=True),
    Extension("commviz.model._fastcols", ["commviz/model/_fastcols.c"], optional=True),
    # Not a Python module: NCCL's profiler plugin, a plain C library that NCCL dlopens
    # and the probe reads through ctypes (commviz/probe/nccl_plugin.py).
    Extension("commviz.probe._ncclprof", ["commviz/probe/_ncclprof.c"], depends=["commviz/probe/ncclprof_abi.h"],
              extra_compile_args=["-std=c11", "-fvisibility=hidden"], optional=True),
])
