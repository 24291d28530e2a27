"""The tensor-core helpers that are plain Python compiled by Numba: the swizzle, warp and
block reductions, and the block scan (warp shuffles and a shared-memory scratch of one
element per warp).  Their CPU forms are :mod:`pnex_magic.tc.api`'s and
:mod:`pnex_magic.tc.simulate`'s; :func:`register_collectives` gives Numba the CUDA ones."""

from __future__ import annotations

import functools

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

    @overload(tc.warp_sum, target="cuda")
    def _warp_sum_impl(x):
        from numba import cuda

        def impl(x):
            x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 16)
            x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 8)
            x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 4)
            x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 2)
            x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 1)
            return x
        return impl

    @overload(tc.warp_max, target="cuda")
    def _warp_max_impl(x):
        from numba import cuda

        def impl(x):
            x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 16))
            x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 8))
            x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 4))
            x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 2))
            x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 1))
            return x
        return impl

    @overload(tc.block_sum, target="cuda")
    def _block_sum_impl(x, scratch):
        from numba import cuda

        def impl(x, scratch):
            warp = tc.warp_sum(x)
            lane = cuda.threadIdx.x % 32
            wid = cuda.threadIdx.x // 32
            nwarps = (cuda.blockDim.x + 31) // 32
            if lane == 0:
                scratch[wid] = warp
            cuda.syncthreads()
            total = scratch[0]
            for w in range(1, nwarps):
                total += scratch[w]
            cuda.syncthreads()
            return total
        return impl

    @overload(tc.block_max, target="cuda")
    def _block_max_impl(x, scratch):
        from numba import cuda

        def impl(x, scratch):
            warp = tc.warp_max(x)
            lane = cuda.threadIdx.x % 32
            wid = cuda.threadIdx.x // 32
            nwarps = (cuda.blockDim.x + 31) // 32
            if lane == 0:
                scratch[wid] = warp
            cuda.syncthreads()
            total = scratch[0]
            for w in range(1, nwarps):
                total = max(total, scratch[w])
            cuda.syncthreads()
            return total
        return impl

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
