"""Index ranges a kernel's source proves: which array accesses can never be out of
bounds, so that its checked variant (:mod:`pnex_magic.checked`) need not test them.

A bounds check the compiler cannot remove costs more than its compare: its cold
recording block sits in the loop body, and NVVM then declines to unroll the loop.
The diffusion stencil's checked variant issued 5 shared-memory loads per loop trip
where the fast one issued all 20 unrolled, and ran 1.8x slower.  A kernel's accesses
are mostly provably safe: a tile indexed by the thread's coordinates, a tensor indexed
under ``if i < x.shape[0]``.  With them proven here, the checked variants of pnex's
benchmark kernels (``a*b+c``, the diffusion stencil, k-means) compile to the fast
variants' SASS, instruction for instruction (``benchmarks/checked_overhead.py``).

Two proofs, both sound by construction and deliberately small.

**Intervals** (on-chip arrays: a ``cuda.shared.array`` or ``cuda.local.array`` of
constant shape):

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

**Guards** (tensor parameters, whose sizes are known only at run time):

* an index ``i`` is below axis ``k``'s size where a guard says ``i < s`` and ``s`` is
  that size: ``x.shape[k]``, ``len(x)``, a name bound only to it (``n = x.shape[0]``,
  ``rows, cols = x.shape``), or a scalar parameter that sizes the axis
  (``Out("f32", ("n",))``).  Axes of different tensors are the same size when the op's
  shape declarations make them so (``Out("f32", "a")``, ``In("f32", ("a.size(0)",))``),
  which the op checks at every call (:func:`tensor_dims`);
* guards are the test of an ``if`` (in its body) or of ``a if test else b`` (in ``a``),
  ``and`` of them, ``not``, chained ``0 <= i < n``, and a flag assigned such a test once
  in the function's own body (``inside = 0 <= r < rows``, then ``if inside``) about names
  also assigned once there, before it; after ``if test: return`` (or
  ``continue``, ``break``, ``raise``) without ``else``, the test's negation holds for
  the rest of the block (``if i >= n or i < 0: return``); ``for i in range(start, s,
  step)`` gives ``i < s`` in its body when the step is positive;
* a fact about ``i`` holds only where nothing rebinds ``i``: none of its region (the
  body, the rest of the block, the test itself) binds the name;
* ``i`` is non-negative when a guard says so (``0 <= i``) or when its magnitude is
  known: built from intervals, sizes (below 2**48: no memory holds more), ``cuda.grid``
  (below 2**41) and ``range`` loops over those, by ``+ * // % & >>``, never over 2**62,
  so no int64 arithmetic overflows on the way.

An access (a load, a store, or a ``cuda.atomic`` operation's index) is proven when it
indexes such an array by its name with one integer per axis, each proven to lie in
``[0, n)`` for that axis's length ``n``: a shared-memory histogram's
``cuda.atomic.add(bins, x[i] % 64, 1)`` is, and ``out[i] = a[i]`` under
``if i < a.shape[0]`` with ``i = cuda.grid(1)`` is.  Anything else is left to the
run-time check.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
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


class _Param:
    """The binding of a kernel parameter."""


_PARAM = _Param()


@dataclasses.dataclass(frozen=True)
class _Range:
    """The binding of a ``for`` target over ``range(*args)``."""

    args: tuple[ast.expr, ...]


@dataclasses.dataclass(frozen=True)
class _Element:
    """Entry ``k`` of a tuple that is not written out: ``rows, cols = u.shape``,
    ``i, j = cuda.grid(2)``."""

    source: ast.expr
    k: int


#: A tensor axis's size, canonical: ``("free", param, axis)`` for an axis declared
#: ``None``, ``("const", n)``, ``("scalar", name)`` for a scalar parameter, or
#: ``("expr", text)`` for any other shape expression.  Two axes with the same key
#: have the same size in every launch: the op checks (inputs) or makes (outputs) it.
DimKey = tuple


@dataclasses.dataclass(frozen=True)
class Fact:
    """What a guard establishes for a local name: ``name < size`` (``kind`` "lt",
    ``dim`` the size's key) or ``name >= 0`` (``kind`` "ge0")."""

    name: str
    kind: str
    dim: DimKey | None = None


_NEGATED = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt}

