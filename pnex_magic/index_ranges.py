"""Index ranges a kernel's source proves: which accesses of its on-chip arrays (a
``cuda.shared.array`` or ``cuda.local.array`` of constant shape) can never be out of
bounds, so that its checked variant (:mod:`pnex_magic.checked`) need not test them.

A bounds check the compiler cannot remove costs more than its compare: its cold
recording block sits in the loop body, and NVVM then declines to unroll the loop.
The diffusion stencil's checked variant issued 5 shared-memory loads per loop trip
where the fast one issued all 20 unrolled, and ran 1.8x slower; with its on-chip
accesses proven here, its loop unrolls as in the fast variant.

The proof is an interval analysis over the kernel's Python source, sound by
construction and deliberately small:

* an expression's interval is known only when every value it can take is a
  non-negative integer below 2**31, at every step of its evaluation.  So neither
  signed overflow nor unsigned wrap-around (``tx - ty`` on ``uint32`` values) can
  make the machine's value differ from the interval's arithmetic;
* a local name's interval is the union over *all* its bindings in the function
  (flow-insensitive): plain assignments, ``for k in range(...)`` with a positive
  step, augmented assignments.  A binding of any other form (a parameter, tuple
  unpacking from a call, ``with ... as``, ``global``, a walrus, ``del``), or a
  name that depends on itself (``i += 1`` in a loop), leaves the name unknown;
* a name not bound in the function is a global or closure value: an ``int`` there
  is a constant, as Numba compiles it;
* ``cuda.threadIdx`` ranges over the launch's block shapes (the op's candidates,
  so an autotuned op is covered too), ``cuda.blockDim`` is one of them;
  ``cuda.blockIdx`` is below the hardware's grid limits, ``cuda.laneid`` below 32;
* ``+ - * // % & >> << |``, ``min``/``max``/``int`` of known values, and ``a if c else b``
  (the union of both) are understood; anything else (a call, a subscript, a float)
  is unknown.  ``x % d`` and ``x & m`` with ``d``/``m`` known and positive are known
  whatever ``x`` is.

An access (a load, a store, or a ``cuda.atomic`` operation's index) is proven when it
indexes such an array by its name with one integer per axis, each known to lie in
``[0, n)`` for that axis's length ``n``: a shared-memory histogram's
``cuda.atomic.add(bins, x[i] % 64, 1)`` is.  Anything else is left to the run-time check.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Interval", "IndexRanges"]

_LIMIT = 1 << 31  # every value of a known interval lies in [0, _LIMIT)
# The hardware's grid limits (blockIdx.x < 2**31 - 1, y and z < 65535) and block limits.
_GRID = {"x": (1 << 31) - 1, "y": 65535, "z": 65535}
_BLOCK = {"x": 1024, "y": 1024, "z": 64}
_ON_CHIP = ("shared", "local")


@dataclasses.dataclass(frozen=True)
class Interval:
    """The integers ``lo`` to ``hi``, both included."""

    lo: int
    hi: int

    def __or__(self, other: Interval) -> Interval:
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))


def _known(lo: int, hi: int) -> Interval | None:
    """The interval, or ``None`` when it leaves ``[0, 2**31)`` (see the module's docstring)."""
    if lo < 0 or hi >= _LIMIT or lo > hi:
        return None
    return Interval(lo, hi)


def _union(values: Iterable[Interval | None]) -> Interval | None:
    out: Interval | None = None
    for v in values:
        if v is None:
            return None
        out = v if out is None else out | v
    return out


class _Unknown:
    """A binding pnex does not understand: the name it binds is unknown."""


_UNKNOWN = _Unknown()


@dataclasses.dataclass(frozen=True)
class _Range:
    """The binding of a ``for`` target over ``range(*args)``."""

    args: tuple[ast.expr, ...]


class IndexRanges:
    """What the source of kernel ``fdef`` (its ``def``, as parsed) proves about its
    indices.  ``namespace`` holds its globals and closure values; ``blocks`` the block
    shapes it may be launched with (``None``: any the hardware allows)."""

    def __init__(self, fdef: ast.FunctionDef, namespace: Mapping[str, Any],
                 blocks: Sequence[Sequence[int]] | None = None):
        self.namespace = namespace
        self.block = self._block_bounds(blocks)
        self.bindings: dict[str, list[Any]] = {}
        self._cache: dict[str, Interval | None] = {}
        self._active: set[str] = set()
        self._collect(fdef)
        self.arrays = self._on_chip_arrays()

    # ------------------------------------------------------------------ bindings
    @staticmethod
    def _block_bounds(blocks: Sequence[Sequence[int]] | None) -> dict[str, Interval]:
        if not blocks:
            return {d: Interval(1, _BLOCK[d]) for d in "xyz"}
        padded = [tuple(b) + (1,) * (3 - len(b)) for b in blocks]
        return {d: Interval(min(b[k] for b in padded), max(b[k] for b in padded)) for k, d in enumerate("xyz")}

    def _bind(self, name: str, value: Any) -> None:
        self.bindings.setdefault(name, []).append(value)

    def _bind_target(self, target: ast.expr, value: ast.expr | None, understood: set[int]) -> None:
        """Register ``target = value`` (``value`` ``None``: not understood)."""
        if isinstance(target, ast.Name):
            self._bind(target.id, value if value is not None else _UNKNOWN)
            understood.add(id(target))
        elif isinstance(target, (ast.Tuple, ast.List)):
            pairs = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) else None
            if any(isinstance(t, ast.Starred) for t in target.elts):
                pairs = None
            for k, t in enumerate(target.elts):
                self._bind_target(t, pairs[k] if pairs is not None else None, understood)
        # a subscript or attribute target binds no name

    def _collect(self, fdef: ast.FunctionDef) -> None:
        understood: set[int] = set()
        args = fdef.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                self._bind(a.arg, _UNKNOWN)
        for node in ast.walk(fdef):
            if node is fdef:
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind_target(target, node.value, understood)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                self._bind_target(node.target, node.value, understood)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                load = ast.Name(id=node.target.id, ctx=ast.Load())
                self._bind(node.target.id, ast.BinOp(left=load, op=node.op, right=node.value))
                understood.add(id(node.target))
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                it = node.iter
                if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                        and not it.keywords and 1 <= len(it.args) <= 3
                        and not any(isinstance(a, ast.Starred) for a in it.args)):
                    self._bind(node.target.id, _Range(tuple(it.args)))
                else:
                    self._bind(node.target.id, _UNKNOWN)
                understood.add(id(node.target))
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                for name in node.names:
                    self._bind(name, _UNKNOWN)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._bind(node.name, _UNKNOWN)
            elif isinstance(node, ast.alias):
                self._bind((node.asname or node.name).split(".")[0], _UNKNOWN)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self._bind(node.name, _UNKNOWN)
            elif isinstance(node, ast.arg):  # a nested function's or lambda's parameter
                self._bind(node.arg, _UNKNOWN)
            elif type(node).__name__ in ("MatchAs", "MatchStar", "MatchMapping"):
                name = getattr(node, "name", None) or getattr(node, "rest", None)
                if name:
                    self._bind(name, _UNKNOWN)
        # Every other name stored or deleted (a walrus, a comprehension's target, with-as, del):
        for node in ast.walk(fdef):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load) and id(node) not in understood:
                self._bind(node.id, _UNKNOWN)

    # ------------------------------------------------------------------ values
    def _global(self, name: str) -> Any:
        """A name's value outside the function: its globals and closure, then builtins."""
        if name in self.namespace:
            return self.namespace[name]
        return getattr(builtins, name, _UNKNOWN)

    def _cuda_path(self, node: ast.expr) -> tuple[str, ...] | None:
        """``("threadIdx", "x")`` for ``cuda.threadIdx.x`` (or ``threadIdx.x`` imported from
        numba.cuda, or ``numba.cuda.threadIdx.x``), ``None`` for anything not of numba.cuda."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in self.bindings:
            return None
        root = self._global(node.id)
        from .lazycuda import is_lazy_cuda

        if is_lazy_cuda(root):
            return tuple(attrs)
        name = getattr(root, "__name__", None)
        if isinstance(root, types.ModuleType) and name == "numba.cuda":  # the module
            return tuple(attrs)
        if isinstance(root, types.ModuleType) and name == "numba" and attrs[:1] == ["cuda"]:
            return tuple(attrs[1:])
        if isinstance(root, type) and root.__module__ == "numba.cuda.stubs":  # from numba.cuda import threadIdx
            return (root.__name__, *attrs)
        return None

    def interval(self, node: ast.expr) -> Interval | None:
        """The values ``node`` can take, or ``None`` when not known."""
        if isinstance(node, ast.Constant):
            v = node.value
            return _known(int(v), int(v)) if isinstance(v, int) else None
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
            return self.interval(node.operand)
        if isinstance(node, ast.IfExp):
            return _union((self.interval(node.body), self.interval(node.orelse)))
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _name(self, name: str) -> Interval | None:
        if name in self._cache:
            return self._cache[name]
        if name in self._active:  # depends on itself
            return None
        if name not in self.bindings:
            value = self._global(name)
            return _known(int(value), int(value)) if isinstance(value, int) else None
        self._active.add(name)
        try:
            result = _union(self._binding(b) for b in self.bindings[name])
        finally:
            self._active.discard(name)
        self._cache[name] = result
        return result

    def _binding(self, binding: Any) -> Interval | None:
        if isinstance(binding, _Unknown) or binding is None:
            return None
        if isinstance(binding, _Range):
            if self._global_builtin("range") is not range:
                return None
            args = [self.interval(a) for a in binding.args]
            if any(a is None for a in args):
                return None
            if len(args) == 1:
                start, stop, step = Interval(0, 0), args[0], Interval(1, 1)
            else:
                start, stop = args[0], args[1]
                step = args[2] if len(args) == 3 else Interval(1, 1)
            if step.lo < 1:
                return None
            return _known(start.lo, stop.hi - 1)
        return self.interval(binding)

    def _global_builtin(self, name: str) -> Any:
        return _UNKNOWN if name in self.bindings else self._global(name)

    def _attribute(self, node: ast.Attribute) -> Interval | None:
        path = self._cuda_path(node)
        if path is None or not 1 <= len(path) <= 2:
            return None
        if len(path) == 1:
            return {"laneid": Interval(0, 31), "warpsize": Interval(32, 32)}.get(path[0])
        owner, dim = path
        if dim not in ("x", "y", "z"):
            return None
        if owner == "threadIdx":
            return _known(0, self.block[dim].hi - 1)
        if owner == "blockDim":
            return self.block[dim]
        if owner == "blockIdx":
            return _known(0, _GRID[dim] - 1)
        if owner == "gridDim":
            return _known(1, _GRID[dim])
        return None

    def _binop(self, node: ast.BinOp) -> Interval | None:
        op = node.op
        a, b = self.interval(node.left), self.interval(node.right)
        if isinstance(op, ast.Mod) and b is not None and b.lo > 0:
            # Python's (and Numba's) modulo by a positive number, whatever the dividend
            if a is not None and a.hi < b.lo:
                return a
            return _known(0, b.hi - 1)
        if isinstance(op, ast.BitAnd) and (a is not None or b is not None):
            # x & m with m >= 0 lies in [0, m], whatever x is (two's complement)
            return _known(0, min(v.hi for v in (a, b) if v is not None))
        if a is None or b is None:
            return None
        if isinstance(op, ast.Add):
            return _known(a.lo + b.lo, a.hi + b.hi)
        if isinstance(op, ast.Sub):
            return _known(a.lo - b.hi, a.hi - b.lo)
        if isinstance(op, ast.Mult):
            return _known(a.lo * b.lo, a.hi * b.hi)
        if isinstance(op, ast.FloorDiv) and b.lo > 0:
            return _known(a.lo // b.hi, a.hi // b.lo)
        if isinstance(op, ast.RShift):
            return _known(a.lo >> min(b.hi, 63), a.hi >> b.lo)
        if isinstance(op, ast.LShift) and b.hi < 32:
            return _known(a.lo << b.lo, a.hi << b.hi)
        if isinstance(op, ast.BitOr):
            return _known(max(a.lo, b.lo), (1 << max(a.hi, b.hi).bit_length()) - 1)
        return None

    def _call(self, node: ast.Call) -> Interval | None:
        if not isinstance(node.func, ast.Name) or node.keywords or not node.args:
            return None
        func = self._global_builtin(node.func.id)
        if any(isinstance(a, ast.Starred) for a in node.args):
            return None
        values = [self.interval(a) for a in node.args]
        if any(v is None for v in values):
            return None
        if func is min and len(values) > 1:
            return Interval(min(v.lo for v in values), min(v.hi for v in values))
        if func is max and len(values) > 1:
            return Interval(max(v.lo for v in values), max(v.hi for v in values))
        if func is int and len(values) == 1:
            return values[0]
        return None

    # ------------------------------------------------------------------ arrays
    def _on_chip_arrays(self) -> dict[str, tuple[int, ...]]:
        """Names bound once, to a ``cuda.shared.array`` or ``cuda.local.array`` of a
        constant shape, and that shape."""
        arrays: dict[str, tuple[int, ...]] = {}
        for name, bindings in self.bindings.items():
            if len(bindings) != 1 or not isinstance(bindings[0], ast.Call):
                continue
            call = bindings[0]
            path = self._cuda_path(call.func)
            if path is None or len(path) != 2 or path[0] not in _ON_CHIP or path[1] != "array":
                continue
            shape_node = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "shape"), None)
            if shape_node is None:
                continue
            shape = self._constant_shape(shape_node)
            if shape is not None:
                arrays[name] = shape
        return arrays

    def _constant_shape(self, node: ast.expr) -> tuple[int, ...] | None:
        if isinstance(node, (ast.Tuple, ast.List)):
            parts = [self.interval(e) for e in node.elts]
        elif isinstance(node, ast.Name) and node.id not in self.bindings:
            value = self._global(node.id)
            if isinstance(value, int):
                return (value,)
            if isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
                return value
            return None
        else:
            parts = [self.interval(node)]
        if not parts or any(p is None or p.lo != p.hi for p in parts):
            return None
        return tuple(p.lo for p in parts)

    def in_bounds(self, node: ast.Subscript) -> bool:
        """Whether subscript ``node`` indexes an on-chip array of constant shape, one
        integer per axis, each proven in range."""
        if not isinstance(node.value, ast.Name):
            return False
        shape = self.arrays.get(node.value.id)
        if shape is None:
            return False
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if len(parts) != len(shape):
            return False
        for part, n in zip(parts, shape):
            v = self.interval(part)
            if v is None or v.hi >= n:
                return False
        return True
