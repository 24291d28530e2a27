"""C = A @ B on the tensor cores, as a pnex kernel: ``mma.sync`` m16n8k16, ``ldmatrix``
from swizzled shared tiles, a ``cp.async`` pipeline of ``STAGES`` tiles.

A (M, K) and B (K, N) row-major float16 or bfloat16; C (M, N) of the same dtype,
accumulated in float32.  Each block computes a BM x BN tile with 4 warps (2 x 2), each
warp a (BM / 2) x (BN / 2) tile of m16n8 accumulators.  M and N must be multiples of the
block tile and K of BK: the op refuses other shapes before it launches (:mod:`tiles`).
Shared tiles are declared 128-byte aligned: ``cp.async`` and ``ldmatrix`` need 16 bytes,
and the swizzle is conflict-free from a 128-byte boundary (Numba's default alignment is
the element size, 2 bytes).
"""

from numba import cuda, float32, uint32
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from tiles import grouped_tile, tile_rule

BK = 32


def make_gemm(dtype: str = "f16", bm: int = 128, bn: int = 128, stages: int = 3, group: int = 8):
    """The op ``c = gemm(a, b)`` for one dtype and tile shape (its ``requires``: M must be
    a multiple of ``bm``, N of ``bn``, K of 32)."""
    mma = tc.mma if dtype == "f16" else tc.mma_bf16
    MI, NI = bm // 32, bn // 16  # m16 tiles per warp (BM/2 rows), n8 tiles per warp (BN/2 columns)
    WAIT = stages - 2  # cp_async_wait takes a constant
    NB = NI // 2  # x4.trans loads per k16 step: two n8 B fragments each
    A_CHUNKS = bm * BK // 8 // 128  # 16-byte chunks of the A tile per thread
    B_CHUNKS = BK * bn // 8 // 128

    @pnex.jit(
        n_threads=(f"(c.size(0) // {bm}) * (c.size(1) // {bn}) * 128",),
        threads_per_block=128,
        requires={**tile_rule("a.size(0)", bm, "M", "the block tile BM"),
                  **tile_rule("b.size(1)", bn, "N", "the block tile BN"),
                  **tile_rule("a.size(1)", BK, "K", "the k-tile BK")},
    )
    def gemm(
        a: pnex.In(dtype, (None, None)),
        b: pnex.In(dtype, ("a.size(1)", None)),
        c: pnex.Out(dtype, ("a.size(0)", "b.size(1)")),
    ):
        sa = cuda.shared.array((stages, bm, BK), float16, alignment=128)
        sb = cuda.shared.array((stages, BK, bn), float16, alignment=128)
        m, k = a.shape
        n = b.shape[1]
        # grouped order: `group` block rows share each column of B while it is in L2
        pm, pn = grouped_tile(cuda.blockIdx.x, m // bm, n // bn, group)
        m0 = pm * bm
        n0 = pn * bn
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        wm = (warp // 2) * (bm // 2)
        wn = (warp % 2) * (bn // 2)

        acc = cuda.local.array((MI, NI, 4), float32)
        for i in range(MI):
            for j in range(NI):
                for r in range(4):
                    acc[i, j, r] = 0.0
        af = cuda.local.array((MI, 4), uint32)
        bf = cuda.local.array((NB, 4), uint32)

        ktiles = k // BK
        for s in range(stages - 1):
            if s < ktiles:
                for q in range(A_CHUNKS):
                    ch = tid + 128 * q
                    row = ch // (BK // 8)
                    col = (ch % (BK // 8)) * 8
                    tc.cp_async(sa, (s, row, tc.swizzle(row, col, BK)), a, (m0 + row, s * BK + col))
                for q in range(B_CHUNKS):
                    ch = tid + 128 * q
                    row = ch // (bn // 8)
                    col = (ch % (bn // 8)) * 8
                    tc.cp_async(sb, (s, row, tc.swizzle(row, col, bn)), b, (s * BK + row, n0 + col))
            tc.cp_async_commit()

        for kt in range(ktiles):
            tc.cp_async_wait(WAIT)
            cuda.syncthreads()
            nk = kt + stages - 1
            if nk < ktiles:
                s = nk % stages
                for q in range(A_CHUNKS):
                    ch = tid + 128 * q
                    row = ch // (BK // 8)
                    col = (ch % (BK // 8)) * 8
                    tc.cp_async(sa, (s, row, tc.swizzle(row, col, BK)), a, (m0 + row, nk * BK + col))
                for q in range(B_CHUNKS):
                    ch = tid + 128 * q
                    row = ch // (bn // 8)
                    col = (ch % (bn // 8)) * 8
                    tc.cp_async(sb, (s, row, tc.swizzle(row, col, bn)), b, (nk * BK + row, n0 + col))
            tc.cp_async_commit()
            s = kt % stages
            for kk in range(BK // 16):
                for i in range(MI):
                    r = wm + i * 16 + lane % 16
                    col = kk * 16 + (lane // 16) * 8
                    tc.ldmatrix(af[i], sa, (s, r, tc.swizzle(r, col, BK)))
                for j in range(NB):
                    r = kk * 16 + lane % 16
                    col = wn + j * 16 + (lane // 16) * 8
                    tc.ldmatrix(bf[j], sb, (s, r, tc.swizzle(r, col, bn)), 4, True)
                for i in range(MI):
                    for j in range(NB):
                        mma(acc[i, 2 * j], af[i], bf[j, 0:2])
                        mma(acc[i, 2 * j + 1], af[i], bf[j, 2:4])
        tc.cp_async_wait(0)

        g = lane // 4
        t = lane % 4
        for i in range(MI):
            for j in range(NI):
                row = m0 + wm + i * 16 + g
                col = n0 + wn + j * 8 + 2 * t
                tc.store_pair(c, (row, col), acc[i, j, 0], acc[i, j, 1])
                tc.store_pair(c, (row + 8, col), acc[i, j, 2], acc[i, j, 3])

    return gemm
