"""C = A @ W^T on Hopper's tensor cores, as a pnex kernel: ``wgmma.mma_async`` m64nNk16
reading both operands from shared memory, tiles filled by a ``cp.async`` pipeline in
the 128-byte swizzled layout the instruction's descriptors describe.

A (M, K) and W (N, K) row-major (K-major both: ``torch.nn.functional.linear``'s
layout, ``x @ w.T``), float16 or bfloat16; C (M, N) of the same dtype, accumulated in
float32.  A block of ``BM / 64`` warpgroups computes a BM x BN tile; each warpgroup
a 64 x BN slice with one ``wgmma`` per 16 columns of K.  Tiles are BK = 64 wide (one
128-byte row each); ``STAGES`` of them are in flight.  ``BN`` and ``STAGES`` are
``pnex.Tune`` parameters: the autotuner picks them per shape, among the BN that divide N
(``tune_requires`` naming N: a call with N = 384 runs BN = 128, one with N = 512 times
both).  M must be a multiple of BM, N of one BN choice and K of 64 (at least 64): the op
refuses other shapes before it launches (:mod:`tiles`).  Needs an sm_90 GPU (H100,
H200): wgmma exists there only.

The epilogue stages the tile through the freed tile buffers (swizzled) and stores 16
bytes a thread.  ``gelu=True``: ``gelu(a @ w.T + bias)`` (the exact, erf GELU) fused
into it: the accumulators are staged as they are, float32, and bias and GELU applied in
the store loop (:mod:`epilogue`, as :mod:`gemm_tma` does; :func:`make_linear`).
"""

from numba import cuda, float32, uint32
from numba.cuda.misc.special import literal_unroll
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from epilogue import gelu_fits, gelu_store, stage_f32
from epilogue import gelu as erf_gelu  # make_linear's gelu is its flag
from tiles import grouped_tile, tile_rule

BK = 64


