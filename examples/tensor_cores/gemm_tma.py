"""C = A @ W^T on Hopper as cuBLAS does it: a producer warp feeds the tensor cores
through the Tensor Memory Accelerator while two warpgroups compute, as a pnex kernel.

A (M, K) and W (N, K) row-major (``torch.nn.functional.linear``'s ``x @ w.T``),
float16 or bfloat16; C (M, N) of the same dtype, accumulated in float32.  A block of
384 threads computes a BM x BN = 128 x ``BN`` tile of C:

* warpgroup 0 is the producer.  It gives back registers (``setmaxnreg.dec``) and one
  of its threads issues, for each k-tile of 64, two ``tma_load`` copies (A's 128 x 64
  box and W's ``BN`` x 64 box, in the 128-byte swizzle wgmma reads) into one of
  ``STAGES`` shared buffers, whose "full" barrier counts their bytes; before it refills
  a buffer it waits on the buffer's "empty" barrier;
* warpgroups 1 and 2 compute (``setmaxnreg.inc``: the 128 float32 accumulators of a
  64 x 256 slice need them): each waits on a buffer's full barrier, issues four
  ``wgmma`` m64n``BN``k16, keeps one group in flight, and releases the buffer before
  (one arrival per warp on its empty barrier) once the wgmma that read it is done.

No thread computes an address per 16 bytes and there is no block-wide barrier in the
loop: the cp.async kernel (:mod:`gemm_wgmma`) spends both.  The epilogue stages the
tile through shared memory (swizzled) and stores 16 bytes a thread.  The op takes the
tensor maps of A and W (:func:`pnex_magic.tc.tensor_map`); :class:`TmaLinear` makes
them per call (a table lookup once made).  ``gelu=True``: ``gelu(a @ w.T + bias)`` (the
exact, erf GELU) fused into the epilogue (:func:`make_linear_tma`).  M must be a multiple of 128, N of ``BN``
and K of 64.  Needs an sm_90 GPU (H100, H200).

:func:`make_linear_persistent` is the same kernel with one block an SM walking the tiles, as
cuBLAS's own kernel does: the fastest pnex GEMM on an H200 (0.94-1.00x cuBLAS,
``benchmarks/results/tensor-cores-2026-11-28-2204.json``).
"""

from numba import cuda, float32, uint32, uint64
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from epilogue import CHUNK, activation_named, activation_store, gelu_fits, make_chunk16, stage_f32
from tiles import grouped_tile, init_buffers, release, tile_rule

BK = 64
BM = 128
PRODUCER_REGS = 40
CONSUMER_REGS = 232


def _tile_rules(bn: int, cluster: int) -> dict[str, str]:
    """What the TMA kernels require of M, N and K (``jit(requires=...)``)."""
    blocks = "the block tile BM" if cluster == 1 else f"the cluster's {cluster} block tiles BM"
    return {**tile_rule("a.size(0)", BM * cluster, "M", blocks),
            **tile_rule("w.size(0)", bn, "N", "the block tile BN"),
            **tile_rule("a.size(1)", BK, "K", "the k-tile BK", minimum=BK)}


