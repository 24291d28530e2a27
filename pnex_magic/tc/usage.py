"""Which tensor-core primitives a kernel calls, read off its code and globals without
Numba: the compile stage picks a stand-in architecture that has them (no GPU), and
refuses a GPU that does not, naming the primitive; the derived backward refuses them."""

from __future__ import annotations

import dis
import types
from typing import Any

from ..lazycuda import is_lazy_cuda
from .api import FUNCTIONS

_PACKAGE = "pnex_magic.tc"

__all__ = ["MIN_ARCH", "used_primitives", "required_cc", "primitive_lines"]

#: The oldest architecture each primitive runs on.
MIN_ARCH = {
    "mma": (8, 0), "mma_bf16": (8, 0), "mma_tf32": (8, 0),
    "cp_async": (8, 0), "cp_async_commit": (8, 0), "cp_async_wait": (8, 0),
    "ldmatrix": (7, 5), "pack_bf16x2": (8, 0), "to_tf32": (8, 0),
    "wgmma": (9, 0), "wgmma_bf16": (9, 0), "wgmma_fence": (9, 0), "wgmma_commit": (9, 0), "wgmma_wait": (9, 0),
    "fence_async_shared": (9, 0),
}


def _functions(fn: types.FunctionType, seen: set[int]) -> list[types.FunctionType]:
    """``fn`` and the Python functions of the device functions it calls, frozen or not."""
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    found = [fn]
    values = list(getattr(fn, "__globals__", {}).values())
    values += [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
    for value in values:
        if isinstance(value, (types.ModuleType, type)) or is_lazy_cuda(value):
            continue  # (reading an attribute of %%pnex's lazy `cuda` would import Numba)
        inner = getattr(value, "function", None) or getattr(value, "py_func", None)
        if isinstance(inner, types.FunctionType):
            found += _functions(inner, seen)
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _calls(fn: types.FunctionType) -> list[tuple[str, int]]:
    """(primitive, line) for each call of a ``pnex_magic.tc`` function in ``fn``'s code:
    ``tc.mma(...)``, ``pnex.tc.mma(...)`` or ``mma(...)`` imported from it."""
    namespace = dict(fn.__globals__)
    namespace.update(zip(fn.__code__.co_freevars, (c.cell_contents if _filled(c) else None for c in fn.__closure__ or ())))
    # the modules themselves, or the snapshot's frozen copies of them (same names)
    modules = {name: value.__name__ for name, value in namespace.items() if isinstance(value, types.ModuleType)}
    tc_names = {name for name, module in modules.items() if module == _PACKAGE}
    pnex_names = {name for name, module in modules.items() if module == _PACKAGE.rpartition(".")[0]}
    direct = {name: value.__name__ for name, value in namespace.items()
              if callable(value) and FUNCTIONS.get(getattr(value, "__name__", "")) is value}
    found: list[tuple[str, int]] = []
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        previous: list[Any] = []
        line = code.co_firstlineno
        for ins in dis.get_instructions(code):
            position = getattr(ins, "positions", None)
            line = getattr(position, "lineno", None) or line
            name = ins.argval if isinstance(ins.argval, str) else None
            if ins.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME") and name in direct:
                found.append((direct[name], line))
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and name in FUNCTIONS and previous:
                before = previous[-1]
                if before in tc_names or (before == "tc" and len(previous) > 1 and previous[-2] in pnex_names):
                    found.append((name, line))
            if name is not None and ins.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD"):
                previous.append(name)
    return found


def primitive_lines(fn: types.FunctionType) -> list[tuple[str, int]]:
    """(primitive, line) of every tensor-core primitive call in the kernel ``fn`` and the
    device functions it calls (lines of their own files)."""
    found: list[tuple[str, int]] = []
    for f in _functions(fn, set()):
        found += _calls(f)
    return found


def used_primitives(fn: types.FunctionType) -> set[str]:
    return {name for name, _ in primitive_lines(fn)}


def required_cc(fn: types.FunctionType) -> tuple[tuple[int, int], str] | None:
    """The oldest architecture that runs every primitive ``fn`` calls, and one primitive
    that needs it (``None``: no primitive needs more than any GPU has)."""
    best: tuple[tuple[int, int], str] | None = None
    for name in sorted(used_primitives(fn)):
        cc = MIN_ARCH.get(name)
        if cc is not None and (best is None or cc > best[0]):
            best = (cc, name)
    return best
