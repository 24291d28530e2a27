"""Content fingerprints of kernels: what the compile cache is keyed on.

A kernel's compiled code depends on its source and on the *values* of the globals
and closure variables it reads (Numba freezes them as constants), recursively
through the device functions it calls (their source, globals and options), and on
the CUDA C++ it links (``cuda.declare_device``: the declaration and the linked
files' contents).  :func:`function_fingerprint` hashes all of that, so that a
block-size constant changed between two definitions is never served stale, while
an unchanged kernel redefined in a fresh process hashes the same.

A kernel definition hashes its snapshot (:mod:`pnex_magic.snapshot`), the copy every
compile is built from: a device array read as a global is a hidden argument there,
hashed by its dtype, rank and layout, never by its address or contents.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import textwrap
import types
from typing import Any

import numpy as np
import torch

from .lazycuda import MODULE_NAME as LAZY_MODULE_NAME
from .lazycuda import is_lazy_cuda
from .snapshot import (DeviceFunction, HiddenArray, device_options, is_dispatcher, is_foreign_function, is_user_module,
                       referenced_names)

__all__ = ["function_fingerprint", "closure_token"]


def _source(fn: types.FunctionType) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        # No source (exec'd code): the bytecode and its constants identify it.
        code = fn.__code__
        return repr((code.co_code, code.co_consts, code.co_names, code.co_varnames))


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
    if isinstance(value, HiddenArray):  # passed at each launch: its address and contents are not in the code
        return f"hidden-array:{value.dtype.name}:{value.ndim}:{value.layout}"
    if isinstance(value, torch.Tensor):  # (an unfrozen function's: the same as its snapshot's hidden argument)
        return f"hidden-array:{str(value.dtype).removeprefix('torch.')}:{value.dim()}:{'C' if value.is_contiguous() else 'A'}"
    if _is_own(value):  # pnex's own code: the code version in every key holds it (and its state is not code)
        return f"pnex:{_own_name(value)}"
    if isinstance(value, DeviceFunction):
        return f"cuda-function{_options_token(value.options)}:" + _function_token(value.function, depth + 1, seen)
    if is_foreign_function(value):
        return _foreign_token(value)
    if isinstance(value, (np.generic, np.dtype)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if is_lazy_cuda(value):  # %%pnex's ``cuda``: the same kernel as with ``from numba import cuda``
        return f"module:{LAZY_MODULE_NAME}"
    if is_dispatcher(value):
        options = _options_token(device_options(value))
        return f"cuda-function{options}:" + _function_token(value.py_func, depth + 1, seen)
    if isinstance(value, types.FunctionType):
        return "function:" + _function_token(value, depth + 1, seen)
    if isinstance(value, type):
        return f"type:{value.__module__}.{value.__qualname__}"
    text = repr(value)
    if " at 0x" in text:  # default repr: only the type is stable
        return f"object:{type(value).__module__}.{type(value).__qualname__}"
    return f"{type(value).__module__}.{type(value).__qualname__}:{text}"


def _own_name(value: Any) -> str:
    """The qualified name of ``value`` (a function, a Numba dispatcher of one, a module)."""
    if isinstance(value, types.ModuleType):
        return value.__name__
    fn = value.py_func if is_dispatcher(value) else value
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"


def _is_own(value: Any) -> bool:
    """A module, function or device function of pnex_magic itself (``pnex.tc``'s primitives,
    their simulator's helpers).  Their source is in the code version every cache key holds
    (:func:`pnex_magic.codeversion.code_version`); walking into them hashed their module
    state as well (the simulator's last-progress time, the running threads), so that a
    kernel calling ``pnex.tc`` got another key in every process and was compiled again."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
    elif isinstance(value, types.FunctionType) or is_dispatcher(value):
        name = _own_name(value)
    else:
        return False
    return name == "pnex_magic" or name.startswith("pnex_magic.")


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
        if is_user_module(value) and not _is_own(value):
            # Attribute reads of a user module (config.BLOCK): hash those values too.
            for attr in sorted(names):
                if attr != name and hasattr(value, attr):
                    parts.append(f"global {name}.{attr}={_value_token(getattr(value, attr), depth, seen)}")
    if fn.__closure__:
        parts.append(closure_token(fn, depth, seen))
    if fn.__defaults__:
        parts.append(f"defaults={_value_token(fn.__defaults__, depth, seen)}")
    return "\n".join(parts)


def closure_token(fn: types.FunctionType, depth: int = 0, seen: set[int] | None = None) -> str:
    """A stable text standing for the values of ``fn``'s closure variables."""
    parts = []
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:
            contents = "<empty cell>"
        parts.append(f"closure {var}={_value_token(contents, depth, seen if seen is not None else {id(fn)})}")
    return "\n".join(parts)


def _options_token(options: dict[str, Any]) -> str:
    """A device function's options that change its code (none: "")."""
    if not options:
        return ""
    items = []
    for key, value in sorted(options.items()):
        if key == "link":
            value = [_file_token(item) for item in value]
        items.append(f"{key}={value!r}")
    return "[" + ",".join(items) + "]"


def _file_token(item: Any) -> str:
    """A linked file by its path and contents (a linkable object by its repr)."""
    if isinstance(item, (str, bytes)) or hasattr(item, "__fspath__"):
        try:
            with open(item, "rb") as f:
                return f"{item!s}:{hashlib.sha256(f.read()).hexdigest()}"
        except OSError:
            return f"{item!s}:unreadable"
    data = getattr(item, "data", None)
    if isinstance(data, (bytes, str)):
        raw = data.encode() if isinstance(data, str) else data
        return f"{type(item).__name__}:{hashlib.sha256(raw).hexdigest()}"
    return f"{type(item).__module__}.{type(item).__qualname__}"


def _foreign_token(value: Any) -> str:
    """A ``cuda.declare_device`` function: its name, signature, the files linked for it
    (paths and contents, read from Numba's registry of it) and NVRTC's extra include
    folders."""
    links: list[str] = []
    try:
        descriptor = sys.modules.get("numba.cuda.descriptor")
        context = getattr(getattr(descriptor, "cuda_target", None), "_targetctx", None)
        selector = context._defns.get(value) if context is not None else None
        for _, impl in getattr(selector, "versions", ()):
            for library in getattr(impl, "libs", ()):
                links += sorted(_file_token(f) for f in getattr(library, "_linking_files", ()))
    except Exception:  # another numba-cuda layout: the declaration alone
        links.append("links unknown")
    config = sys.modules.get("numba.cuda.config")
    search = getattr(config, "CUDA_NVRTC_EXTRA_SEARCH_PATHS", "")
    return f"foreign:{getattr(value, 'name', '?')}:{getattr(value, 'sig', '?')}:{links}:{search}"


def function_fingerprint(fn: types.FunctionType, *extra: str) -> str:
    """SHA-256 (hex) of the function's source, the values it reads, and ``extra``."""
    h = hashlib.sha256()
    h.update(_function_token(fn, 0, set()).encode())
    for item in extra:
        h.update(b"\0")
        h.update(item.encode())
    return h.hexdigest()
