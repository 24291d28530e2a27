"""C = A @ W^T on Hopper as a persistent kernel whose two consumer warpgroups take
turns (CUTLASS's "ping-pong" schedule), so that one's epilogue runs while the other's
k-loop keeps the tensor cores busy; a pnex kernel.

A (M, K) and W (N, K) row-major (``torch.nn.functional.linear``'s ``x @ w.T``),
float16 or bfloat16; C (M, N) of the same dtype, accumulated in float32.  One block of
384 threads an SM walks the tiles of C (tile ``blockIdx.x``, then every ``blocks``-th
after it, in :func:`tiles.grouped_tile`'s order); a tile is 128 x 128 (``tile=(128,
128)``: two ``wgmma`` m64n128k16 a step of 16) or 64 x 256 (one m64n256k16):

* warpgroup 0 is the producer: one thread loads, tile after tile, each k-tile of 64 (A's
  box and W's, by TMA, in the 128-byte swizzle) into one of ``STAGES`` buffers, waiting
  on a buffer's "empty" barrier before it refills it;
* warpgroups 1 and 2 compute alternate tiles of the block (its 1st, 3rd, ... and 2nd,
  4th, ...), each with a whole tile's 128 float32 accumulators a thread: while one runs
  its k-loop the other stages its finished tile in shared memory and stores it, the
  bias and GELU (``gelu=True``) applied in the store loop.

Iteration ``it`` of the block (its tile ``i``, k-tile ``kt``: ``it = i * ktiles + kt``)
uses buffer ``it % STAGES`` in round ``it // STAGES``, so each consumer finds its buffers
and phases without asking the other.  But an mbarrier's wait names a phase by its parity
alone, and a warpgroup done with its epilogue would wait for its next tile's round of a
buffer while the round before it (the other warpgroup's) had not even been loaded: the
parity of two rounds back matches, and the wait returns on a stale buffer.  So the turns
are explicit: a "turn" barrier completes once per tile, when its warpgroup has waited for
all its k-tiles, and the block's tile ``i`` starts after completion ``i - 1`` (the
simulator found this: without it, 32731 wrong elements of 131072).  The two epilogues
share one float32 staging tile (64 KiB, laid out by :func:`epilogue.f32_unit`), ordered
the same way by a "staged" barrier.  M and N must be multiples of the tile, K of 64.
Needs an sm_90 GPU.

Measured on an H200 (``benchmarks/results/tensor-cores-2026-11-28-1607.json``,
``-1557.json``, ``-1611.json``): the 128 x 128 kernel runs the plain GEMM at 0.80-0.94x
cuBLAS, 4-6% behind :mod:`gemm_tma`'s cooperative 128 x 256 kernel in every row, and its
fused GELU epilogue is not hidden: the tensor pipe is busy 84% of the time without it and 73% with it (the
cooperative kernel: 88% and 76%).  docs/performance.md has the figures.
"""

from numba import cuda, float32, uint64
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from epilogue import activation_store, plain_store, stage_f32
from gemm_tma import BK, PERSISTENT_CLUSTER_REGS, PERSISTENT_REGS, _sm_count
from tiles import grouped_tile, init_buffers, release, tile_rule

TILES = ((128, 128), (64, 256))  # a warpgroup's tile: two wgmma m64n128k16 a step, or one m64n256k16
THREADS = 384
# Registers a thread, (producer, consumers): the 384 x 168 the block is launched with, less
# what the producer gives back, 128 x (168 - producer), must cover what the consumers take,
# 256 x (consumers - 168): setmaxnreg.inc waits until the pool has them (32 and 240 hung
# the GPU).  Unclustered, the same split as gemm_tma's persistent kernel (the same 384-thread
# block); the clustered producer's multicast needs more than 24 (it spilled 98 words).
REGS = {1: PERSISTENT_REGS, 2: PERSISTENT_CLUSTER_REGS}


def _smem_bytes(stages: int, tm: int = 128, tn: int = 128) -> int:
    """The block's shared memory: the tile buffers, the float32 staging tile and the
    barriers (full and empty per buffer, and the staging tile's)."""
    return stages * (tm + tn) * BK * 2 + tm * tn * 4 + 8 * (2 * stages + 2)