#: Sizes of a tensor's axes are below 2**48 (no memory holds more elements): the bound
#: :meth:`IndexRanges.magnitude` assumes for a size it cannot bound otherwise.
_SIZE_BITS = 48
#: ``cuda.grid``: blockIdx < 2**31 times blockDim <= 1024, plus threadIdx.
_GRID_BITS = 41


def tensor_dims(spec: Any) -> dict[str, tuple[DimKey, ...]]:
    """Each tensor parameter of ``spec`` (a :class:`~pnex_magic.spec.KernelSpec`) and
    the keys (:data:`DimKey`) of its axes' sizes."""
    from .expressions import Const, ScalarRef, Size

    tensors = {p.name: p for p in spec.params if hasattr(p, "shape") and hasattr(p, "dtype")}
    keys: dict[tuple[str, int], DimKey] = {}

    def key(name: str, axis: int, seen: frozenset = frozenset()) -> DimKey:
        param = tensors[name]
        axis %= max(param.ndim, 1)
        if (name, axis) in keys:
            return keys[(name, axis)]
        expr = param.shape[axis]
        if expr is None or (name, axis) in seen:
            found: DimKey = ("free", name, axis)
        elif isinstance(expr, Const):
            found = ("const", expr.value)
        elif isinstance(expr, Size) and expr.param in tensors:
            found = key(expr.param, expr.axis, seen | {(name, axis)})
        elif isinstance(expr, ScalarRef):
            found = ("scalar", expr.param)
        else:
            found = ("expr", str(expr))
        keys[(name, axis)] = found
        return found

    return {name: tuple(key(name, k) for k in range(p.ndim)) for name, p in tensors.items()}


