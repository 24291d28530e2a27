"""How the backward writes each ``In`` tensor's gradient: plain stores where the source
proves every element is the thread's own, ``cuda.atomic.add`` where threads may share.

Each read of a floating-point ``In`` tensor (a :class:`~pnex_magic.adjoint.ir.Load`)
adds its adjoint into a register (an :class:`Accumulator`); where the register is
written out decides the cost:

* **store** (no atomics, no memset): the gradient tensor is written with plain stores,
  and every element exactly once.  The proof, from the checked pass's index analysis
  (:mod:`pnex_magic.checking`: bindings, tensor sizes, guard facts):

  - the reads sit in an *exact* region: the kernel's body, the body of an ``if``
    whose test is exactly a conjunction of bounds on grid coordinates
    (``if b < x.shape[0] and s < S:``, or after ``if i >= n: return``), or a loop
    ``for k in range(size)`` in such a region.  Every thread whose coordinates satisfy
    the bounds runs the region once (each trip, for a loop), whatever the data;
  - each axis of each read's index is a grid coordinate ``g`` (bound once from
    ``cuda.grid``), ``c * S + g`` with ``g < S`` (a constant ``c``), or the loop's
    variable; every grid axis of the launch appears, and every loop around the
    register's region, so no two threads (nor two trips) reach the same element;
  - reads whose indices differ do so by ``c`` on one axis: disjoint ranges;
  - together they cover the tensor: every other axis runs over its whole size (the
    bound is the axis's size and ``n_threads`` launches it all, or the loop is over
    it); on the one axis that may not, the elements no read reaches are written with
    zeros by the same threads (a stride loop over the rest of the axis).

  The register is zeroed where the region's reverse pass starts and stored where it
  ends, whether or not a data-dependent branch inside read the element (a zero then).

* **gather** (no atomics, no memset): every read's index is the thread's coordinates
  plus constant offsets (``u[i - 1, j]``: a stencil), in one exact region outside any
  loop, and the coordinates' bounds cover the tensor.  Each thread then *recomputes*
  what its neighbours' reverse passes add to its element (the kernel's body again with
  the coordinates shifted by each offset: the neighbour at ``(i + 1, j)`` reads
  ``u[i, j]`` as its ``u[i - 1, j]``) and stores the sum with its own.  A neighbour
  outside the region adds nothing, as it read nothing.

* **atomic**: anything else (a vector every row reads, an index from data).  The
  gradient is created zeroed (``Out(..., init=0)``), and each block of statements that
  reads an element adds its register once, with ``cuda.atomic.add``, at the end of the
  block's reverse pass.  numba-cuda has no atomic add for float16/bfloat16: those
  gradients are accumulated in a float32 tensor that autograd casts back.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping, Sequence

from ..checking.bindings import Element
from ..checking.guards import NEGATED, plus_constant
from ..checking.index_ranges import IndexRanges
from ..checking.sizes import DimKey, tensor_dims
from ..expressions import Const, Numel, ScalarRef, Size
from ..spec import KernelSpec, TensorParam
from .ir import Block, For, If, Load, statements
from .values import grad_name

__all__ = ["Accumulator", "Fill", "GradPlan", "plan_gradients"]


@dataclasses.dataclass(frozen=True)
class Fill:
    """Elements of a store-mode gradient no read reaches, written with zeros: on axis
    ``axis``, the index ``start`` (``step`` ``None``: that one element, if in bounds) or
    ``start``, ``start + step``, ... up to the axis's size; ``index`` the other axes'."""

    axis: int
    start: str
    step: str | None
    index: tuple[str, ...]


@dataclasses.dataclass
class Accumulator:
    """A register holding the adjoint of one tensor's element, and where it is written."""

    name: str
    tensor: str
    index: tuple[str, ...]  #: code of the element's index
    index_reads: frozenset[str]
    ty: str  #: "f32" or "f64"
    home: Block  #: zeroed where its reverse pass starts, written where it ends
    mode: str  #: "store", "atomic" or "gather"
    fills: tuple[Fill, ...] = ()  #: (store mode) the elements no read reaches
    gathered: str = ""  #: (gather mode) what other threads' reads of this element add
    #: (gather mode) per read (by ``id``): the offset of its index from the thread's
    #: coordinates, as ``((coordinate, d), ...)``
    offsets: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GradPlan:
    """How ``grad_<tensor>`` is made: ``mode`` "store", "atomic" or "zero" (no read of the
    tensor carries a gradient); ``dtype`` its element type; ``init`` 0 or ``None``."""

    tensor: str
    mode: str
    dtype: str
    init: int | None


