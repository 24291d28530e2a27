"""What the typed rewrite knows of a value, and the code it emits to convert one.

:class:`Val`: a value's Numba type, whether the simulator holds it as a NumPy scalar
of exactly that type (``exact``; a value from an array, or one the rewrite
converted) or as a Python number equal to it (a literal, a loop index, a thread
index, a shape), its elements (a tuple), and a compile-time value where there is
one (a module, a function, a literal, a global constant).

:class:`Emitter`: the names the rewritten kernel reads besides its own (conversion
functions, typed constants, helpers of :mod:`.runtime`), registered once each, and
:meth:`Emitter.convert`, the one place a conversion is written into the tree.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
from typing import Any

import numpy as np

from ..errors import KernelLaunchError, KernelTypingError
from . import numba_types as T
from . import runtime

__all__ = ["Val", "NOCONST", "Emitter", "SimulationError", "same_state", "PREFIX"]

#: The names the rewrite adds to a kernel's globals start with this.
PREFIX = "__pnex_sim_"


class _NoConst:
    def __repr__(self) -> str:
        return "NOCONST"


NOCONST: Any = _NoConst()


@dataclasses.dataclass(frozen=True, eq=False)
class Val:
    """A value as the rewrite sees it (compared by identity: two assignments of the
    same constant are two definitions, as Numba's SSA has them)."""

    ty: Any
    exact: bool = False
    elems: tuple[Val, ...] | None = None
    const: Any = NOCONST
    #: For ``cuda.*`` and ``math.*`` names: the dotted path (``"cuda.atomic.add"``).
    path: str | None = None
    #: Held as a Python int, float or bool of the value (a literal, a thread index, a
    #: shape, a loop index, a float64 from math.*): NumPy treats it as "weak".
    py: bool = False
    #: The variable may have no value here (assigned on some paths only, or in a loop
    #: that may not run): nothing converts it where paths join; its uses do.
    unbound: bool = False

    @property
    def scalar(self) -> bool:
        return T.is_scalar(self.ty)

    @property
    def rep(self) -> tuple | None:
        """How the simulator holds the value, for NumPy's promotion rules:
        ``("np", dtype)`` (a NumPy scalar of exactly that dtype), ``("py", kind)``
        (a Python ``int``/``float``/``bool``), ``None`` (unknown: convert to be sure)."""
        if not self.scalar or T.is_bf16(self.ty):
            return None
        if self.exact:
            return ("np", str(T.runtime_dtype(self.ty)))
        if self.py:
            ty = T.unliteral(self.ty)
            if isinstance(ty, T.nb().Boolean):
                return ("py", "bool")
            if T.is_float(ty):
                return ("py", "float")
            return ("py", "int" if ty.signed else "uint")  # a Python int beyond int64 must not meet NumPy's int64
        return None

    def same_type(self, other: Val) -> bool:
        return (self.ty == other.ty and self.exact == other.exact and self.py == other.py
                and self.unbound == other.unbound)


def same_state(a: dict[str, Val], b: dict[str, Val]) -> bool:
    """Whether two states give every variable the same type and representation."""
    return a.keys() == b.keys() and all(a[k].same_type(b[k]) for k in a)


class SimulationError(Exception):
    """Raised inside the rewrite; :meth:`Emitter.fail` turns it into the user's error."""


def _type_name(ty: Any) -> str:
    """The :func:`runtime.converter` name of a scalar type."""
    if T.is_bf16(ty):
        return "bfloat16"
    ty = T.unliteral(ty)
    return "bool" if isinstance(ty, T.nb().Boolean) else str(ty)


class Emitter:
    """The extra globals of one rewritten kernel and the conversions it writes."""

    def __init__(self, kernel: str, filename: str, lines: dict[int, str]):
        self.kernel = kernel
        self.filename = filename
        self.lines = lines
        self.globals: dict[str, Any] = {}
        #: name -> how to make the global again (see :meth:`name_of`)
        self.recipe: dict[str, tuple] = {}
        self._keys: dict[Any, str] = {}
        self._count = itertools.count()

    # ----------------------------------------------------------------- names

    def name_of(self, obj: Any, hint: str, key: tuple) -> ast.Name:
        """A global name bound to ``obj``, one per ``key``: the recipe the stored form
        makes it again from (:func:`.runtime.make`, or a device function's identity)."""
        name = self._keys.get(key)
        if name is None:
            safe = "".join(c if c.isalnum() else "_" for c in hint)[:40]
            name = f"{PREFIX}{safe}_{next(self._count)}"
            self._keys[key] = name
            self.globals[name] = obj
            self.recipe[name] = key
        return ast.Name(id=name, ctx=ast.Load())

    def helper(self, key: tuple, hint: str) -> ast.Name:
        """A name for the :mod:`.runtime` helper ``make(key)`` builds, one per ``key``."""
        name = self._keys.get(key)
        if name is None:
            return self.name_of(runtime.make(key), hint, key)
        return ast.Name(id=name, ctx=ast.Load())

    def constant(self, value: Any, ty: Any) -> ast.Name:
        """A typed constant: ``value`` converted to scalar type ``ty`` now, as Numba
        converts a literal (an int literal is an int64, a float one a float64)."""
        converted = self.convert_value(value, ty)
        key = ("const", str(converted.dtype), converted.tobytes().hex())
        return self.name_of(converted, f"c_{_type_name(ty)}", key)

    def convert_value(self, value: Any, ty: Any) -> Any:
        source = "bool" if isinstance(value, (bool, np.bool_)) else (
            "float64" if isinstance(value, float) else "int64" if isinstance(value, int) else None)
        if source is None:
            return runtime.converter(_type_name(ty), str(np.asarray(value).dtype), False)(value)
        if source == "int64" and not (-(2**63) <= value < 2**63):
            source = "uint64"
        return runtime.converter(_type_name(ty), source, True)(value)

    # ----------------------------------------------------------------- conversions

    def needs(self, val: Val, target: Any) -> bool:
        """Whether ``val`` must be converted to hold a value of scalar type ``target``
        exactly (a NumPy scalar of its dtype, bfloat16 rounded)."""
        if not T.is_scalar(target):
            return False
        return not (val.exact and T.unliteral(val.ty) == T.unliteral(target))

    def convert(self, node: ast.expr, val: Val, target: Any) -> ast.expr:
        """``node`` (whose value is ``val``) converted to scalar type ``target`` as
        Numba converts; unchanged where it already is one."""
        if not self.needs(val, target):
            return node
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
            return ast.copy_location(self.constant(node.value, target), node)
        if not val.scalar:
            raise SimulationError(f"a value of type {val.ty} where a number of type {target} is expected")
        fn = self.helper(self.converter_key(val, target), f"to_{_type_name(target)}")
        return ast.copy_location(ast.Call(func=fn, args=[node], keywords=[]), node)

    def converter_key(self, val: Val, target: Any) -> tuple | None:
        """The :func:`.runtime.make` key of the conversion of ``val`` to ``target``
        (``None`` where none is needed)."""
        if not self.needs(val, target):
            return None
        return ("convert", _type_name(target), _type_name(val.ty), not val.exact)

    def call(self, fn: ast.expr, args: list[ast.expr], like: ast.AST) -> ast.Call:
        return ast.copy_location(ast.Call(func=fn, args=args, keywords=[]), like)

    # ----------------------------------------------------------------- errors

    def fail(self, node: ast.AST, message: str, typing: bool = False) -> Exception:
        """The user's error for ``node``: a :class:`KernelTypingError` where Numba
        cannot type it (the GPU compile fails too), else a :class:`KernelLaunchError`
        saying what the simulator cannot compute as Numba does."""
        import linecache

        line = getattr(node, "lineno", None)
        text = (self.lines.get(line) or linecache.getline(self.filename, line)).strip() if line else ""
        at = f" at line {line}" + (f": `{text}`" if text else "") if line else ""
        if typing:
            return KernelTypingError(
                f"kernel {self.kernel!r}{at}: Numba cannot type this: {message}", lineno=line)
        return KernelLaunchError(
            f"kernel {self.kernel!r}{at}: the CUDA simulator cannot compute this as Numba-CUDA does on the GPU "
            f"({message}); run the kernel on a GPU, or write it with operations the simulator knows "
            f"(arithmetic, comparisons, math.*, cuda.* intrinsics, device functions)")


def type_name(ty: Any) -> str:
    return _type_name(ty)
