"""Reading back pickles of commviz's own data from elsewhere: a collector's snapshot
in a remote view (viewlink.py).

A pickle is a program: each global it names is looked up through `find_class`, and
REDUCE then calls what was found with arguments of the pickle's choosing. So what may
be named is the defence: commviz's own *data* types (dataclasses, enums, msgspec
Structs and named tuples, which pickle rebuilds without running code of theirs
beyond setting fields), rich's styled-text classes, and a short list of containers
and numpy's reconstructors. Any function, and any other class (a trace writer that
opens a file as it is made, a server), is refused by name, so a hostile answer
cannot make a view call it.

The stream is not screened opcode by opcode first (`pickletools.genops`, as
trace/safepickle.py does for torch's plain-data dumps): these pickles are object
graphs, so REDUCE, BUILD and NEWOBJ are in every legitimate one, and every opcode
that can reach code (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*) goes through
`find_class`, and PERSID through `persistent_load`, which refuses. A screen would
refuse nothing more and cost a second pass over each snapshot (235 KB at 1,024 ranks,
four times a second per view).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pickle
import sys
from typing import IO

import msgspec

# What a snapshot is made of besides commviz's own data types.
ALLOWED = frozenset({
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "slice"),
    ("builtins", "object"), ("copyreg", "_reconstructor"),
    ("collections", "OrderedDict"), ("collections", "deque"), ("collections", "defaultdict"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
})
# A module a pickle names is imported only from these (an import runs the module: a
# pickle must not be able to start `commviz.run` or a scenario by naming it); any
# other must be imported already.
DATA_PACKAGES = ("commviz.events", "commviz.ops", "commviz.model.", "commviz.topo.", "commviz.tui.")
RICH_MODULES = frozenset({"rich.text", "rich.style", "rich.color", "rich.color_triplet", "rich.segment"})


class RefusedPickle(pickle.UnpicklingError):
    """The pickle names something that is not plain commviz data."""


def data_type(obj) -> bool:
    """A class whose instances pickle rebuilds by setting fields, running no code of
    its own: a dataclass, an enum, a msgspec Struct or a named tuple."""
    if not isinstance(obj, type):
        return False
    return (dataclasses.is_dataclass(obj) or issubclass(obj, (enum.Enum, msgspec.Struct))
            or (issubclass(obj, tuple) and hasattr(obj, "_fields")))


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        own = module == "commviz" or module.startswith("commviz.")
        mod = None
        if (own or module in RICH_MODULES) and not name.startswith("_"):
            mod = sys.modules.get(module)
            if mod is None and (module in RICH_MODULES or module.startswith(DATA_PACKAGES)):
                mod = importlib.import_module(module)
        obj = getattr(mod, name, None)
        if obj is not None and (data_type(obj) if own else isinstance(obj, type)):
            return obj
        raise RefusedPickle(f"names {module}.{name}, which is not commviz's data")

    def persistent_load(self, pid):
        raise RefusedPickle("names a persistent id")


def load(f: IO[bytes]):
    """The object a file of commviz's own pickles holds; RefusedPickle if it names
    anything else."""
    return _Unpickler(f).load()