def make_linear_pingpong(dtype="f16", stages=5, group=8, gelu=False, cluster=1, tile=(128, 128),
                         activation="gelu_poly"):
    """The pnex op ``c = linear(a, w, a_map, w_map, blocks)`` (``a @ w.T``), or with
    ``gelu=True`` ``c = linear(a, w, bias, a_map, w_map, blocks)``: ``gelu(a @ w.T +
    bias)``, the exact GELU in float32 (:func:`epilogue.gelu_poly`).  ``stages``: the buffers in flight (a
    ``Tune`` choice, or one value): 5 at most for 128 x 128 tiles, 4 for 64 x 256 (what
    fits beside the staging tile).
    ``blocks``: the grid (one block an SM: :class:`PingPongLinear` gives it).

    ``cluster=2``: clusters of two blocks that compute adjacent row blocks of one column
    block of C at a time (tiles ``2p`` and ``2p + 1`` of :func:`tiles.grouped_tile`'s
    order), so they read the same 128 x 64 k-tiles of W: each block's producer loads 64
    of its rows and multicasts them into both blocks (``tma_load_multicast``), which
    takes a k-tile's traffic from L2 from 32 KiB a block to 24, what the 128 x 256
    tiles of :mod:`gemm_tma` read.  A buffer is then free when the consumers of both
    blocks have released it (each consumer warp arrives on the "empty" barrier of both:
    8 arrivals a round); ``w_map``'s box is 64 rows, M a multiple of 256 and ``blocks``
    even.  ``activation``: the epilogue's function (:func:`gemm_tma.make_linear_tma`'s)."""
    if cluster not in (1, 2):
        raise ValueError(f"make_linear_pingpong: cluster must be 1 or 2 blocks, got {cluster!r}")
    if tuple(tile) not in TILES:
        raise ValueError(f"make_linear_pingpong: tile must be (128, 128) or (64, 256) (a warpgroup's 128 float32 "
                         f"accumulators a thread), got {tile!r}")
    TM, TN = tile
    most = max(s for s in range(2, 9) if _smem_bytes(s, TM, TN) <= 227 * 1024)
    stage_choices = tuple(stages) if isinstance(stages, (tuple, list)) else (stages,)
    for s in stage_choices:
        if not 2 <= s <= most:
            raise ValueError(f"make_linear_pingpong: stages must be 2 to {most} for {TM} x {TN} tiles (each buffer "
                             f"is {(TM + TN) * BK * 2 // 1024} KiB, and the staging tile takes "
                             f"{TM * TN * 4 // 1024} KiB of the 227), got {s}")
    wgmma = tc.wgmma if dtype == "f16" else tc.wgmma_bf16
    bf16 = dtype != "f16"
    half = TN // 2  # accumulators a thread holds for each 64 rows of the tile
    producer_regs, consumer_regs = REGS[cluster]
    everyone = (1 << cluster) - 1  # the multicast's CTA mask: every block of the cluster
    part = TN // cluster  # the rows of W's k-tile this block's producer loads
    clusters = {"cluster_dims": (cluster, 1, 1)} if cluster > 1 else {}
    act_store = activation_store(activation)

    @pnex.jit(
        n_threads=(f"blocks * {THREADS}",),
        threads_per_block=THREADS,
        shared_bytes=f"STAGES * {(TM + TN) * BK * 2} + {TM * TN * 4} + 8 * (2 * STAGES + 2)",
        requires={**tile_rule("a.size(0)", TM * cluster, "M",
                              "the tile's rows" if cluster == 1 else "the rows of the cluster's 2 tiles"),
                  **tile_rule("w.size(0)", TN, "N", "the tile's columns"),
                  **tile_rule("a.size(1)", BK, "K", "the k-tile BK", minimum=BK),
                  f"blocks >= 1 and blocks % {cluster} == 0": f"blocks must be a positive multiple of {cluster}"},
        **clusters,
    )
    def linear_pingpong(
        a: pnex.In(dtype, (None, None)),
        w: pnex.In(dtype, (None, "a.size(1)")),
        bias: pnex.In(dtype, ("w.size(0)",)) if gelu else pnex.Unused,
        a_map: pnex.In("uint8", (128,)),
        w_map: pnex.In("uint8", (128,)),
        c: pnex.Out(dtype, ("a.size(0)", "w.size(0)")),
        blocks: pnex.Scalar("int32"),
        STAGES: pnex.Tune(*stage_choices),
    ):
        raw = cuda.shared.array(0, float16, alignment=1024)
        sa = tc.tile(raw, 0, (STAGES, TM, BK))
        sb = tc.tile(raw, STAGES * TM * BK, (STAGES, TN, BK))
        floats = STAGES * (TM + TN) * BK // 2  # the staging tile, in 4-byte words, after the buffers
        stage = tc.tile(cuda.shared.array(0, float32, alignment=1024), floats, (TM * TN,))
        bars = tc.tile(cuda.shared.array(0, uint64, alignment=1024), floats // 2 + TM * TN // 2, (2 * STAGES + 2,))
        staged = 2 * STAGES  # full: s, empty: STAGES + s, the staging tile's: 2 STAGES, the turns': 2 STAGES + 1
        turn = staged + 1
        m, k = a.shape
        n = w.shape[0]
        tiles_m = m // TM
        tiles_n = n // TN
        tiles = tiles_m * tiles_n
        ktiles = k // BK
        tid = cuda.threadIdx.x
        wg = tid // 128
        lane = tid % 32
        rank = tc.cluster_ctarank() if cluster > 1 else 0
        first = cuda.blockIdx.x // cluster  # this block's cluster: its tiles are cluster * t + rank
        step = blocks // cluster

        if tid == 0:
            tc.mbarrier_init(bars, staged, 1)  # the staging tile read: one arrival per epilogue
            tc.mbarrier_init(bars, turn, 1)  # a tile's k-tiles all arrived: one arrival per tile
        init_buffers(bars, STAGES, 4 * cluster, cluster)  # empty: one arrival per warp that read it, each block

        if wg == 0:
            tc.setmaxnreg_dec(producer_regs)
            if tid == 0:
                tc.tensor_map_acquire(a_map)
                tc.tensor_map_acquire(w_map)
                s = 0
                phase = 0
                it = 0
                for t in range(first, tiles // cluster, step):
                    tile_m, tile_n = grouped_tile(t * cluster + rank, tiles_m, tiles_n, group)
                    for kt in range(ktiles):
                        if it >= STAGES:  # the buffer's previous round was released by its reader
                            tc.mbarrier_wait(bars, STAGES + s, phase ^ 1)
                        tc.mbarrier_arrive_expect_tx(bars, s, (TM + TN) * BK * 2)
                        tc.tma_load(sa, (s, 0, 0), a_map, (tile_m * TM, kt * BK), bars, s)
                        if cluster > 1:  # half of W's rows, into both blocks
                            tc.tma_load_multicast(sb, (s, rank * part, 0), w_map, (tile_n * TN + rank * part, kt * BK),
                                                  bars, s, everyone)
                        else:
                            tc.tma_load(sb, (s, 0, 0), w_map, (tile_n * TN, kt * BK), bars, s)
                        it += 1
                        s += 1
                        if s == STAGES:
                            s = 0
                            phase ^= 1
        else:
            tc.setmaxnreg_inc(consumer_regs)
            me = wg - 1  # this warpgroup computes the block's tiles me, me + 2, ...
            wt = tid % 128
            warp = wt // 32
            r = warp * 16 + lane // 4  # the accumulator rows of this thread: r, r + 8, and 64 more
            col = 2 * (lane % 4)
            acc0 = cuda.local.array(half, float32)  # rows 0-63 of the tile
            acc1 = cuda.local.array(half, float32)  # rows 64-127 (TM = 128)
            i = me
            for t in range(first + me * step, tiles // cluster, 2 * step):
                tile_m, tile_n = grouped_tile(t * cluster + rank, tiles_m, tiles_n, group)
                it = i * ktiles
                s = it % STAGES
                phase = (it // STAGES) & 1
                last = s
                if i > 0:  # the block's previous tile (the other warpgroup's) has had all its k-tiles
                    tc.mbarrier_wait(bars, turn, (i - 1) & 1)
                for kt in range(ktiles):
                    tc.mbarrier_wait(bars, s, phase)
                    tc.wgmma_fence()
                    for kk in range(BK // 16):
                        wgmma(acc0, sa, (s, 0, kk * 16), sb, (s, 0, kk * 16), TN, kt > 0 or kk > 0)
                        if TM == 128:  # a constant: the 64 x 256 tile has one
                            wgmma(acc1, sa, (s, 64, kk * 16), sb, (s, 0, kk * 16), TN, kt > 0 or kk > 0)
                    tc.wgmma_commit()
                    tc.wgmma_wait(1)  # the previous k-tile's wgmma is done: its buffer can be refilled
                    if kt > 0 and lane == 0:
                        release(bars, STAGES + last, cluster)
                    last = s
                    s += 1
                    if s == STAGES:
                        s = 0
                        phase ^= 1
                if wt == 0:  # every k-tile of this tile has arrived: the other warpgroup's turn
                    tc.mbarrier_arrive(bars, turn)
                tc.wgmma_wait(0)
                if lane == 0:  # the tile's last buffer
                    release(bars, STAGES + last, cluster)
                if i > 0:  # the block's previous epilogue (the other warpgroup's) has read the staging tile
                    tc.mbarrier_wait(bars, staged, (i - 1) & 1)
                for j in range(half // 4):  # a constant trip count: unrolled, the accumulators stay in registers
                    stage_f32(stage, r, j * 8 + col, TN, acc0[4 * j], acc0[4 * j + 1], acc0[4 * j + 2], acc0[4 * j + 3])
                    if TM == 128:
                        stage_f32(stage, r + 64, j * 8 + col, TN, acc1[4 * j], acc1[4 * j + 1], acc1[4 * j + 2],
                                  acc1[4 * j + 3])
                tc.named_barrier(1 + me, 128)  # the tile is staged
                if gelu:
                    act_store(c, bias, stage, tile_m * TM, tile_n * TN, wt, 128, TM, TN, bf16)
                else:
                    plain_store(c, stage, tile_m * TM, tile_n * TN, wt, 128, TM, TN, bf16)
                tc.named_barrier(1 + me, 128)  # every thread of this warpgroup has read the staging tile
                if wt == 0:
                    tc.mbarrier_arrive(bars, staged)
                i += 2
        if cluster > 1:
            tc.cluster_sync()  # no block exits while the other's consumers may still arrive on its barriers

    return linear_pingpong


class PingPongLinear:
    """``c = a @ w.T`` (``gelu=True``: ``gelu(a @ w.T + bias)``, called ``lin(a, w,
    bias)``) through :func:`make_linear_pingpong`'s op: makes (or finds) the tensor maps
    of ``a`` and ``w`` (128 x 64 boxes) and launches one block an SM (at most one a tile)."""

    def __init__(self, dtype="f16", stages=5, gelu=False, cluster=1, tile=(128, 128), activation="gelu_poly"):
        self.gelu = gelu
        self.cluster = cluster
        self.tile = tuple(tile)
        self.op = make_linear_pingpong(dtype, stages, gelu=gelu, cluster=cluster, tile=tile,
                                       activation=activation)

    def __call__(self, a, w, bias=None):
        if (bias is not None) != self.gelu:
            raise TypeError("PingPongLinear: " + ("the GELU epilogue needs bias: lin(a, w, bias)" if self.gelu else
                                                  "bias is for the GELU epilogue (PingPongLinear(..., gelu=True))"))
        tm, tn = self.tile
        a_map = tc.tensor_map(a, (tm, BK))
        w_map = tc.tensor_map(w, (tn // self.cluster, BK))
        tiles = (a.shape[0] // tm) * (w.shape[0] // tn)
        blocks = max(self.cluster, min(tiles, _sm_count(a.device)) // self.cluster * self.cluster)
        if self.gelu:
            return self.op(a, w, bias, a_map, w_map, blocks)
        return self.op(a, w, a_map, w_map, blocks)

    def __getattr__(self, name):
        return getattr(self.op, name)
