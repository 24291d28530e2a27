"""Index ranges a kernel's source proves: which array accesses can never be out of
bounds, so that its checked variant (:mod:`pnex_magic.checking`) need not test them.

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
* with constant offsets: ``i + d`` is below the size where a guard says ``i + k < s``
  with ``k >= d`` (``i < n - 1`` is ``i + 1 < n``; ``i + 2 <= n`` is ``i + 1 < n``), and
  non-negative where a guard says ``i >= c`` with ``c + d >= 0`` (``0 < i`` is ``i >= 1``,
  so a stencil's ``u[i - 1]`` and ``u[i + 1]`` under ``if 0 < i < n - 1`` are proven);
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
from collections.abc import Mapping, Sequence
from typing import Any

from .bindings import Bindings
from .guards import Fact, Guards
from .intervals import Interval, Intervals
from .sizes import DimKey, TensorSizes

__all__ = ["IndexRanges", "Interval", "Fact"]


class IndexRanges:
    """What the source of kernel ``fdef`` (its ``def``, as parsed) proves about its
    indices.  ``namespace`` holds its globals and closure values; ``blocks`` the block
    shapes it may be launched with (``None``: any the hardware allows); ``dims`` its
    tensor parameters' size keys (:func:`~pnex_magic.checking.sizes.tensor_dims`;
    ``None``: every tensor axis its own size, no tensor access proven).

    The work is done by four parts, each its own module: :class:`Bindings` (what each
    name is bound to), :class:`TensorSizes` (which expressions are sizes),
    :class:`Intervals` (intervals and magnitudes) and :class:`Guards` (guard facts).
    """

    def __init__(self, fdef: ast.FunctionDef, namespace: Mapping[str, Any],
                 blocks: Sequence[Sequence[int]] | None = None,
                 dims: Mapping[str, tuple[DimKey, ...]] | None = None):
        self.bindings = Bindings(fdef, namespace)
        self.sizes = TensorSizes(self.bindings, dims)
        self.intervals = Intervals(self.bindings, self.sizes, blocks)
        self.guards = Guards(self.bindings, self.sizes, self.intervals)
        self.arrays = self.intervals.on_chip_arrays()

    def interval(self, node: ast.expr) -> Interval | None:
        """The values ``node`` can take, or ``None`` when not known (:meth:`Intervals.interval`)."""
        return self.intervals.interval(node)

    def facts(self, test: ast.expr) -> list[Fact]:
        """What ``test`` being true establishes (:meth:`Guards.facts`)."""
        return self.guards.facts(test)

    def exit_facts(self, test: ast.expr) -> list[Fact]:
        """What ``test`` being false establishes: the facts after ``if test: return``."""
        return self.guards.exit_facts(test)

    def loop_facts(self, loop: ast.For) -> list[Fact]:
        """What holds in the body of ``for i in range(...)`` (:meth:`Guards.loop_facts`)."""
        return self.guards.loop_facts(loop)

    def in_bounds(self, node: ast.Subscript, facts: Sequence[Fact] = ()) -> bool:
        """Whether subscript ``node`` indexes an on-chip array of constant shape, or a
        tensor parameter, with one integer per axis, each proven in range; ``facts``
        are the guards' facts that hold where it is."""
        if not isinstance(node.value, ast.Name):
            return False
        name = node.value.id
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        shape = self.arrays.get(name)
        if shape is None:
            return self.guards.tensor_in_bounds(name, parts, facts)
        if len(parts) != len(shape):
            return False
        for part, n in zip(parts, shape):
            v = self.interval(part)
            if v is None or v.hi >= n:
                return False
        return True