def make_linear_tma(dtype="f16", bn=256, stages=4, group=8, cluster=1, gelu=False, activation="gelu_poly"):
    """The pnex op ``c = linear(a, w, a_map, w_map)`` (``a @ w.T``); ``bn``, ``stages``:
    the tile's width and the buffers in flight (``Tune`` choices, or one value each).

    ``cluster=2``: thread-block clusters of two blocks that compute adjacent row blocks
    of one column block of C (:func:`tiles.grouped_tile` puts blocks 2c and 2c + 1
    there), so they read the same ``BN`` x 64 tile of W, the larger operand (A's is
    128 x 64): each block's producer loads half of its rows and multicasts them into
    both blocks (``tma_load_multicast``), which halves W's traffic from L2 (a block
    reads 32 KiB a k-tile instead of 48).  A buffer is then written by both producers,
    so it is free only when the consumers of both blocks have released it: each
    consumer warp arrives on the "empty" barrier of every block of the cluster
    (``mbarrier_arrive_cluster``; 16 arrivals a phase).  ``w_map``'s box is then
    ``BN / 2`` rows, and M a multiple of 256.

    ``gelu=True``: the op ``c = linear(a, w, bias, a_map, w_map)``, ``gelu(a @ w.T +
    bias)`` (the exact GELU, ``torch.nn.functional.gelu``'s default, not its tanh
    approximation, in float32: :func:`epilogue.gelu_poly`, within 7e-6 of it).
    The consumers stage their accumulators as they are, float32, into the tile buffers
    (the same straight ``range`` loop: the registers stay registers), and apply bias
    and GELU in the store loop, 8 values per 16-byte chunk of C, the bias of a thread's
    8 columns loaded once (the 256 consumer threads' chunks keep their columns).  The
    staged tile is BM x BN x 4 bytes: it needs STAGES >= 3 at BN = 256 (refused else).
    ``activation``: the epilogue's function, of :data:`epilogue.ACTIVATIONS`: "gelu_poly"
    (the default), "gelu" (the erf form through libdevice's ``erff``: half again the
    instructions, and 2026-11-28 on an H200 8-14 us slower at 4096^3), or "bias" (none: the
    bias only, to measure what the GELU's arithmetic costs)."""
    if cluster not in (1, 2):
        raise ValueError(f"make_linear_tma: cluster must be 1 or 2 blocks, got {cluster!r}")
    bn_choices = tuple(bn) if isinstance(bn, (tuple, list)) else (bn,)
    stage_choices = tuple(stages) if isinstance(stages, (tuple, list)) else (stages,)
    wide = max(bn_choices)
    regs = wide // 2
    wgmma = tc.wgmma if dtype == "f16" else tc.wgmma_bf16
    pack = tc.pack_f16x2 if dtype == "f16" else tc.pack_bf16x2
    bf16 = dtype != "f16"
    threads = 384
    everyone = (1 << cluster) - 1  # the multicast's CTA mask: every block of the cluster
    clusters = {"cluster_dims": (cluster, 1, 1)} if cluster > 1 else {}
    consumers = 256
    if gelu:
        gelu_fits("make_linear_tma", BM, consumers, bn_choices, stage_choices, BK)
    act_store = activation_store(activation)

    @pnex.jit(
        n_threads=(f"(c.size(0) // {BM}) * (c.size(1) // BN) * {threads}",),
        threads_per_block=threads,
        shared_bytes=f"STAGES * ({BM} + BN) * {BK * 2} + 16 * STAGES",
        requires=_tile_rules(wide, cluster),
        **clusters,
    )
    def linear_tma(
        a: pnex.In(dtype, (None, None)),
        w: pnex.In(dtype, (None, "a.size(1)")),
        bias: pnex.In(dtype, ("w.size(0)",)) if gelu else pnex.Unused,
        a_map: pnex.In("uint8", (128,)),
        w_map: pnex.In("uint8", (128,)),
        c: pnex.Out(dtype, ("a.size(0)", "w.size(0)")),
        BN: pnex.Tune(*bn_choices),
        STAGES: pnex.Tune(*stage_choices),
    ):
        raw = cuda.shared.array(0, float16, alignment=1024)
        sa = tc.tile(raw, 0, (STAGES, BM, BK))
        sb = tc.tile(raw, STAGES * BM * BK, (STAGES, BN, BK))
        words64 = cuda.shared.array(0, uint64, alignment=1024)
        bars = tc.tile(words64, STAGES * (BM + BN) * BK // 4, (2 * STAGES,))  # full: s, empty: STAGES + s
        m, k = a.shape
        n = w.shape[0]
        tile_m, tile_n = grouped_tile(cuda.blockIdx.x, m // BM, n // BN, group)
        m0 = tile_m * BM
        n0 = tile_n * BN
        tid = cuda.threadIdx.x
        wg = tid // 128
        lane = tid % 32
        ktiles = k // BK
        acc = cuda.local.array(regs, float32)  # the first wgmma writes it (accumulate=False)
        words = cuda.shared.array(0, uint32, alignment=1024)
        part = BN // cluster  # the rows of W's tile this block's producer loads
        rank = tc.cluster_ctarank() if cluster > 1 else 0

        init_buffers(bars, STAGES, 8 * cluster, cluster)  # empty: one arrival per consumer warp of the cluster

        if wg == 0:
            tc.setmaxnreg_dec(PRODUCER_REGS)
            if tid == 0:
                tc.tensor_map_acquire(a_map)
                tc.tensor_map_acquire(w_map)
                for kt in range(ktiles):
                    s = kt % STAGES
                    if kt >= STAGES:  # the consumers released this buffer's previous round
                        tc.mbarrier_wait(bars, STAGES + s, (kt // STAGES - 1) & 1)
                    tc.mbarrier_arrive_expect_tx(bars, s, (BM + BN) * BK * 2)  # W's halves from both blocks
                    tc.tma_load(sa, (s, 0, 0), a_map, (m0, kt * BK), bars, s)
                    if cluster > 1:
                        tc.tma_load_multicast(sb, (s, rank * part, 0), w_map, (n0 + rank * part, kt * BK), bars, s,
                                              everyone)
                    else:
                        tc.tma_load(sb, (s, 0, 0), w_map, (n0, kt * BK), bars, s)
            cuda.syncthreads()  # the consumers' two barriers below (bar.sync counts threads, not sites)
            cuda.syncthreads()
        else:
            tc.setmaxnreg_inc(CONSUMER_REGS)
            row0 = (wg - 1) * 64
            for kt in range(ktiles):
                s = kt % STAGES
                tc.mbarrier_wait(bars, s, (kt // STAGES) & 1)
                tc.wgmma_fence()
                for kk in range(BK // 16):
                    wgmma(acc, sa, (s, row0, kk * 16), sb, (s, 0, kk * 16), BN, kt > 0 or kk > 0)
                tc.wgmma_commit()
                tc.wgmma_wait(1)  # the previous k-tile's wgmma is done: its buffer can be refilled
                if kt > 0 and lane == 0:  # with clusters, both blocks' producers fill it: each is told
                    release(bars, STAGES + (kt - 1) % STAGES, cluster)
            tc.wgmma_wait(0)
            cuda.syncthreads()  # every copy was waited for and every wgmma is done: the buffers take the output
            # the accumulators go to shared memory here, in the branch whose registers hold them
            out = tc.tile(words, 0, (BM, BN // 2))  # packed pairs, rows swizzled like the tiles
            if gelu:  # float32, rows swizzled by f32_unit (gelu_fits: it fits the buffers; the plain op's may not)
                stage = tc.tile(cuda.shared.array(0, float32, alignment=1024), 0, (BM * BN,))
            warp = (tid % 128) // 32
            g = lane // 4
            t = lane % 4
            r = row0 + warp * 16 + g
            for j in range(BN // 8):  # a constant trip count: fully unrolled, acc[...] stays in registers
                col = j * 8 + 2 * t
                if gelu:  # the GELU (an erf a value) waits for the store loop: this body stays small
                    stage_f32(stage, r, col, BN, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3])
                else:
                    out[r, tc.swizzle(r, col, BN) // 2] = pack(acc[4 * j], acc[4 * j + 1])
                    out[r + 8, tc.swizzle(r + 8, col, BN) // 2] = pack(acc[4 * j + 2], acc[4 * j + 3])
            cuda.syncthreads()
            if gelu:  # the consumers store (their registers to spare): 16-byte chunks, consecutive along rows
                act_store(c, bias, stage, m0, n0, tid - 128, consumers, BM, BN, bf16)
        if not gelu:
            flat = tc.tile(words, 0, (BM * BN // 2,))
            chunks = BM * BN // 8
            for q in range((chunks + threads - 1) // threads):  # 16-byte chunks, consecutive along rows
                ch = tid + threads * q
                if ch < chunks:
                    row = ch // (BN // 8)
                    col = (ch % (BN // 8)) * 8
                    chunk = pnex.vload(flat, row * (BN // 2) + tc.swizzle(row, col, BN) // 2, 4)
                    tc.store_words(c, (m0 + row, n0 + col), chunk)
        if cluster > 1:
            tc.cluster_sync()  # no block exits while the other's consumers may still arrive on its barriers

    return linear_tma


SMEM_LIMIT = 227 * 1024  # an sm_90 block's shared memory
# The persistent kernel's (producer, consumer) registers: 128 x (168 - 24) given back cover
# 256 x (240 - 168) taken (gemm_pingpong.REGS[1] is this); at 232 its consumers spilled two words.
PERSISTENT_REGS = (24, 240)
# In 2-block clusters the producer's multicast (its rank, half tile and mask) spilled at 24 (72-80 bytes
# of local memory, sm_90a); at 128 x 40 + 256 x 232 (gemm_pingpong.REGS[2] is this) 16 bytes are left:
# a consumer word reloaded twice a tile, outside the k-loop, and the producer's few.
PERSISTENT_CLUSTER_REGS = (40, 232)


#: The persistent kernel's shared memory (its ``shared_bytes=``): the tile buffers, two chunks of
#: C (32 KiB), the barriers, two tiles' bias in float32 (the fused epilogue's; counted for the
#: plain kernel too).
PERSISTENT_SMEM = f"STAGES * ({BM} + BN) * {BK * 2} + {BM * CHUNK * 4} + 16 * STAGES + 8 * BN"


def _persistent_smem(bn: int, stages: int) -> int:
    """:data:`PERSISTENT_SMEM` in bytes for one ``BN`` and ``STAGES`` (to refuse what does not fit)."""
    return eval(PERSISTENT_SMEM, {"__builtins__": {}}, {"BN": bn, "STAGES": stages})  # our own constant text


def make_linear_persistent(dtype="f16", bn=256, stages=4, group=8, gelu=False, activation="gelu_poly", cluster=1):
    """:func:`make_linear_tma` as a persistent kernel: ``blocks`` blocks (one an SM) walk
    the tiles of C in steps of ``blocks``; the producer runs on into the next tile's
    k-tiles while the consumers store the last one (the ``STAGES`` buffers keep filling).
    The phase of each buffer runs on across tiles: iteration ``it`` of the block uses
    buffer ``it % STAGES`` in round ``it // STAGES``.

    The consumers store a tile ``CHUNK`` = 64 columns at a time, in C's dtype, through
    the two 16 KiB halves of a 32 KiB buffer in turn: stage the chunk
    (:func:`epilogue.make_chunk16`), a named barrier among the 256 consumer threads (which
    the producer never joins), store it, 16 bytes a thread.  One
    barrier a chunk: a thread stages a chunk into the half the chunk before the last used
    only after the last chunk's barrier, which every consumer reached after storing from
    that half.  So 4 buffers of 48 KiB fit beside it at BN = 256: with a whole 128 x 256
    tile staged (64 KiB) only 3 did, the producer ran one k-tile ahead of the consumers,
    and on an H200 the consumers waited on the buffers' "full" barriers (29% of the stall
    samples; tensor pipe 75-77% against the plain kernel's 88%,
    ``benchmarks/results/gemm-ncu-2026-11-28-2148.json``).
    ``gelu=True``: ``c = linear(a, w, bias, a_map, w_map, blocks)``, ``act(a @ w.T +
    bias)`` with ``activation`` (:data:`epilogue.ACTIVATIONS`), applied in registers
    before the staging.  Each consumer thread loads one value of the next tile's bias
    before this tile's k-loop (its latency hidden behind the loop) and stores it, after
    the loop, into the other of two shared float32 rows, which this tile's last barrier
    orders before the next tile's reads (and the last tile's reads of that row before
    this write).

    Measured on an H200 against the kernel before, whose store loops loaded each chunk's
    bias from global memory (a latency exposed four times a tile): the bias-only
    epilogue's cost over the product fell from +8.5/+19.1/+56.4 to +2.8/+6.1/+27.1 us at
    4096^3, 8192 x 4096 x 4096 and 8192 x 16384 x 4096
    (``benchmarks/results/epilogue-pairs-2026-11-29-0720.json``).  Against float32
    staging with the epilogue in the store loop (two barriers a chunk): the product
    213.1/435.6/1730.8 us against 216.6/441.1/1779.0, the GELU kernel no slower
    (``epilogue-pairs-2026-11-29-0741.json``).

    ``cluster=2``: blocks in pairs (thread-block clusters, as cuBLAS's kernel runs on an
    H200) that walk pairs of tiles, adjacent row blocks of one column block, so that each
    producer loads half of W's tile and multicasts it into both blocks
    (:func:`make_linear_tma`'s ``cluster=2``, its buffers' rounds running on across
    tiles); ``blocks`` must then be even, and M a multiple of 256.  On an H200 it was 1-3%
    slower than without clusters (``benchmarks/results/epilogue-pairs-2026-11-29-0500.json``),
    as the non-persistent clustered kernel is no faster than the plain one: not the default."""
    if cluster not in (1, 2):
        raise ValueError(f"make_linear_persistent: cluster must be 1 or 2 blocks, got {cluster!r}")
    bn_choices = tuple(bn) if isinstance(bn, (tuple, list)) else (bn,)
    stage_choices = tuple(stages) if isinstance(stages, (tuple, list)) else (stages,)
    for width in bn_choices:
        if width not in (128, 256):
            raise ValueError(f"make_linear_persistent: BN must be 128 or 256 (whole 64-column chunks, and 128 "
                             f"accumulators a thread at most), got {width}")
        for s in stage_choices:
            if not 2 <= s or _persistent_smem(width, s) > SMEM_LIMIT:
                most = max(n for n in range(2, 16) if _persistent_smem(width, n) <= SMEM_LIMIT)
                raise ValueError(f"make_linear_persistent: STAGES = {s} buffers of {(BM + width) * BK * 2 // 1024} KiB "
                                 f"and the 32 KiB staging buffer do not fit the block's 227 KiB at BN = {width}; give "
                                 f"2 to {most} stages")
    wide = max(bn_choices)
    regs = wide // 2
    wgmma = tc.wgmma if dtype == "f16" else tc.wgmma_bf16
    bf16 = dtype != "f16"
    threads = 384
    consumers = 256
    chunk16 = make_chunk16(activation_named(activation), gelu, bf16, BM, consumers)
    everyone = (1 << cluster) - 1  # the multicast's CTA mask: both blocks of the pair
    producer_regs, consumer_regs = PERSISTENT_REGS if cluster == 1 else PERSISTENT_CLUSTER_REGS
    clusters = {"cluster_dims": (cluster, 1, 1)} if cluster > 1 else {}

    @pnex.jit(
        n_threads=(f"blocks * {threads}",),
        threads_per_block=threads,
        shared_bytes=PERSISTENT_SMEM,
        requires=_tile_rules(wide, cluster),
        **clusters,
    )
    def linear_persistent(
        a: pnex.In(dtype, (None, None)),
        w: pnex.In(dtype, (None, "a.size(1)")),
        bias: pnex.In(dtype, ("w.size(0)",)) if gelu else pnex.Unused,
        a_map: pnex.In("uint8", (128,)),
        w_map: pnex.In("uint8", (128,)),
        c: pnex.Out(dtype, ("a.size(0)", "w.size(0)")),
        blocks: pnex.Scalar("int32"),
        BN: pnex.Tune(*bn_choices),
        STAGES: pnex.Tune(*stage_choices),
    ):
        raw = cuda.shared.array(0, float16, alignment=1024)
        sa = tc.tile(raw, 0, (STAGES, BM, BK))
        sb = tc.tile(raw, STAGES * BM * BK, (STAGES, BN, BK))
        staged = STAGES * (BM + BN) * BK // 2  # in 4-byte words: the staging buffer after the tiles'
        words64 = cuda.shared.array(0, uint64, alignment=1024)
        bars = tc.tile(words64, staged // 2 + BM * CHUNK // 2, (2 * STAGES,))  # full: s, empty: STAGES + s
        sbias = tc.tile(cuda.shared.array(0, float32, alignment=1024), staged + BM * CHUNK + 4 * STAGES, (2 * BN,))
        stage16 = tc.tile(cuda.shared.array(0, uint32, alignment=1024), staged, (BM * CHUNK,))  # 2 x BM x CHUNK / 2
        m, k = a.shape
        n = w.shape[0]
        tiles_n = n // BN
        tiles = (m // BM) * tiles_n
        tid = cuda.threadIdx.x
        wg = tid // 128
        lane = tid % 32
        ktiles = k // BK
        acc = cuda.local.array(regs, float32)  # the first wgmma of a tile writes it (accumulate=False)
        part = BN // cluster  # the rows of W's tile this block's producer loads
        rank = tc.cluster_ctarank() if cluster > 1 else 0
        # With clusters, grouped_tile's tiles 2p and 2p + 1 (adjacent row blocks of one column
        # block) go to the two blocks of one cluster: block b starts at tile b (the pair b // 2,
        # its rank's half) and steps `blocks` tiles, `blocks / 2` pairs, as without.

        init_buffers(bars, STAGES, 8 * cluster, cluster)  # empty: one arrival per consumer warp of the cluster

        if wg == 0:
            tc.setmaxnreg_dec(producer_regs)
            if tid == 0:
                tc.tensor_map_acquire(a_map)
                tc.tensor_map_acquire(w_map)
                it = 0
                for tile in range(cuda.blockIdx.x, tiles, blocks):
                    tile_m, tile_n = grouped_tile(tile, m // BM, tiles_n, group)
                    m0 = tile_m * BM
                    n0 = tile_n * BN
                    for kt in range(ktiles):
                        s = it % STAGES
                        if it >= STAGES:  # the consumers (of both blocks) released this buffer's previous round
                            tc.mbarrier_wait(bars, STAGES + s, (it // STAGES - 1) & 1)
                        tc.mbarrier_arrive_expect_tx(bars, s, (BM + BN) * BK * 2)  # W's halves from both blocks
                        tc.tma_load(sa, (s, 0, 0), a_map, (m0, kt * BK), bars, s)
                        if cluster > 1:
                            tc.tma_load_multicast(sb, (s, rank * part, 0), w_map, (n0 + rank * part, kt * BK), bars,
                                                  s, everyone)
                        else:
                            tc.tma_load(sb, (s, 0, 0), w_map, (n0, kt * BK), bars, s)
                        it += 1
        else:
            tc.setmaxnreg_inc(consumer_regs)
            row0 = (wg - 1) * 64
            ctid = tid - 128
            warp = (tid % 128) // 32
            r = row0 + warp * 16 + lane // 4
            col = 2 * (lane % 4)
            it = 0
            i = 0  # the block's tiles so far: the parity of its bias row
            if gelu:  # the first tile's bias; each later one's is loaded during the tile before
                if ctid < BN and cuda.blockIdx.x < tiles:
                    first_n = grouped_tile(cuda.blockIdx.x, m // BM, tiles_n, group)[1]
                    sbias[ctid] = float32(bias[first_n * BN + ctid])
                tc.named_barrier(1, consumers)
            for tile in range(cuda.blockIdx.x, tiles, blocks):
                tile_m, tile_n = grouped_tile(tile, m // BM, tiles_n, group)
                m0 = tile_m * BM
                n0 = tile_n * BN
                bval = float32(0.0)
                if gelu:
                    if ctid < BN and tile + blocks < tiles:
                        next_n = grouped_tile(tile + blocks, m // BM, tiles_n, group)[1]
                        bval = float32(bias[next_n * BN + ctid])  # stored after the k-loop: its latency is hidden
                for kt in range(ktiles):
                    s = it % STAGES
                    tc.mbarrier_wait(bars, s, (it // STAGES) & 1)
                    tc.wgmma_fence()
                    for kk in range(BK // 16):
                        wgmma(acc, sa, (s, row0, kk * 16), sb, (s, 0, kk * 16), BN, kt > 0 or kk > 0)
                    tc.wgmma_commit()
                    tc.wgmma_wait(1)  # the previous k-tile's wgmma is done: its buffer can be refilled
                    if kt > 0 and lane == 0:  # with clusters, both blocks' producers fill it: each is told
                        release(bars, STAGES + (it - 1) % STAGES, cluster)
                    it += 1
                tc.wgmma_wait(0)
                if lane == 0:  # the tile's last buffer
                    release(bars, STAGES + (it - 1) % STAGES, cluster)
                # One call a chunk, its number a literal: a loop over the chunks is not unrolled
                # (its store loop is too long), and acc[...] went to local memory (64 STL).
                par = i & 1
                if gelu and ctid < BN:  # the next tile's bias: this tile's last barrier orders it before its
                    sbias[(1 - par) * BN + ctid] = bval  # readers, and the last tile's reads before this write
                chunk16(c, stage16, 0, sbias, par * BN, acc, 0, r, col, m0, n0, ctid, 1)
                chunk16(c, stage16, 1, sbias, par * BN, acc, 1, r, col, m0, n0, ctid, 1)
                if BN > 2 * CHUNK:
                    chunk16(c, stage16, 0, sbias, par * BN, acc, 2, r, col, m0, n0, ctid, 1)
                    chunk16(c, stage16, 1, sbias, par * BN, acc, 3, r, col, m0, n0, ctid, 1)
                i += 1
        if cluster > 1:
            tc.cluster_sync()  # no block exits while the other's consumers may still arrive on its barriers

    return linear_persistent


_SMS = {}


def _sm_count(device):
    """The GPU's multiprocessors (the persistent kernel's blocks); 2 on CPU (the simulator)."""
    if device.type != "cuda":
        return 2
    if device not in _SMS:
        import torch

        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


class TmaLinear:
    """``c = a @ w.T`` through :func:`make_linear_tma`'s op: makes (or finds) the tensor
    maps of ``a`` and ``w`` and calls the op (which refuses shapes its tiles do not divide).  ``persistent``:
    :func:`make_linear_persistent`'s op, one block an SM (GELU too).  ``cluster=2``: the
    clustered kernel (W's box is half the tile: each block of a pair loads half), persistent
    or not.
    ``gelu=True``: ``gelu(a @ w.T + bias)``, called ``lin(a, w, bias)`` (``activation``:
    :func:`make_linear_tma`'s).  ``group``: the row blocks :func:`tiles.grouped_tile` walks
    before it steps right (8; 4 and 16 measured within 1% of it on an H200)."""

    def __init__(self, dtype="f16", bn=256, stages=4, persistent=False, cluster=1, gelu=False,
                 activation="gelu_poly", group=8):
        if not isinstance(bn, int):  # W's box is BN rows: one width per op
            raise TypeError(f"TmaLinear: bn must be one int (the box of W's tensor map has BN rows), got {bn!r}")
        self.persistent = persistent
        self.cluster = cluster
        self.gelu = gelu
        if persistent:
            self.op = make_linear_persistent(dtype, bn, stages, group, gelu=gelu, activation=activation,
                                             cluster=cluster)
        else:
            self.op = make_linear_tma(dtype, bn, stages, group, cluster=cluster, gelu=gelu, activation=activation)
        self.bn = bn

    def __call__(self, a, w, bias=None):
        if (bias is not None) != self.gelu:
            raise TypeError("TmaLinear: " + ("the GELU epilogue needs bias: lin(a, w, bias)" if self.gelu else
                                             "bias is for the GELU epilogue (TmaLinear(..., gelu=True))"))
        a_map = tc.tensor_map(a, (BM, BK))
        w_map = tc.tensor_map(w, (self.bn // self.cluster, BK))
        fused = (bias,) if self.gelu else ()
        if not self.persistent:
            return self.op(a, w, *fused, a_map, w_map)
        tiles = (a.shape[0] // BM) * (w.shape[0] // self.bn)
        blocks = min(tiles, _sm_count(a.device))
        return self.op(a, w, *fused, a_map, w_map, blocks - blocks % self.cluster)  # whole clusters

    def __getattr__(self, name):
        return getattr(self.op, name)
