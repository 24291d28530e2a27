"""A typed kernel as pnex's disk cache keeps it, and made again without Numba.

Typing a kernel needs Numba-CUDA's typing context (about 2 s to set up in a process)
and a cross-check against Numba's own typing; a cache hit needs neither.  What the
rewrite made is kept as data (:func:`dumps`): for the kernel and each device
function it rewrote, callees first, the rewritten ``def`` (its syntax tree, line
numbers included: tracebacks and shared arrays read them) and the recipe of each
extra global it reads (a :func:`.runtime.make` key, a typed constant's bytes, or the
place of a rewritten device function).  :func:`loads` compiles them again against
the snapshot's own functions (their globals and closures), found by identity.

The tree is pickled, and read back by an unpickler that makes nothing but the
``ast`` module's nodes and plain values: a cache entry cannot run code as it loads.
"""

from __future__ import annotations

import ast
import io
import pickle
import types
from typing import Any

from ..kernelsource import namespace_of, rebuild
from ..snapshot import DeviceFunction, FrozenModule
from . import runtime

__all__ = ["dumps", "loads", "function_identity", "FORMAT"]

#: Bumped whenever what is stored, or what a recipe makes, changes meaning.
FORMAT = 1

_PLAIN = {"builtins": {"list", "tuple", "dict", "str", "int", "float", "bool", "bytes", "complex", "set", "frozenset",
                       "NoneType", "Ellipsis", "slice"}}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in ("ast", "_ast") and isinstance(getattr(ast, name, None), type):
            return getattr(ast, name)
        if name in _PLAIN.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a stored simulated kernel holds {module}.{name}")


def dumps(records: list) -> bytes:
    """The build's records (:attr:`.kernel.Build.records`) as bytes."""
    return pickle.dumps({"format": FORMAT, "records": records}, protocol=4)


def loads(data: bytes, kernel: types.FunctionType, what: str = "the kernel") -> types.FunctionType:
    """The typed kernel made again from :func:`dumps`' bytes, for the snapshot's kernel
    ``kernel``.  ``ValueError`` where the data is not such a form (the caller types the
    kernel again)."""
    try:
        payload = _SafeUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - any damage is a miss
        raise ValueError(f"unreadable: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError("another format")
    devices = _devices(kernel)
    made: list[Any] = []
    new = None
    for identity, fdef, recipe in payload["records"]:
        if identity is None:
            original, options, dispatcher = kernel, None, None
        else:
            found = devices.get(tuple(identity))
            if found is None:
                raise ValueError(f"no device function {identity[0]} in the snapshot")
            original, options, dispatcher = found.function, found.options, found.original
        extra = {name: _make(key, made) for name, key in recipe.items()}
        new = rebuild(original, fdef, extra, what=what)
        made.append(new if identity is None else DeviceFunction(new, options, dispatcher))
    if new is None or payload["records"][-1][0] is not None:
        raise ValueError("no kernel")
    return new


def function_identity(fn: types.FunctionType) -> tuple:
    """A device function's identity across processes: name, file and first line."""
    code = fn.__code__
    return (fn.__qualname__, code.co_filename, code.co_firstlineno)


def _make(key: Any, made: list) -> Any:
    key = _tuples(key)
    if key[0] == "device":
        return made[key[1]]
    return runtime.make(key)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _devices(kernel: types.FunctionType) -> dict[tuple, DeviceFunction]:
    """Every frozen device function the kernel reaches (through globals, closures,
    frozen modules, tuples, other device functions), by identity."""
    found: dict[tuple, DeviceFunction] = {}
    seen: set[int] = set()

    def visit(value: Any) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, DeviceFunction):
            found.setdefault(function_identity(value.function), value)
            for item in namespace_of(value.function).values():
                visit(item)
        elif isinstance(value, FrozenModule):
            for item in vars(value).values():
                visit(item)
        elif isinstance(value, tuple):
            for item in value:
                visit(item)

    for item in namespace_of(kernel).values():
        visit(item)
    return found