@dataclasses.dataclass(frozen=True)
class _Component:
    kind: str  # "coord" or "loop"
    axis: object  # the grid axis (coord) or the For (loop)
    c: int = 0  # c * S + g
    key: DimKey | None = None  # the size S (coord: the bound's) or the loop's stop
    bound: str = ""  # code of that size
    var: str = ""  # the coordinate's or loop variable's name
    reads: frozenset = frozenset()  # SSA values the size's code reads


def _expr_key(expr, dims: Mapping[str, tuple]) -> DimKey:
    if isinstance(expr, Size):
        return dims[expr.param][expr.axis % max(len(dims[expr.param]), 1)]
    if isinstance(expr, Numel) and len(dims.get(expr.param, ())) == 1:
        return dims[expr.param][0]
    if isinstance(expr, ScalarRef):
        return ("scalar", expr.param)
    if isinstance(expr, Const):
        return ("const", expr.value)
    return ("expr", str(expr))


class _Analysis:
    def __init__(self, spec: KernelSpec, ranges: IndexRanges, render, root: Block, proven: set[tuple[int, int]]):
        self.spec = spec
        self.ranges = ranges
        self.dims = tensor_dims(spec)
        self.render = render  # an AST expression -> (its code in the backward, SSA values it reads), or None
        self.proven = proven  # (line, column) of the subscripts the source proves in bounds
        self.launched = [_expr_key(e, self.dims) for e in spec.n_threads]
        #: the grid axes launched with more than one thread: a register's index must use each
        self.varying = {a for a, e in enumerate(spec.n_threads) if not (isinstance(e, Const) and e.value == 1)}
        self.coords = self._coordinates()
        self.defined = _definitions(root)
        self._exact: dict[int, dict | None] = {}

    def _coordinates(self) -> dict[str, int]:
        """Names bound once, to ``cuda.grid`` (or an entry of it): their grid axis."""
        found = {}
        for name, bound in self.ranges.bindings.of.items():
            if len(bound) != 1:
                continue
            b = bound[0]
            if isinstance(b, Element) and self.ranges.intervals.cuda_call(b.source) == "grid":
                found[name] = b.k
            elif isinstance(b, ast.Call) and self.ranges.intervals.cuda_call(b) == "grid" \
                    and isinstance(b.args[0], ast.Constant) and b.args[0].value == 1:
                found[name] = 0
        return found

    def available(self, names, home: Block) -> bool:
        """Whether every SSA value in ``names`` is defined where ``home``'s reverse pass ends."""
        ancestors = {id(b) for b in home.ancestors()}
        return all(id(self.defined.get(n)) in ancestors for n in names)

    # ------------------------------------------------------------------ exact regions
    def exact(self, block: Block) -> dict | None:
        """The bounds that hold in ``block`` when it is exact (``{coordinate: (key, code)}``),
        else ``None``."""
        if id(block) in self._exact:
            return self._exact[id(block)]
        found: dict | None = None
        if block.kind == "function":
            found = {}
        else:
            outer = self.exact(block.parent)
            owner = block.owner
            if outer is not None and isinstance(owner, If) and isinstance(owner.node, ast.If):
                bounds = self._bounds(owner.node.test, negated=block.kind == "orelse")
                if bounds is not None:
                    found = dict(outer)
                    for g, bound in bounds.items():
                        if g in found and found[g][0] != bound[0]:
                            found[g] = (None, "", frozenset())  # two different bounds: unusable
                        else:
                            found[g] = bound
            elif outer is not None and isinstance(owner, For) and self._full_loop(owner) is not None:
                found = dict(outer)
        self._exact[id(block)] = found
        return found

    def _full_loop(self, loop: For) -> tuple[DimKey, str] | None:
        """``(key, code)`` of ``stop`` for ``for k in range(stop)`` over a size, step 1."""
        node = loop.node
        if loop.step != 1 or loop.start.text != "0" or not isinstance(node, ast.For) or len(node.iter.args) > 2:
            return None
        key = self.ranges.sizes.dim_of(node.iter.args[-1])
        if key is None or len(self.ranges.bindings.of.get(node.target.id, [])) != 1:
            return None
        return key, loop.stop.text

    def _bounds(self, test: ast.expr, negated: bool) -> dict | None:
        """Bounds on coordinates that ``test`` (``negated``: its negation) is exactly."""
        joiner = ast.Or if negated else ast.And
        if isinstance(test, ast.BoolOp):
            if not isinstance(test.op, joiner):
                return None
            out: dict = {}
            for v in test.values:
                part = self._bounds(v, negated)
                if part is None or set(part) & set(out):
                    return None
                out.update(part)
            return out
        if not isinstance(test, ast.Compare):
            return None
        out = {}
        operands = [test.left, *test.comparators]
        for left, op, right in zip(operands, test.ops, operands[1:]):
            if negated:
                if len(test.ops) != 1:
                    return None
                negation = NEGATED.get(type(op))
                if negation is None:
                    return None
                op = negation()
            if isinstance(op, ast.Gt):
                left, right, op = right, left, ast.Lt()
            elif isinstance(op, ast.GtE):
                left, right, op = right, left, ast.LtE()
            if isinstance(op, ast.LtE) and isinstance(left, ast.Constant) and left.value == 0 \
                    and isinstance(right, ast.Name) and right.id in self.coords:
                continue  # 0 <= g: always true of a grid coordinate
            if not (isinstance(op, ast.Lt) and isinstance(left, ast.Name) and left.id in self.coords):
                return None
            key = self.ranges.sizes.dim_of(right)
            code = self.render(right)
            if key is None or code is None or left.id in out:
                return None
            out[left.id] = (key, code[0], code[1])
        return out

    # ------------------------------------------------------------------ one read
    def home(self, load: Load) -> tuple[Block, tuple[_Component, ...]] | None:
        """Where a store-mode register of ``load`` lives, and its index's components."""
        home = next((b for b in load.scope.ancestors() if self.exact(b) is not None), None)
        node = load.node
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        while True:
            facts = self.exact(home)
            loops = {b.owner.node.target.id: b.owner for b in home.ancestors() if b.kind == "loop"}
            comps = [self._component(p, facts, loops) for p in parts]
            if any(c is None for c in comps):
                return None
            used = {c.var for c in comps}
            if home.kind == "loop" and home.owner.node.target.id not in used:
                home = home.parent  # every trip reads the same element: one register for the loop
                continue
            if len(used) != len(comps) or not set(loops) <= used:
                return None
            axes = [c.axis for c in comps if c.kind == "coord"]
            if len(set(axes)) != len(axes) or not self.varying <= set(axes):
                return None
            needed = set(load.index_reads).union(*(c.reads for c in comps))
            if not self.available(needed, home):
                return None
            return home, tuple(comps)

    def _component(self, part: ast.expr, facts: dict, loops: dict) -> _Component | None:
        if isinstance(part, ast.Name):
            if part.id in loops:
                full = self._full_loop(loops[part.id])
                if full is None:
                    return None
                return _Component("loop", id(loops[part.id]), 0, full[0], full[1], part.id, loops[part.id].stop.reads)
            return self._coord(part.id, 0, None, facts)
        if isinstance(part, ast.BinOp) and isinstance(part.op, ast.Add):
            for g, other in ((part.left, part.right), (part.right, part.left)):
                if isinstance(g, ast.Name) and g.id in self.coords:
                    c, size = _multiple(other)
                    key = None if size is None else self.ranges.sizes.dim_of(size)
                    if key is not None:  # c * S + g with S a size: else (g + 1, ...) nothing is proven
                        return self._coord(g.id, c, key, facts)
        return None

    def _coord(self, g: str, c: int, key: DimKey | None, facts: dict) -> _Component | None:
        if g not in self.coords or g not in facts:
            return None
        bound_key, code, reads = facts[g]
        if bound_key is None or (key is not None and key != bound_key):
            return None
        return _Component("coord", self.coords[g], c, bound_key, code, g, reads)

    # ------------------------------------------------------------------ one tensor
    def store_plan(self, tensor: TensorParam, loads: Sequence[Load]) -> dict | None:
        """``{id(load): (home, pattern)}`` and the fills when ``tensor``'s gradient can be
        written with plain stores (see the module's docstring), else ``None``."""
        found = {}
        for load in loads:
            where = self.home(load)
            if where is None:
                return None
            found[id(load)] = where
        homes = {id(h) for h, _ in found.values()}
        if len(homes) != 1:
            return None
        patterns = sorted({p for _, p in found.values()}, key=lambda p: [c.c for c in p])
        sizes = self.dims[tensor.name]
        non_full = [j for j in range(tensor.ndim) if not all(self._full(p[j], sizes[j]) for p in patterns)]
        for j in range(tensor.ndim):
            if j not in non_full and len({(p[j].kind, p[j].axis, p[j].c) for p in patterns}) != 1:
                return None
        if len(non_full) > 1:
            return None
        fills: list[Fill] = []
        if non_full:
            j = non_full[0]
            comps = [p[j] for p in patterns]
            first = comps[0]
            if any(c.kind != "coord" or c.axis != first.axis or c.key != first.key for c in comps):
                return None
            if self.launched[first.axis] != first.key:
                return None
            taken = {c.c for c in comps}
            top = max(taken) + 1
            base = patterns[0]
            for c in range(top + 1):
                if c in taken:
                    continue
                start = f"{c} * {first.bound} + {first.var}" if c else first.var
                fills.append(Fill(j, start, first.bound if c == top else None,
                                  tuple(base[k].var for k in range(tensor.ndim))))
        return {"homes": found, "fills": tuple(fills)}

    def gather_plan(self, tensor: TensorParam, loads: Sequence[Load], every_load: Sequence[Load]) -> dict | None:
        """``{"home", "index", "offsets"}`` when ``tensor``'s gradient can be gathered (see the
        module's docstring), else ``None``."""
        homes, offsets = set(), {}
        sizes = self.dims[tensor.name]
        # Each read proven in bounds where it is: one at a negative index (u[i - 1] at i = 0,
        # a periodic stencil) reads the last element, as Numba wraps it around, and the
        # thread whose copy would gather its gradient (at i = n) does not exist.
        if any((ld.node.lineno, ld.node.col_offset) not in self.proven for ld in loads):
            return None
        coords: list[str] = []
        home = None
        for load in loads:
            home = next((b for b in load.scope.ancestors() if self.exact(b) is not None), None)
            if home is None or any(b.kind == "loop" for b in home.ancestors()):
                return None
            facts = self.exact(home)
            node = load.node
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            found = []
            for j, part in enumerate(parts):
                g, d = _offset(part)
                if g is None or g not in self.coords or g not in facts:
                    return None
                key = facts[g][0]
                if key != sizes[j] or self.launched[self.coords[g]] != key:
                    return None
                found.append((g, d))
            axes = [self.coords[g] for g, _ in found]
            if len(set(axes)) != len(axes) or not self.varying <= set(axes):
                return None
            if not self.available({g for g, _ in found}, home):
                return None
            coords = coords or [g for g, _ in found]
            if [g for g, _ in found] != coords:
                return None
            homes.add(id(home))
            offsets[id(load)] = tuple((g, d) for g, d in found if d)
        if len(homes) != 1 or not any(offsets.values()):
            return None
        if any(id(home) not in {id(b) for b in ld.scope.ancestors()} for ld in every_load):
            return None  # a neighbour's replay would read outside the region
        return {"home": home, "index": tuple(coords), "offsets": offsets}

    def _full(self, comp: _Component, size: DimKey) -> bool:
        if comp.kind == "loop":
            return comp.key == size
        return comp.c == 0 and comp.key == size and self.launched[comp.axis] == size


