"""Content fingerprints of kernels: what the compile cache is keyed on.

A kernel's compiled code depends on its source and on the *values* of the globals
and closure variables it reads (Numba freezes them as constants), recursively
through the device functions it calls.  :func:`function_fingerprint` hashes all
of that, so that a block-size constant changed between two definitions is never
served stale, while an unchanged kernel redefined in a fresh process hashes the
same.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

from .lazycuda import MODULE_NAME as LAZY_MODULE_NAME
from .lazycuda import is_lazy_cuda

__all__ = ["function_fingerprint", "referenced_names"]


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def referenced_names(fn: types.FunctionType) -> set[str]:
    """Global names (and attribute names) the function's code mentions."""
    names: set[str] = set()
    for code in _code_objects(fn.__code__):
        names.update(code.co_names)
    return names


def _source(fn: types.FunctionType) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        # No source (exec'd code): the bytecode and its constants identify it.
        code = fn.__code__
        return repr((code.co_code, code.co_consts, code.co_names, code.co_varnames))


def _is_dispatcher(value: Any) -> bool:
    # The type's module first: ``hasattr`` on pnex's lazy ``cuda`` would import Numba.
    return type(value).__module__.startswith("numba") and hasattr(value, "py_func")


def _value_token(value: Any, depth: int, seen: set[int]) -> str:
    """A stable text standing for a global's value."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (tuple, list, frozenset, set)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return f"{type(value).__name__}[" + ",".join(_value_token(v, depth, seen) for v in items) + "]"
    if isinstance(value, dict):
        return "dict{" + ",".join(f"{k!r}:{_value_token(v, depth, seen)}" for k, v in sorted(value.items(), key=repr)) + "}"
    if isinstance(value, np.ndarray):
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
        return f"ndarray:{value.dtype}:{value.shape}:{digest}"
    if isinstance(value, (np.generic, np.dtype)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if is_lazy_cuda(value):  # %%pnex's ``cuda``: the same kernel as with ``from numba import cuda``
        return f"module:{LAZY_MODULE_NAME}"
    if _is_dispatcher(value):
        return "cuda-function:" + _function_token(value.py_func, depth + 1, seen)
    if isinstance(value, types.FunctionType):
        return "function:" + _function_token(value, depth + 1, seen)
    if isinstance(value, type):
        return f"type:{value.__module__}.{value.__qualname__}"
    text = repr(value)
    if " at 0x" in text:  # default repr: only the type is stable
        return f"object:{type(value).__module__}.{type(value).__qualname__}"
    return f"{type(value).__module__}.{type(value).__qualname__}:{text}"


def _function_token(fn: types.FunctionType, depth: int, seen: set[int]) -> str:
    if id(fn) in seen or depth > 16:
        return f"<recursive {fn.__qualname__}>"
    seen = seen | {id(fn)}
    parts = [f"{fn.__module__}.{fn.__qualname__}", _source(fn)]
    names = referenced_names(fn)
    glb = fn.__globals__
    for name in sorted(names):
        if name not in glb:
            continue
        value = glb[name]
        parts.append(f"global {name}={_value_token(value, depth, seen)}")
        if isinstance(value, types.ModuleType) and not value.__name__.startswith(("numba", "math", "numpy", "cmath", "operator")):
            # Attribute reads of a user module (config.BLOCK): hash those values too.
            for attr in sorted(names):
                if attr != name and hasattr(value, attr):
                    parts.append(f"global {name}.{attr}={_value_token(getattr(value, attr), depth, seen)}")
    if fn.__closure__:
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                contents = cell.cell_contents
            except ValueError:
                contents = "<empty cell>"
            parts.append(f"closure {var}={_value_token(contents, depth, seen)}")
    if fn.__defaults__:
        parts.append(f"defaults={_value_token(fn.__defaults__, depth, seen)}")
    return "\n".join(parts)


def function_fingerprint(fn: types.FunctionType, *extra: str) -> str:
    """SHA-256 (hex) of the function's source, the values it reads, and ``extra``."""
    h = hashlib.sha256()
    h.update(_function_token(fn, 0, set()).encode())
    for item in extra:
        h.update(b"\0")
        h.update(item.encode())
    return h.hexdigest()
