"""Small pnex kernels that exercise one tensor-core primitive each (tests/test_tc.py,
tests/test_tc_gpu.py): the same op runs on CPU tensors (the simulator's NumPy
references) and on CUDA tensors (the hardware), and the tests compare both with
independent references written from the PTX ISA's formulas."""

from numba import cuda, float32, int32, uint32
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc


def _mma_kernel(kind):
    mma = {"f16": tc.mma, "bf16": tc.mma_bf16, "tf32": tc.mma_tf32}[kind]

    # A as words: (16, 8) for 16-bit kinds (two halves a word), (16, 8) tf32 words for tf32;
    # B transposed (n, k) as words: (8, 8) / (8, 8).
    @pnex.jit(n_threads=32, threads_per_block=32)
    def mma_tile(
        a: pnex.In("i32", (16, 8)),
        bt: pnex.In("i32", (8, 8)),
        c: pnex.In("f32", (16, 8)),
        d: pnex.Out("f32", (16, 8)),
    ):
        lane = cuda.threadIdx.x
        g = lane // 4
        t = lane % 4
        af = cuda.local.array(4, uint32)
        bf = cuda.local.array(2, uint32)
        acc = cuda.local.array(4, float32)
        # word (row, w) of A holds columns 2w, 2w+1 (16-bit kinds) or column w (tf32):
        # the same word indices either way; likewise for B transposed.
        af[0] = a[g, t]
        af[1] = a[g + 8, t]
        af[2] = a[g, t + 4]
        af[3] = a[g + 8, t + 4]
        bf[0] = bt[g, t]
        bf[1] = bt[g, t + 4]
        acc[0] = c[g, 2 * t]
        acc[1] = c[g, 2 * t + 1]
        acc[2] = c[g + 8, 2 * t]
        acc[3] = c[g + 8, 2 * t + 1]
        mma(acc, af, bf)
        d[g, 2 * t] = acc[0]
        d[g, 2 * t + 1] = acc[1]
        d[g + 8, 2 * t] = acc[2]
        d[g + 8, 2 * t + 1] = acc[3]

    return mma_tile


mma_f16 = _mma_kernel("f16")
mma_bf16 = _mma_kernel("bf16")
mma_tf32 = _mma_kernel("tf32")


def _ldmatrix_kernel(count, trans):
    @pnex.jit(n_threads=32, threads_per_block=32)
    def load(tile: pnex.In("f16", (32, 16)), words: pnex.Out("u32", (32, 4))):
        s = cuda.shared.array((32, 16), float16, alignment=128)
        lane = cuda.threadIdx.x
        for c in range(16):
            s[lane, c] = tile[lane, c]
        cuda.syncthreads()
        frag = cuda.local.array(4, uint32)
        for w in range(4):
            frag[w] = 0
        # lane 8 j + r points at row r of matrix j: matrix j is rows 8 (j % 4)..,
        # columns 8 (j // 4).. (with x4: four matrices down the first 32 rows' left half...)
        j = lane // 8
        r = lane % 8
        row = (j % 4) * 8 + r
        tc.ldmatrix(frag[0:count], s, (row, 8 * (lane % 2)), count, trans)
        for w in range(4):
            words[lane, w] = frag[w]

    return load


def _cp_async_kernel():
    @pnex.jit(n_threads=64, threads_per_block=64)
    def copy(src: pnex.In("f16", (16, 64)), dst: pnex.Out("f16", (16, 64)), valid_rows: int):
        s = cuda.shared.array((16, 64), float16, alignment=128)
        tid = cuda.threadIdx.x
        for q in range(2):  # 128 chunks of 8 halves
            ch = tid + 64 * q
            row = ch // 8
            col = (ch % 8) * 8
            tc.cp_async(s, (row, tc.swizzle(row, col, 64)), src, (row, col), row < valid_rows)
        tc.cp_async_commit()
        tc.cp_async_wait(0)
        cuda.syncthreads()
        for q in range(16):
            e = tid + 64 * q  # 1024 elements
            row = e // 64
            col = e % 64
            dst[row, col] = s[row, tc.swizzle(row, col, 64)]

    return copy


cp_async_copy = _cp_async_kernel()


@pnex.jit(n_threads=128, threads_per_block=128)
def reductions(x: pnex.In("f32", (128,)), sums: pnex.Out("f32", (128, 5))):
    scratch = cuda.shared.array(4, float32)
    tid = cuda.threadIdx.x
    v = x[tid]
    sums[tid, 0] = tc.warp_sum(v)
    sums[tid, 1] = tc.warp_max(v)
    sums[tid, 2] = tc.block_sum(v, scratch)
    sums[tid, 3] = tc.block_scan_sum(v, scratch)
    sums[tid, 4] = tc.block_max(v, scratch)


@pnex.jit(n_threads=32, threads_per_block=32)
def packing(x: pnex.In("f32", (32, 2)), words: pnex.Out("u32", (32, 3))):
    lane = cuda.threadIdx.x
    words[lane, 0] = tc.pack_f16x2(x[lane, 0], x[lane, 1])
    words[lane, 1] = tc.pack_bf16x2(x[lane, 0], x[lane, 1])
    words[lane, 2] = tc.to_tf32(x[lane, 0])


@pnex.jit(n_threads=64, threads_per_block=64)
def unpacking(words: pnex.In("u32", (64,)), x: pnex.Out("f32", (64, 4))):
    i = cuda.threadIdx.x
    x[i, 0], x[i, 1] = tc.unpack_f16x2(words[i])
    x[i, 2], x[i, 3] = tc.unpack_bf16x2(words[i])


@pnex.jit(n_threads=256, threads_per_block=128)
def exp2s(x: pnex.In("f32", (256,)), y: pnex.Out("f32", (256,))):
    i = cuda.grid(1)
    y[i] = tc.exp2_approx(x[i])


@pnex.jit(n_threads=32, threads_per_block=32)
def shuffles(x: pnex.In("i32", (32,)), out: pnex.Out("i32", (32, 4))):
    lane = cuda.threadIdx.x
    v = x[lane]
    out[lane, 0] = cuda.shfl_sync(0xFFFFFFFF, v, (lane * 7) % 32)
    out[lane, 1] = cuda.shfl_up_sync(0xFFFFFFFF, v, 3)
    out[lane, 2] = cuda.shfl_down_sync(0xFFFFFFFF, v, 5)
    out[lane, 3] = cuda.shfl_xor_sync(0xFFFFFFFF, v, 9)


__all__ = ["mma_f16", "mma_bf16", "mma_tf32", "cp_async_copy", "reductions", "packing", "exp2s", "shuffles",
           "int32"]
