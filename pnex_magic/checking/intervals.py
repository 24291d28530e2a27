"""Interval proofs: the values a kernel's integer expressions can take.

Sound by construction and deliberately small (the rules are listed in
:mod:`pnex_magic.checking.index_ranges`).  :meth:`Intervals.interval` gives an
expression's interval only when every value it can take is a non-negative integer
below 2**31 at every step of its evaluation, so neither signed overflow nor unsigned
wrap-around can make the machine's value differ from the interval's arithmetic.
:meth:`Intervals.magnitude` is coarser: a power of two the value stays below, which
admits tensor sizes and ``cuda.grid`` (the lower bound of an index whose upper bound
a guard gives).  :meth:`Intervals.on_chip_arrays` finds the ``cuda.shared.array`` /
``cuda.local.array`` arrays of constant shape that intervals are compared with.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from .bindings import PARAM, UNKNOWN, Bindings, Element, RangeBinding
from .sizes import TensorSizes

__all__ = ["Interval", "Intervals"]

_LIMIT = 1 << 31  # every value of a known interval lies in [0, _LIMIT)
# The hardware's grid limits (blockIdx.x < 2**31 - 1, y and z < 65535) and block limits.
_GRID = {"x": (1 << 31) - 1, "y": 65535, "z": 65535}
_BLOCK = {"x": 1024, "y": 1024, "z": 64}
_ON_CHIP = ("shared", "local")
#: Sizes of a tensor's axes are below 2**48 (no memory holds more elements): the bound
#: :meth:`Intervals.magnitude` assumes for a size it cannot bound otherwise.
_SIZE_BITS = 48
#: ``cuda.grid``: blockIdx < 2**31 times blockDim <= 1024, plus threadIdx.
_GRID_BITS = 41


@dataclasses.dataclass(frozen=True)
class Interval:
    """The integers ``lo`` to ``hi``, both included."""

    lo: int
    hi: int

    def __or__(self, other: Interval) -> Interval:
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))


def _known(lo: int, hi: int) -> Interval | None:
    """The interval, or ``None`` when it leaves ``[0, 2**31)``."""
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


class Intervals:
    """Intervals and magnitudes of a kernel's expressions.  ``blocks``: the block shapes
    it may be launched with (``None``: any the hardware allows)."""

    def __init__(self, bindings: Bindings, sizes: TensorSizes, blocks: Sequence[Sequence[int]] | None = None):
        self.bindings = bindings
        self.sizes = sizes
        self.block = self._block_bounds(blocks)
        self._cache: dict[str, Interval | None] = {}
        self._bits: dict[str, int | None] = {}

    @staticmethod
    def _block_bounds(blocks: Sequence[Sequence[int]] | None) -> dict[str, Interval]:
        if not blocks:
            return {d: Interval(1, _BLOCK[d]) for d in "xyz"}
        padded = [tuple(b) + (1,) * (3 - len(b)) for b in blocks]
        return {d: Interval(min(b[k] for b in padded), max(b[k] for b in padded)) for k, d in enumerate("xyz")}

    # ------------------------------------------------------------------ intervals
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
        if name not in self.bindings:
            value = self.bindings.value_of(name)
            return _known(int(value), int(value)) if isinstance(value, int) else None
        return self.bindings.fold(name, self._cache, self._binding, Interval.__or__)

    def _binding(self, binding: Any) -> Interval | None:
        if binding is UNKNOWN or binding is PARAM or isinstance(binding, Element) or binding is None:
            return None
        if isinstance(binding, RangeBinding):
            bounds = self.range_bounds(binding.args)
            values = [self.interval(a) for a in binding.args]  # the step's too
            if bounds is None or None in values:
                return None
            start, stop = bounds
            return _known(0 if start is None else self.interval(start).lo, self.interval(stop).hi - 1)
        return self.interval(binding)

    def range_bounds(self, args: tuple[ast.expr, ...]) -> tuple[ast.expr | None, ast.expr] | None:
        """``(start, stop)`` of ``range(*args)`` (``start`` ``None`` for 0) when ``range`` is
        the builtin and the step is positive, so that ``start <= i < stop``."""
        if self.bindings.builtin("range") is not range or (len(args) == 3 and not self.positive(args[2])):
            return None
        return (None, args[0]) if len(args) == 1 else (args[0], args[1])

    def _attribute(self, node: ast.Attribute) -> Interval | None:
        path = self.bindings.cuda_path(node)
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
        func = self.bindings.builtin(node.func.id)
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

    # ------------------------------------------------------------------ magnitudes
    def cuda_call(self, node: ast.expr) -> str | None:
        """``"grid"`` / ``"gridsize"`` for ``cuda.grid(n)`` / ``cuda.gridsize(n)``."""
        if isinstance(node, ast.Call) and not node.keywords and len(node.args) == 1:
            path = self.bindings.cuda_path(node.func)
            if path in (("grid",), ("gridsize",)):
                return path[0]
        return None

    def magnitude(self, node: ast.expr) -> int | None:
        """``b`` such that the value of ``node`` lies in ``[0, 2**b)`` at every step of its
        evaluation, with ``b <= 62`` (so no int64 arithmetic overflows), or ``None``.
        Unlike :meth:`interval` it takes sizes (below 2**48) and ``cuda.grid`` (below
        2**41) without a finer bound: it serves the lower bound of an index whose upper
        bound a guard gives."""
        found = self._magnitude(node)
        return found if found is not None and found <= 62 else None

    def _magnitude(self, node: ast.expr) -> int | None:
        known = self.interval(node)
        if known is not None:
            return known.hi.bit_length()
        if self.sizes.dim_of(node) is not None and not isinstance(node, ast.Name):
            return _SIZE_BITS
        if self.cuda_call(node) is not None:
            return _GRID_BITS
        if isinstance(node, ast.Name):
            return self._name_bits(node.id)
        if isinstance(node, ast.IfExp):
            a, b = self.magnitude(node.body), self.magnitude(node.orelse)
            return None if a is None or b is None else max(a, b)
        if isinstance(node, ast.BinOp):
            return self._binop_bits(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args and not node.keywords:
            func = self.bindings.builtin(node.func.id)
            bits = [self.magnitude(a) for a in node.args]
            if func in (min, max) and len(bits) > 1 and all(b is not None for b in bits):
                return max(bits)
        return None

    def _binop_bits(self, node: ast.BinOp) -> int | None:
        a, b = self.magnitude(node.left), self.magnitude(node.right)
        op = node.op
        small = self.interval(node.right)
        if isinstance(op, ast.Mod) and small is not None and small.lo > 0:
            return (small.hi - 1).bit_length()
        if isinstance(op, ast.BitAnd) and (a is not None or b is not None):
            return min(v for v in (a, b) if v is not None)
        if a is None or b is None:
            return None
        if isinstance(op, ast.Add):
            return max(a, b) + 1
        if isinstance(op, ast.Mult):
            return a + b
        if isinstance(op, ast.FloorDiv) and small is not None and small.lo > 0:
            return a
        if isinstance(op, ast.RShift):
            return a
        return None

    def _name_bits(self, name: str) -> int | None:
        if name not in self.bindings:
            return None
        return self.bindings.fold(name, self._bits, self._binding_bits, max)

    def _binding_bits(self, binding: Any) -> int | None:
        if isinstance(binding, Element):
            if self.sizes.shape_of(binding.source) is not None:
                return _SIZE_BITS
            if self.cuda_call(binding.source) is not None:
                return _GRID_BITS
            return None
        if isinstance(binding, RangeBinding):  # start <= i < stop
            bounds = self.range_bounds(binding.args)
            if bounds is None:
                return None
            bits = [self.magnitude(a) for a in bounds if a is not None]
            return None if None in bits else max(bits)
        if isinstance(binding, ast.expr):
            return self.magnitude(binding)
        return None

    def positive(self, node: ast.expr) -> bool:
        """Whether ``node`` is at least 1 (a range's step)."""
        known = self.interval(node)
        return (known is not None and known.lo >= 1) or self.cuda_call(node) == "gridsize"

    # ------------------------------------------------------------------ on-chip arrays
    def on_chip_arrays(self) -> dict[str, tuple[int, ...]]:
        """Names bound once, to a ``cuda.shared.array`` or ``cuda.local.array`` of a
        constant shape, and that shape."""
        arrays: dict[str, tuple[int, ...]] = {}
        for name, bindings in self.bindings.of.items():
            if len(bindings) != 1 or not isinstance(bindings[0], ast.Call):
                continue
            call = bindings[0]
            path = self.bindings.cuda_path(call.func)
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
            value = self.bindings.value_of(node.id)
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
