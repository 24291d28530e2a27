"""C = A @ W^T on Hopper's tensor cores, as a pnex kernel: ``wgmma.mma_async`` m64nNk16
reading both operands from shared memory, tiles filled by a ``cp.async`` pipeline in
the 128-byte swizzled layout the instruction's descriptors describe.

A (M, K) and W (N, K) row-major (K-major both: ``torch.nn.functional.linear``'s
layout, ``x @ w.T``), float16 or bfloat16; C (M, N) of the same dtype, accumulated in
float32.  A block of ``BM / 64`` warpgroups computes a BM x BN tile; each warpgroup
a 64 x BN slice with one ``wgmma`` per 16 columns of K.  Tiles are BK = 64 wide (one
128-byte row each); ``STAGES`` of them are in flight.  M must be a multiple of BM, N of
BN and K of 64 (``check_shapes``).  Needs an sm_90 GPU (H100, H200).
"""

import math

from numba import cuda, float32
from numba.cuda.misc.special import literal_unroll
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc

BK = 64
SQRT1_2 = 0.7071067811865476


@cuda.jit(device=True, inline=True)
def _gelu(x):
    return float32(0.5) * x * (float32(1.0) + math.erf(x * float32(SQRT1_2)))


def check_shapes(m, n, k, bm=128, bn=256):
    if m % bm or n % bn or k % BK:
        raise ValueError(f"gemm_wgmma: M ({m}) must be a multiple of {bm}, N ({n}) of {bn} and K ({k}) of {BK}")


def shared_bytes(bm, bn, stages):
    return stages * (bm + bn) * BK * 2


def make_linear(dtype="f16", bm=128, bn=256, stages=4, group=8, pipelined=True, dynamic=True, gelu=False):
    """The pnex op ``c = linear(a, w)`` (``a @ w.T``) for one dtype and tile shape;
    ``gelu=True``: ``c = linear(a, w, bias)``, ``gelu(a @ w.T + bias)`` (the exact, erf
    GELU, ``torch.nn.functional.gelu``'s default) fused into the epilogue.
    ``pipelined``: one group of wgmma stays in flight while the next tile is issued
    (prefetch distance ``stages - 2``); else each k-tile waits for its wgmma."""
    wgmma = tc.wgmma if dtype == "f16" else tc.wgmma_bf16
    threads = 128 * (bm // 64)
    regs = bn // 2
    a_chunks = bm * 8 // threads  # 16-byte chunks of a tile per thread
    b_chunks = bn * 8 // threads
    ahead = stages - 2 if pipelined else stages - 1  # tiles loaded ahead of the one computed
    copies_pending = ahead - 1  # cp_async_wait: the tile about to be computed has landed
    in_flight = 1 if pipelined else 0  # wgmma groups left running at the end of an iteration
    columns = tuple(range(bn // 8))  # the epilogue's n8 tiles
    a_elems = stages * bm * BK
    total = stages * (bm + bn) * BK
    smem = shared_bytes(bm, bn, stages) if dynamic else 0

    @pnex.jit(
        n_threads=(f"(c.size(0) // {bm}) * (c.size(1) // {bn}) * {threads}",),
        threads_per_block=threads,
        **({"shared_bytes": smem} if dynamic else {}),
    )
    def linear(
        a: pnex.In(dtype, (None, None)),
        w: pnex.In(dtype, (None, "a.size(1)")),
        bias: pnex.In(dtype, ("w.size(0)",)) if gelu else pnex.Unused,
        c: pnex.Out(dtype, ("a.size(0)", "w.size(0)")),
    ):
        if dynamic:
            raw = cuda.shared.array(0, float16, alignment=1024)
            sa = raw[0:a_elems].reshape((stages, bm, BK))
            sb = raw[a_elems:total].reshape((stages, bn, BK))
        else:
            sa = cuda.shared.array((stages, bm, BK), float16, alignment=1024)
            sb = cuda.shared.array((stages, bn, BK), float16, alignment=1024)
        m, k = a.shape
        n = w.shape[0]
        pid = cuda.blockIdx.x
        tiles_n = n // bn
        in_group = group * tiles_n
        first_m = (pid // in_group) * group
        rows = min(m // bm - first_m, group)
        m0 = (first_m + (pid % in_group) % rows) * bm
        n0 = ((pid % in_group) // rows) * bn
        tid = cuda.threadIdx.x
        wg = tid // 128

        acc = cuda.local.array(regs, float32)
        for r in range(regs):
            acc[r] = 0.0

        ktiles = k // BK
        for s in range(ahead):
            if s < ktiles:
                for q in range(a_chunks):
                    ch = tid + threads * q
                    row = ch // 8
                    col = (ch % 8) * 8
                    tc.cp_async(sa, (s, row, tc.swizzle(row, col, BK)), a, (m0 + row, s * BK + col))
                for q in range(b_chunks):
                    ch = tid + threads * q
                    row = ch // 8
                    col = (ch % 8) * 8
                    tc.cp_async(sb, (s, row, tc.swizzle(row, col, BK)), w, (n0 + row, s * BK + col))
            tc.cp_async_commit()

        for kt in range(ktiles):
            tc.cp_async_wait(copies_pending)
            tc.fence_async_shared()
            cuda.syncthreads()  # tile kt is in shared memory; every wgmma that read the stage refilled next is done
            nk = kt + ahead
            if nk < ktiles:
                s = nk % stages
                for q in range(a_chunks):
                    ch = tid + threads * q
                    row = ch // 8
                    col = (ch % 8) * 8
                    tc.cp_async(sa, (s, row, tc.swizzle(row, col, BK)), a, (m0 + row, nk * BK + col))
                for q in range(b_chunks):
                    ch = tid + threads * q
                    row = ch // 8
                    col = (ch % 8) * 8
                    tc.cp_async(sb, (s, row, tc.swizzle(row, col, BK)), w, (n0 + row, nk * BK + col))
            tc.cp_async_commit()
            s = kt % stages
            tc.wgmma_fence()
            for kk in range(BK // 16):
                wgmma(acc, sa, (s, wg * 64, kk * 16), sb, (s, 0, kk * 16), bn)
            tc.wgmma_commit()
            tc.wgmma_wait(in_flight)
        tc.wgmma_wait(0)
        tc.cp_async_wait(0)

        lane = tid % 32
        warp = (tid % 128) // 32
        g = lane // 4
        t = lane % 4
        row = m0 + wg * 64 + warp * 16 + g
        for j in literal_unroll(columns):  # unrolled while typing: acc[...] at constant indices stays in registers
            col = n0 + j * 8 + 2 * t
            if gelu:
                b0 = float32(bias[col])
                b1 = float32(bias[col + 1])
                tc.store_pair(c, (row, col), _gelu(acc[4 * j] + b0), _gelu(acc[4 * j + 1] + b1))
                tc.store_pair(c, (row + 8, col), _gelu(acc[4 * j + 2] + b0), _gelu(acc[4 * j + 3] + b1))
            else:
                tc.store_pair(c, (row, col), acc[4 * j], acc[4 * j + 1])
                tc.store_pair(c, (row + 8, col), acc[4 * j + 2], acc[4 * j + 3])

    return linear
