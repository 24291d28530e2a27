"""Kernels whose tensor-core calls can be driven out of their rules by scalar arguments
(tests/test_tc_checked_{rules,simulator,compile}.py on CPU, tests/test_tc_checked_gpu.py on a GPU):
a shift that misaligns a span, a row past the end, a fragment slice of the wrong length.  With the
neutral arguments (:data:`GOOD`) each is a correct kernel."""

from numba import cuda, float32, uint32
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc


@pnex.jit(n_threads=64, threads_per_block=64)
def cp_tile(src: pnex.In("f16", (None, None)), dst: pnex.Out("f16", (16, 72)), row_shift: int, col_shift: int,
            valid_rows: int):
    s = cuda.shared.array((16, 72), float16, alignment=128)
    tid = cuda.threadIdx.x
    for q in range(18):  # 16 x 72 = 64 x 18
        e = tid + 64 * q
        s[e // 72, e % 72] = 0.0
    cuda.syncthreads()
    for q in range(2):  # 128 chunks of 8 halves
        ch = tid + 64 * q
        row = ch // 8
        col = (ch % 8) * 8
        tc.cp_async(s, (row, col + col_shift), src, (row + row_shift, col), row < valid_rows)
    tc.cp_async_commit()
    tc.cp_async_wait(0)
    cuda.syncthreads()
    for q in range(18):
        e = tid + 64 * q
        dst[e // 72, e % 72] = s[e // 72, e % 72]


@pnex.jit(n_threads=32, threads_per_block=32)
def ld_tile(tile: pnex.In("f16", (32, 16)), words: pnex.Out("u32", (32, 4)), shift: int, bad_from: int, n: int):
    s = cuda.shared.array((32, 16), float16, alignment=128)
    lane = cuda.threadIdx.x
    for c in range(16):
        s[lane, c] = tile[lane, c]
    cuda.syncthreads()
    frag = cuda.local.array(4, uint32)
    for w in range(4):
        frag[w] = 0
    col = 8 * (lane % 2)
    if lane >= bad_from:
        col += shift
    tc.ldmatrix(frag[0:n], s, (lane, col), 2, False)  # x2: lanes 0-15 give the rows
    for w in range(4):
        words[lane, w] = frag[w]


@pnex.jit(n_threads=32, threads_per_block=32)
def ld_undeclared(tile: pnex.In("f16", (32, 16)), words: pnex.Out("u32", (32, 4))):
    s = cuda.shared.array((32, 16), float16)  # Numba's default alignment: 2 bytes
    lane = cuda.threadIdx.x
    for c in range(16):
        s[lane, c] = tile[lane, c]
    cuda.syncthreads()
    frag = cuda.local.array(4, uint32)
    tc.ldmatrix(frag, s, (lane, 8 * (lane // 16)))
    for w in range(4):
        words[lane, w] = frag[w]


@pnex.jit(n_threads=32, threads_per_block=32)
def mma_len(x: pnex.In("f32", (32, 4)), out: pnex.Out("f32", (32, 4)), nc: int, na: int, nb: int):
    lane = cuda.threadIdx.x
    acc = cuda.local.array(8, float32)
    af = cuda.local.array(8, uint32)
    bf = cuda.local.array(8, uint32)
    for r in range(8):
        acc[r] = 0.0
        af[r] = tc.pack_f16x2(float32(r), float32(lane % 3))
        bf[r] = tc.pack_f16x2(float32(lane % 5), float32(1.0))
    for r in range(4):
        acc[r] = x[lane, r]
    tc.mma(acc[0:nc], af[0:na], bf[0:nb])
    for r in range(4):
        out[lane, r] = acc[r]


@pnex.jit(n_threads=48, threads_per_block=48)
def mma_partial_warp(x: pnex.In("f32", (32, 4)), out: pnex.Out("f32", (32, 4))):
    lane = cuda.threadIdx.x % 32
    acc = cuda.local.array(4, float32)
    af = cuda.local.array(4, uint32)
    bf = cuda.local.array(2, uint32)
    for r in range(4):
        acc[r] = x[lane, r]
        af[r] = 0
    bf[0] = 0
    bf[1] = 0
    tc.mma(acc, af, bf)  # warp 1 has 16 threads
    if cuda.threadIdx.x < 32:
        for r in range(4):
            out[lane, r] = acc[r]


@pnex.jit(n_threads=32, threads_per_block=32)
def pairs(out: pnex.Out("f16", (4, 18), init=0), shift: int):
    lane = cuda.threadIdx.x
    row = lane // 8
    col = 2 * (lane % 8) + shift
    tc.store_pair(out, (row, col), float32(lane), float32(-lane))


@pnex.jit(n_threads=128, threads_per_block=128)
def wg_tile(a: pnex.In("f16", (64, 64)), b: pnex.In("f16", (16, 64)), out: pnex.Out("f32", (128, 8)), plane: int,
            r0: int, c0: int, m: int, which: int):
    sa = cuda.shared.array((2, 68, 64), float16, alignment=1024)  # plane 1 starts 8704 bytes in: not 1024-aligned
    sc = cuda.shared.array((64, 64), float16, alignment=128)  # aligned for ldmatrix, not for wgmma
    sb = cuda.shared.array((16, 64), float16, alignment=1024)
    sb8 = cuda.shared.array((8, 64), float16, alignment=1024)  # too few rows for n = 16
    sb32 = cuda.shared.array((32, 32), float16, alignment=1024)  # rows of 32: not the 128-byte swizzle's
    tid = cuda.threadIdx.x
    for q in range(32):  # 64 x 64 = 128 x 32
        e = tid + 128 * q
        r = e // 64
        c = tc.swizzle(r, e % 64, 64)
        sa[plane, r, c] = a[r, e % 64]
        sc[r, c] = a[r, e % 64]
    for q in range(8):  # 16 x 64 = 128 x 8
        e = tid + 128 * q
        sb[e // 64, tc.swizzle(e // 64, e % 64, 64)] = b[e // 64, e % 64]
    tc.fence_async_shared()
    cuda.syncthreads()
    acc = cuda.local.array(16, float32)
    for r in range(16):
        acc[r] = 0.0
    tc.wgmma_fence()
    if which == 0:
        tc.wgmma(acc[0:m], sa, (plane, r0, c0), sb, (0, 0), 16)
    elif which == 1:
        tc.wgmma(acc[0:m], sa, (plane, r0, c0), sb8, (0, 0), 16)
    elif which == 2:
        tc.wgmma(acc[0:m], sa, (plane, r0, c0), sb32, (0, 0), 16)
    else:
        tc.wgmma(acc[0:m], sc, (r0, c0), sb, (0, 0), 16)
    tc.wgmma_commit()
    tc.wgmma_wait(0)
    for r in range(8):
        out[tid, r] = acc[r]


#: The arguments (after the tensors) with which each kernel is correct.
GOOD = {
    "cp_tile": dict(row_shift=0, col_shift=0, valid_rows=16),
    "ld_tile": dict(shift=0, bad_from=32, n=2),
    "mma_len": dict(nc=4, na=4, nb=2),
    "pairs": dict(shift=0),
    "wg_tile": dict(plane=0, r0=0, c0=0, m=8, which=0),
}


@pnex.jit(n_threads=32, threads_per_block=32)
def lane_leaves(x: pnex.In("f32", (32,)), y: pnex.Out("f32", (32,)), leaver: int, fault: int):
    i = cuda.threadIdx.x
    if i == leaver:
        if fault:
            y[i] = x[i + 32]  # an IndexError in that lane only
        return
    y[i] = tc.warp_sum(x[i])