def _range_call(node: ast.expr) -> tuple[ast.expr, ...] | None:
    """The arguments of a call written ``range(...)`` (1 to 3, positional, none starred);
    whether ``range`` is the builtin there is :meth:`IndexRanges._range`'s to say."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and not node.keywords and 1 <= len(node.args) <= 3
            and not any(isinstance(a, ast.Starred) for a in node.args)):
        return tuple(node.args)
    return None


def bound_names(nodes: Iterable[ast.AST]) -> set[str]:
    """Every name a statement or expression among ``nodes`` (or inside them) binds."""
    names: set[str] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                names.update(node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
    return names


class IndexRanges:
    """What the source of kernel ``fdef`` (its ``def``, as parsed) proves about its
    indices.  ``namespace`` holds its globals and closure values; ``blocks`` the block
    shapes it may be launched with (``None``: any the hardware allows)."""

    def __init__(self, fdef: ast.FunctionDef, namespace: Mapping[str, Any],
                 blocks: Sequence[Sequence[int]] | None = None,
                 dims: Mapping[str, tuple[DimKey, ...]] | None = None):
        self.namespace = namespace
        self.block = self._block_bounds(blocks)
        self.bindings: dict[str, list[Any]] = {}
        self._cache: dict[str, Interval | None] = {}
        self._active: set[str] = set()
        self._bits: dict[str, int | None] = {}
        self._collect(fdef)
        # Names assigned by a plain statement of the function's own body (not inside a loop
        # or a branch: run once, in order), and that statement's position.
        self._top: dict[str, int] = {}
        for k, stmt in enumerate(fdef.body):
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    for t in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                        if isinstance(t, ast.Name):
                            self._top.setdefault(t.id, k)
        self.arrays = self._on_chip_arrays()
        # Tensor parameters (never rebound) and their axes' size keys.
        self.dims = {n: d for n, d in (dims or {}).items() if self._is_param(n)}

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
            starred = any(isinstance(t, ast.Starred) for t in target.elts)
            literal = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            for k, t in enumerate(target.elts):
                if starred or value is None:
                    item = None
                elif literal:
                    item = value.elts[k]
                else:
                    item = _Element(value, k)
                if isinstance(item, _Element) and isinstance(t, ast.Name):
                    self._bind(t.id, item)
                    understood.add(id(t))
                else:
                    self._bind_target(t, item, understood)
        # a subscript or attribute target binds no name

    def _collect(self, fdef: ast.FunctionDef) -> None:
        understood: set[int] = set()
        args = fdef.args
        positional = args.posonlyargs + args.args
        own = [a for a in positional + args.kwonlyargs + [args.vararg, args.kwarg] if a is not None]
        for a in own:
            self._bind(a.arg, _PARAM if a in positional else _UNKNOWN)
        own_ids = {id(a) for a in own}
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
                range_args = _range_call(node.iter)
                self._bind(node.target.id, _Range(range_args) if range_args is not None else _UNKNOWN)
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
            elif isinstance(node, ast.arg) and id(node) not in own_ids:  # a nested function's or lambda's parameter
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

    def _over_bindings(self, name: str, cache: dict[str, Any], of_binding: Callable[[Any], Any],
                       join: Callable[[Any, Any], Any]) -> Any:
        """``of_binding`` of every binding of local ``name``, joined, memoised in ``cache``;
        ``None`` when one of them is, or when the name depends on itself."""
        if name in cache:
            return cache[name]
        if name in self._active:  # depends on itself
            return None
        self._active.add(name)
        result = None
        try:
            for k, binding in enumerate(self.bindings[name]):
                value = of_binding(binding)
                if value is None:
                    result = None
                    break
                result = value if k == 0 else join(result, value)
        finally:
            self._active.discard(name)
        cache[name] = result
        return result

    def _name(self, name: str) -> Interval | None:
        if name not in self.bindings:
            value = self._global(name)
            return _known(int(value), int(value)) if isinstance(value, int) else None
        return self._over_bindings(name, self._cache, self._binding, Interval.__or__)

    def _binding(self, binding: Any) -> Interval | None:
        if isinstance(binding, (_Unknown, _Param, _Element)) or binding is None:
            return None
        if isinstance(binding, _Range):
            bounds = self._range(binding.args)
            values = [self.interval(a) for a in binding.args]  # the step's too
            if bounds is None or None in values:
                return None
            start, stop = bounds
            return _known(0 if start is None else self.interval(start).lo, self.interval(stop).hi - 1)
        return self.interval(binding)

    def _range(self, args: tuple[ast.expr, ...]) -> tuple[ast.expr | None, ast.expr] | None:
        """``(start, stop)`` of ``range(*args)`` (``start`` ``None`` for 0) when ``range`` is
        the builtin and the step is positive, so that ``start <= i < stop``."""
        if self._global_builtin("range") is not range or (len(args) == 3 and not self._positive(args[2])):
            return None
        return (None, args[0]) if len(args) == 1 else (args[0], args[1])

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

    # ------------------------------------------------------------------ tensor sizes
    def _is_param(self, name: str) -> bool:
        """A parameter of the kernel that the body never rebinds."""
        return self.bindings.get(name) == [_PARAM]

    def _shape_of(self, node: ast.expr) -> str | None:
        """``x`` for ``x.shape`` of a tensor parameter ``x``."""
        if (isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name)
                and node.value.id in self.dims):
            return node.value.id
        return None

    def dim_of(self, node: ast.expr) -> DimKey | None:
        """The size key of ``node`` when it is a tensor parameter's size: ``x.shape[k]``,
        ``len(x)``, a scalar parameter that sizes an axis, or a name every binding of
        which is one of these with the same key."""
        if isinstance(node, ast.Subscript):
            x = self._shape_of(node.value)
            if x is not None and isinstance(node.slice, ast.Constant) and type(node.slice.value) is int:
                k = node.slice.value
                if -len(self.dims[x]) <= k < len(self.dims[x]):
                    return self.dims[x][k]
            return None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 and not node.keywords:
            arg = node.args[0]
            if (self._global_builtin(node.func.id) is len and isinstance(arg, ast.Name) and arg.id in self.dims
                    and self.dims[arg.id]):
                return self.dims[arg.id][0]
            return None
        if isinstance(node, ast.Name):
            bindings = self.bindings.get(node.id)
            if bindings == [_PARAM]:
                return ("scalar", node.id)
            if not bindings:
                return None
            keys = set()
            for b in bindings:
                if isinstance(b, _Element):
                    x = self._shape_of(b.source)
                    key = self.dims[x][b.k] if x is not None and b.k < len(self.dims[x]) else None
                elif isinstance(b, ast.expr) and not (isinstance(b, ast.Name) and b.id == node.id):
                    key = self.dim_of(b)
                else:
                    key = None
                if key is None:
                    return None
                keys.add(key)
            return keys.pop() if len(keys) == 1 else None
        return None

    def _cuda_call(self, node: ast.expr) -> str | None:
        """``"grid"`` / ``"gridsize"`` for ``cuda.grid(n)`` / ``cuda.gridsize(n)``."""
        if isinstance(node, ast.Call) and not node.keywords and len(node.args) == 1:
            path = self._cuda_path(node.func)
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
        if self.dim_of(node) is not None and not isinstance(node, ast.Name):
            return _SIZE_BITS
        if self._cuda_call(node) is not None:
            return _GRID_BITS
        if isinstance(node, ast.Name):
            return self._name_bits(node.id)
        if isinstance(node, ast.Attribute):
            return None
        if isinstance(node, ast.IfExp):
            a, b = self.magnitude(node.body), self.magnitude(node.orelse)
            return None if a is None or b is None else max(a, b)
        if isinstance(node, ast.BinOp):
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
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args and not node.keywords:
            func = self._global_builtin(node.func.id)
            bits = [self.magnitude(a) for a in node.args]
            if func in (min, max) and len(bits) > 1 and all(b is not None for b in bits):
                return max(bits)
        return None

    def _name_bits(self, name: str) -> int | None:
        if name not in self.bindings:
            return None
        return self._over_bindings(name, self._bits, self._binding_bits, max)

    def _binding_bits(self, binding: Any) -> int | None:
        if isinstance(binding, _Element):
            if self._shape_of(binding.source) is not None:
                return _SIZE_BITS
            if self._cuda_call(binding.source) is not None:
                return _GRID_BITS
            return None
        if isinstance(binding, _Range):  # start <= i < stop
            bounds = self._range(binding.args)
            if bounds is None:
                return None
            bits = [self.magnitude(a) for a in bounds if a is not None]
            return None if None in bits else max(bits)
        if isinstance(binding, ast.expr):
            return self.magnitude(binding)
        return None

    def _positive(self, node: ast.expr) -> bool:
        """Whether ``node`` is at least 1 (a range's step)."""
        known = self.interval(node)
        return (known is not None and known.lo >= 1) or self._cuda_call(node) == "gridsize"

    # ------------------------------------------------------------------ guards
    def facts(self, test: ast.expr) -> list[Fact]:
        """What ``test`` being true establishes (``a and b``: both; ``0 <= i < n``: each)."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return [f for v in test.values for f in self.facts(v)]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.exit_facts(test.operand)
        if isinstance(test, ast.Name):
            return self._flag_facts(test.id)
        if not isinstance(test, ast.Compare):
            return []
        found: list[Fact] = []
        operands = [test.left, *test.comparators]
        for left, op, right in zip(operands, test.ops, operands[1:]):
            if isinstance(op, (ast.Gt, ast.GtE)):  # b > a is a < b
                left, right, op = right, left, ast.Lt() if isinstance(op, ast.Gt) else ast.LtE()
            if not isinstance(op, (ast.Lt, ast.LtE)):
                continue
            if isinstance(op, ast.Lt) and isinstance(left, ast.Name):
                dim = self.dim_of(right)
                if dim is not None:
                    found.append(Fact(left.id, "lt", dim))
            if isinstance(right, ast.Name) and isinstance(left, ast.Constant) and type(left.value) is int:
                if left.value >= 0:  # 0 <= i, 0 < i
                    found.append(Fact(right.id, "ge0"))
        return found

    def _once(self, name: str) -> int | None:
        """The position of the one binding of ``name`` when it is a plain statement of the
        function's body (run exactly once), else ``None``."""
        bindings = self.bindings.get(name, [])
        return self._top.get(name) if len(bindings) == 1 and isinstance(bindings[0], ast.expr) else None

    def _flag_facts(self, flag: str) -> list[Fact]:
        """``if inside:`` where ``inside = 0 <= r < rows and ...`` was assigned once: the facts
        of that test, about names themselves assigned once and before it (so still true)."""
        at = self._once(flag)
        if at is None or flag in self._active:
            return []
        self._active.add(flag)
        try:
            facts = self.facts(self.bindings[flag][0])
        finally:
            self._active.discard(flag)
        return [f for f in facts if (self._once(f.name) is not None and self._once(f.name) < at)]

    def exit_facts(self, test: ast.expr) -> list[Fact]:
        """What ``test`` being false establishes: the facts after ``if test: return``."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
            return [f for v in test.values for f in self.exit_facts(v)]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.facts(test.operand)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            negated = _NEGATED.get(type(test.ops[0]))
            if negated is not None:  # not (i >= n) is i < n; not (n <= i) is n > i
                return self.facts(ast.Compare(left=test.left, ops=[negated()], comparators=test.comparators))
        return []

    def loop_facts(self, loop: ast.For) -> list[Fact]:
        """What holds in the body of ``for i in range(...)``: ``i < stop`` when ``stop`` is
        a size and the step positive, ``i >= 0`` when ``start`` is non-negative too."""
        args = _range_call(loop.iter)
        bounds = self._range(args) if args is not None and isinstance(loop.target, ast.Name) else None
        if bounds is None:
            return []
        name, (start, stop) = loop.target.id, bounds
        found = []
        dim = self.dim_of(stop)
        if dim is not None:
            found.append(Fact(name, "lt", dim))
        if start is None or self.magnitude(start) is not None:
            found.append(Fact(name, "ge0"))
        return found

    # ------------------------------------------------------------------ accesses
    def in_bounds(self, node: ast.Subscript, facts: Sequence[Fact] = ()) -> bool:
        """Whether subscript ``node`` indexes an on-chip array of constant shape, or a
        tensor parameter, with one integer per axis, each proven in range; ``facts``
        are the guards' facts that hold where it is."""
        if not isinstance(node.value, ast.Name):
            return False
        name = node.value.id
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        shape = self.arrays.get(name)
        if shape is not None:
            if len(parts) != len(shape):
                return False
            for part, n in zip(parts, shape):
                v = self.interval(part)
                if v is None or v.hi >= n:
                    return False
            return True
        dims = self.dims.get(name)
        if dims is None or len(parts) != len(dims):
            return False
        return all(self._axis_in_bounds(part, dim, facts) for part, dim in zip(parts, dims))

    def _axis_in_bounds(self, part: ast.expr, dim: DimKey, facts: Sequence[Fact]) -> bool:
        subject = part.id if isinstance(part, ast.Name) else None
        if self.magnitude(part) is None and not any(f.name == subject and f.kind == "ge0" for f in facts):
            return False  # maybe negative
        if dim[0] == "const":
            known = self.interval(part)
            if known is not None and known.hi < dim[1]:
                return True
        return any(f.name == subject and f.kind == "lt" and f.dim == dim for f in facts)