def _definitions(root: Block) -> dict[str, Block]:
    """The block each SSA value is defined in (a loop's variable: its body)."""
    found: dict[str, Block] = {}
    for block, stmt in statements(root):
        for name in stmt.defines():
            found[name] = block
        if isinstance(stmt, For):
            found[stmt.target] = stmt.body
    return found


def _offset(node: ast.expr) -> tuple[str | None, int]:
    """``(g, d)`` for ``g``, ``g + d``, ``d + g`` or ``g - d`` (``d`` an int constant)."""
    base, d = plus_constant(node)
    return (base.id, d) if isinstance(base, ast.Name) else (None, 0)


def _multiple(node: ast.expr) -> tuple[int, ast.expr | None]:
    """``(c, S)`` for ``S``, ``c * S`` or ``S * c`` (``c`` a positive int constant)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for c, s in ((node.left, node.right), (node.right, node.left)):
            if isinstance(c, ast.Constant) and type(c.value) is int and c.value > 0:
                return c.value, s
        return 0, None
    return 1, node


def plan_gradients(spec: KernelSpec, root: Block, loads: Sequence[Load], ranges: IndexRanges, names, render,
                   atomic_only: bool = False, proven: set[tuple[int, int]] | None = None,
                   ) -> tuple[dict[int, Accumulator], list[GradPlan]]:
    """Each load's accumulator (by ``id``) and each floating-point ``In`` tensor's gradient
    plan.  ``render`` writes a size expression of the forward as the backward's code.
    ``atomic_only``: no store-mode proof (for tests that compare the two).  ``proven``:
    ``(line, column)`` of the subscripts the source proves in bounds
    (:func:`~pnex_magic.checking.rewrite.proven_subscripts`; a gather needs every read so)."""
    analysis = _Analysis(spec, ranges, render, root, proven or set())
    accumulators: dict[int, Accumulator] = {}
    plans: list[GradPlan] = []
    for tensor in spec.arguments:
        if not (isinstance(tensor, TensorParam) and tensor.role == "in" and tensor.dtype.is_floating_point):
            continue
        mine = [ld for ld in loads if ld.tensor == tensor.name]
        half = tensor.dtype.name in ("float16", "bfloat16")
        ty = "f64" if tensor.dtype.name == "float64" else "f32"
        store = None if atomic_only or not mine else analysis.store_plan(tensor, mine)
        if not mine:
            plans.append(GradPlan(tensor.name, "zero", tensor.dtype.name, 0))
            continue
        if store is not None:
            plans.append(GradPlan(tensor.name, "store", tensor.dtype.name, None))
            by_pattern: dict = {}
            for load in mine:
                home, pattern = store["homes"][id(load)]
                acc = by_pattern.get(pattern)
                if acc is None:
                    acc = Accumulator(names.fresh(f"adj_{grad_name(tensor.name)}"), tensor.name, load.index,
                                      load.index_reads, ty, home, "store")
                    by_pattern[pattern] = acc
                accumulators[id(load)] = acc
            first = next(iter(by_pattern.values()))
            first.fills = store["fills"]
            continue
        gather = None if atomic_only else analysis.gather_plan(tensor, mine, loads)
        if gather is not None:
            plans.append(GradPlan(tensor.name, "gather", tensor.dtype.name, None))
            acc = Accumulator(names.fresh(f"adj_{grad_name(tensor.name)}"), tensor.name, gather["index"],
                              frozenset(gather["index"]), ty, gather["home"], "gather",
                              gathered=names.fresh(f"gathered_{grad_name(tensor.name)}"), offsets=gather["offsets"])
            for load in mine:
                accumulators[id(load)] = acc
            continue
        plans.append(GradPlan(tensor.name, "atomic", "float32" if half else tensor.dtype.name, 0))
        by_key: dict = {}
        for load in mine:
            key = (id(load.scope), load.index)
            acc = by_key.get(key)
            if acc is None:
                acc = Accumulator(names.fresh(f"adj_{grad_name(tensor.name)}"), tensor.name, load.index,
                                  load.index_reads, ty, load.scope, "atomic")
                by_key[key] = acc
            accumulators[id(load)] = acc
    return accumulators, plans
