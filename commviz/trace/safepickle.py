"""Loading the pickles torch's flight recorder writes, which are untrusted files.

A pickle is a program: GLOBAL/STACK_GLOBAL import any callable, REDUCE calls it,
BUILD/INST/OBJ/NEWOBJ construct objects, PERSID hands ids to a callback. The dumps
torch writes hold plain data only (dicts, lists, tuples, strings, numbers, None), so
everything else is refused *before* a single opcode runs: the whole stream is walked
with `pickletools.genops` against an allowlist, and the Unpickler that then loads it
refuses every class lookup and persistent id as a second wall.
"""

from __future__ import annotations

import io
import pickle
import pickletools

MAX_BYTES = 256 * 1024 * 1024
MAX_OPCODES = 50_000_000

# Opcodes that build plain data (and the framing/memo bookkeeping around them).
ALLOWED = frozenset(
    {
        "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
        "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
        "NONE", "NEWTRUE", "NEWFALSE",
        "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
        "FLOAT", "BINFLOAT",
        "STRING", "BINSTRING", "SHORT_BINSTRING",
        "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
        "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
        "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
        "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
        "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS",
    }
)


class UnsafePickle(ValueError):
    """Not a plain-data pickle; the message names the opcode and its offset."""


class _Refusing(pickle.Unpickler):
    def find_class(self, module, name):  # noqa: D401 - the second wall
        raise UnsafePickle(f"refuses to import {module}.{name}")

    def persistent_load(self, pid):
        raise UnsafePickle("refuses persistent ids")


def check(data: bytes) -> None:
    """Raise UnsafePickle unless every opcode of `data` builds plain data."""
    if len(data) > MAX_BYTES:
        raise UnsafePickle(f"{len(data)} bytes, over the {MAX_BYTES}-byte limit")
    n = 0
    try:
        for op, _arg, pos in pickletools.genops(data):
            n += 1
            if op.name not in ALLOWED:
                raise UnsafePickle(f"opcode {op.name} at offset {pos} could run code; only plain data is loaded")
            if n > MAX_OPCODES:
                raise UnsafePickle(f"more than {MAX_OPCODES} opcodes")
    except UnsafePickle:
        raise
    except Exception as exc:  # genops raises ValueError and friends on garbage
        raise UnsafePickle(f"not a pickle: {exc}") from None


def loads(data: bytes) -> object:
    """The plain data in `data`; UnsafePickle for anything else (or a broken stream)."""
    check(data)
    try:
        return _Refusing(io.BytesIO(data)).load()
    except UnsafePickle:
        raise
    except RecursionError:
        raise UnsafePickle("nested too deeply") from None
    except Exception as exc:
        raise UnsafePickle(f"not a pickle: {type(exc).__name__}: {exc}") from None
