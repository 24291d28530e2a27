"""The tensor-core helpers that are plain Python compiled by Numba: the swizzle, warp and
block reductions, and the block scan (warp shuffles and a shared-memory scratch of one
element per warp).  Their CPU forms are :mod:`pnex_magic.tc.api`'s and
:mod:`pnex_magic.tc.simulate`'s; :func:`register_collectives` gives Numba the CUDA ones."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

from . import api as tc
from .layouts import swizzle_arithmetic

__all__ = ["register_collectives"]


@functools.lru_cache(maxsize=1)
def register_collectives() -> None:
    """Register the CUDA implementations of the helpers with Numba (once)."""
    from numba.cuda.extending import overload

    @overload(tc.swizzle, target="cuda")
    def _swizzle_impl(row, col, row_elems):
        return swizzle_arithmetic

    # A sum and a maximum differ only in how they combine two values: one factory each for
    # the warp's butterfly and the block's fold, given the combine step.  operator.add and the
    # builtin max type and lower as ``a + b`` and ``max(a, b)`` written out (the same code).
    for stub, combine in ((tc.warp_sum, operator.add), (tc.warp_max, max)):
        overload(stub, target="cuda")(_warp_overload(combine))
    for stub, warp, combine in ((tc.block_sum, tc.warp_sum, operator.add), (tc.block_max, tc.warp_max, max)):
        overload(stub, target="cuda")(_block_overload(warp, combine))

    @overload(tc.block_scan_sum, target="cuda")
    def _block_scan_impl(x, scratch):
        from numba import cuda

        def impl(x, scratch):
            lane = cuda.threadIdx.x % 32
            wid = cuda.threadIdx.x // 32
            nwarps = (cuda.blockDim.x + 31) // 32
            v = x
            for d in (1, 2, 4, 8, 16):
                up = cuda.shfl_up_sync(0xFFFFFFFF, v, d)
                if lane >= d:
                    v += up
            if lane == 31:
                scratch[wid] = v
            cuda.syncthreads()
            before = v - v
            for w in range(nwarps):
                if w < wid:
                    before += scratch[w]
            cuda.syncthreads()
            return v + before
        return impl


def _warp_overload(combine: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """The overload of a warp reduction that folds lanes with ``combine``: the xor
    butterfly (16, 8, 4, 2, 1), each lane's value first, in the order and rounding of the
    simulator's :func:`pnex_magic.tc.api._tree`."""
    def typer(x):
        from numba import cuda

        def impl(x):
            x = combine(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 16))
            x = combine(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 8))
            x = combine(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 4))
            x = combine(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 2))
            x = combine(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 1))
            return x
        return impl
    return typer


def _block_overload(warp_reduce: Callable[[Any], Any], combine: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The overload of a block reduction: ``warp_reduce`` in each warp, lane 0's result in
    ``scratch`` (shared, one element per warp), then every thread folds the warps' results
    in warp order with ``combine`` (the simulator's :func:`pnex_magic.tc.api._block_combine`)."""
    def typer(x, scratch):
        from numba import cuda

        def impl(x, scratch):
            warp = warp_reduce(x)
            lane = cuda.threadIdx.x % 32
            wid = cuda.threadIdx.x // 32
            nwarps = (cuda.blockDim.x + 31) // 32
            if lane == 0:
                scratch[wid] = warp
            cuda.syncthreads()
            total = scratch[0]
            for w in range(1, nwarps):
                total = combine(total, scratch[w])
            cuda.syncthreads()
            return total
        return impl
    return typer