def make_linear(dtype="f16", bm=128, bn=(128, 256), stages=(3, 4), group=8, pipelined=True, dynamic=True,
                gelu=False, staged=True):
    """The pnex op ``c = linear(a, w)`` (``a @ w.T``) for one dtype and block height;
    ``gelu=True``: ``c = linear(a, w, bias)``, ``gelu(a @ w.T + bias)`` (the exact, erf
    GELU, ``torch.nn.functional.gelu``'s default, in float32) fused into the epilogue.
    ``bn`` and ``stages``: the choices of the ``Tune`` parameters BN and STAGES.
    ``pipelined``: one group of wgmma stays in flight while the next tile is issued
    (prefetch distance STAGES - 2, so STAGES >= 3); else each k-tile waits for its wgmma
    (STAGES >= 2).  ``dynamic=False``: static shared memory (48 KiB at most: small
    tiles, for tests).  ``staged``: the epilogue writes the tile to shared memory
    (swizzled: no bank conflicts), then to C 16 bytes a thread, every 32-byte sector
    whole; else each thread stores its accumulator pairs straight to C (4 bytes,
    half-used sectors).

    With ``gelu``, staged (and ``dynamic``): the accumulators are staged as they are,
    float32 (a straight ``range`` loop: the registers stay registers), into the tile
    buffers, and every thread of the block applies bias and GELU in the store loop, 8
    values per 16-byte chunk of C, the bias of its 8 columns loaded once.  That tile is
    BM x BN x 4 bytes: tile choices whose buffers are smaller (from STAGES = 2 on, only
    BM = 128 with BN = 256 and STAGES = 2), and BN other than 32, 64, 128 or 256, are refused
    (:func:`epilogue.gelu_fits`).  Unstaged (or static): the GELU is applied to the
    accumulators before they are stored, in a ``literal_unroll`` loop (with ``range``
    that loop stays rolled and the accumulators go to local memory)."""
    bn_choices = tuple(bn) if isinstance(bn, (tuple, list)) else (bn,)
    stage_choices = tuple(stages) if isinstance(stages, (tuple, list)) else (stages,)
    wide = max(bn_choices)
    regs = wide // 2  # accumulators per thread for the widest BN
    wgmma = tc.wgmma if dtype == "f16" else tc.wgmma_bf16
    pack = tc.pack_f16x2 if dtype == "f16" else tc.pack_bf16x2
    bf16 = dtype != "f16"
    threads = 128 * (bm // 64)
    a_chunks = bm * 8 // threads  # 16-byte chunks of an A tile per thread
    ahead_less = 2 if pipelined else 1  # tiles loaded ahead of the one computed: STAGES - ahead_less
    in_flight = 1 if pipelined else 0  # wgmma groups left running at the end of an iteration
    columns = tuple(range(wide // 8))  # the unstaged GELU epilogue's n8 tiles (those past BN are pruned)
    static_stages = max(stage_choices)
    # the tile buffers; the GELU epilogue's float32 tile reuses them (refused where it would not fit)
    options = {"shared_bytes": f"STAGES * ({bm} + BN) * {BK * 2}"} if dynamic else {}
    if gelu and staged and dynamic:
        gelu_fits("make_linear", bm, threads, bn_choices, stage_choices, BK)

    # N: a multiple of the one BN, or with several, each call runs the BN choices that divide it
    n_rule = tile_rule("w.size(0)", wide, "N", "the block tile BN") if len(bn_choices) == 1 else {}
    per_call = {"tune_requires": {"w.size(0) % BN == 0": "N must be a multiple of the block tile BN"}} \
        if len(bn_choices) > 1 else {}

    @pnex.jit(
        n_threads=(f"(c.size(0) // {bm}) * (c.size(1) // BN) * {threads}",),
        threads_per_block=threads,
        requires={**tile_rule("a.size(0)", bm, "M", "the block tile BM"),
                  **n_rule,
                  # no k-tile: the accumulators are never written
                  **tile_rule("a.size(1)", BK, "K", "the k-tile BK", minimum=BK)},
        **per_call,
        **options,
    )
    def linear(
        a: pnex.In(dtype, (None, None)),
        w: pnex.In(dtype, (None, "a.size(1)")),
        bias: pnex.In(dtype, ("w.size(0)",)) if gelu else pnex.Unused,
        c: pnex.Out(dtype, ("a.size(0)", "w.size(0)")),
        BN: pnex.Tune(*bn_choices),
        STAGES: pnex.Tune(*stage_choices),
    ):
        if dynamic:
            raw = cuda.shared.array(0, float16, alignment=1024)
            sa = tc.tile(raw, 0, (STAGES, bm, BK))
            sb = tc.tile(raw, STAGES * bm * BK, (STAGES, BN, BK))
        else:
            sa = cuda.shared.array((static_stages, bm, BK), float16, alignment=1024)
            sb = cuda.shared.array((static_stages, wide, BK), float16, alignment=1024)
        b_chunks = BN * 8 // threads
        ahead = STAGES - ahead_less
        m, k = a.shape
        n = w.shape[0]
        tile_m, tile_n = grouped_tile(cuda.blockIdx.x, m // bm, n // BN, group)
        m0 = tile_m * bm
        n0 = tile_n * BN
        tid = cuda.threadIdx.x
        wg = tid // 128
        acc = cuda.local.array(regs, float32)  # the first wgmma writes it (accumulate=False)

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
            tc.cp_async_wait(ahead - 1)  # tile kt has landed (this thread's copies)
            tc.fence_async_shared()
            cuda.syncthreads()  # ... everyone's; and every wgmma that read the stage refilled next is done
            nk = kt + ahead
            if nk < ktiles:
                s = nk % STAGES
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
            s = kt % STAGES
            tc.wgmma_fence()
            for kk in range(BK // 16):
                wgmma(acc, sa, (s, wg * 64, kk * 16), sb, (s, 0, kk * 16), BN, kt > 0 or kk > 0)
            tc.wgmma_commit()
            tc.wgmma_wait(in_flight)
        tc.wgmma_wait(0)
        tc.cp_async_wait(0)

        lane = tid % 32
        warp = (tid % 128) // 32
        g = lane // 4
        t = lane % 4
        if staged and dynamic:
            cuda.syncthreads()  # every warpgroup is done with the tiles: their memory takes the output
            words = cuda.shared.array(0, uint32, alignment=1024)
            out = tc.tile(words, 0, (bm, BN // 2))  # packed pairs, rows swizzled like the tiles
            if gelu:  # float32, rows swizzled by f32_unit (it fits the tile buffers: gelu_fits)
                stage = tc.tile(cuda.shared.array(0, float32, alignment=1024), 0, (bm * BN,))
            r = wg * 64 + warp * 16 + g
            for j in range(BN // 8):  # a constant trip count: unrolled straight, without literal_unroll's
                col = j * 8 + 2 * t  # dispatch on j (a chain of compares per copy); acc[...] stays in registers
                if gelu:  # the GELU (an erf a value) waits for the store loop: this body stays small
                    stage_f32(stage, r, col, BN, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3])
                else:
                    out[r, tc.swizzle(r, col, BN) // 2] = pack(acc[4 * j], acc[4 * j + 1])
                    out[r + 8, tc.swizzle(r + 8, col, BN) // 2] = pack(acc[4 * j + 2], acc[4 * j + 3])
            cuda.syncthreads()
            if gelu:  # every thread stores: 16-byte chunks, consecutive along rows, bias and GELU applied
                gelu_store(c, bias, stage, m0, n0, tid, threads, bm, BN, bf16)
            else:
                flat = tc.tile(words, 0, (bm * BN // 2,))
                for q in range(bm * BN // 8 // threads):  # 16-byte chunks of the tile, consecutive along rows
                    ch = tid + threads * q
                    row = ch // (BN // 8)
                    col = (ch % (BN // 8)) * 8
                    chunk = pnex.vload(flat, row * (BN // 2) + tc.swizzle(row, col, BN) // 2, 4)
                    tc.store_words(c, (m0 + row, n0 + col), chunk)
        else:
            row = m0 + wg * 64 + warp * 16 + g
            if gelu:  # range() would leave this loop rolled (an erf a value) and acc[...] in local memory
                for j in literal_unroll(columns):  # one copy per literal j: acc[...] stays in registers
                    if j * 8 < BN:
                        col = n0 + j * 8 + 2 * t
                        b0 = float32(bias[col])
                        b1 = float32(bias[col + 1])
                        tc.store_pair(c, (row, col), erf_gelu(acc[4 * j] + b0), erf_gelu(acc[4 * j + 1] + b1))
                        tc.store_pair(c, (row + 8, col), erf_gelu(acc[4 * j + 2] + b0), erf_gelu(acc[4 * j + 3] + b1))
            else:
                for j in range(BN // 8):  # unrolled straight (see above)
                    col = n0 + j * 8 + 2 * t
                    tc.store_pair(c, (row, col), acc[4 * j], acc[4 * j + 1])
                    tc.store_pair(c, (row + 8, col), acc[4 * j + 2], acc[4 * j + 3])

    return linear
