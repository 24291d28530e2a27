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
  its k-loop the other applies its epilogue in registers (the bias and GELU,
  ``gelu=True``) and stores its finished tile, 64 x 64 at a time, packed to C's dtype
  through the two 8 KiB halves of its own staging buffer in turn (the persistent kernel
  of :mod:`gemm_tma` does the same with 128 rows: :func:`epilogue.make_chunk16`), one
  named barrier of its 128 threads a chunk.  Its
  next tile's bias (two tiles on) is loaded before this tile's k-loop and stored after
  it into the other of its two shared float32 rows.

Iteration ``it`` of the block (its tile ``i``, k-tile ``kt``: ``it = i * ktiles + kt``)
uses buffer ``it % STAGES`` in round ``it // STAGES``, so each consumer finds its buffers
and phases without asking the other.  But an mbarrier's wait names a phase by its parity
alone, and a warpgroup done with its epilogue would wait for its next tile's round of a
buffer while the round before it (the other warpgroup's) had not even been loaded: the
parity of two rounds back matches, and the wait returns on a stale buffer.  So the turns
are explicit: a "turn" barrier completes once per tile, when its warpgroup has waited for
all its k-tiles, and the block's tile ``i`` starts after completion ``i - 1`` (the
simulator found this: without it, 32731 wrong elements of 131072).  The epilogues need
no such order: each warpgroup stages through its own buffer and bias rows.  M and N must
be multiples of the tile, K of 64.  Needs an sm_90 GPU.

Measured on an H200, timed interleaved with the persistent kernel of :mod:`gemm_tma`
(``benchmarks/results/epilogue-pairs-2026-11-29-1020.json``, ``-1025.json``): with 64 x 256
tiles the fused GELU costs +12, +17-19 and +28-45 us over this kernel's own product at 4096^3,
8192 x 4096 x 4096 and 8192 x 16384 x 4096 (the persistent kernel's: +17, +36-41, +163-175),
mostly hidden under the other warpgroup's k-loop; but the product is 5-7% slower than the
persistent kernel's, its 64-row tiles reading A and W from L2 1.7 times as often (tensor pipe
89% against 93% at the base clock, ``gemm-ncu-2026-11-29-1026.json``), so the fused times tie at
best.  With 128 x 128 tiles the epilogue is not hidden (+24, +45, +190 us).  docs/performance.md
has the figures.
"""

from numba import cuda, float32, uint32, uint64
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from epilogue import CHUNK, activation_named, make_chunk16
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
SLAB = 64  # the rows of a wgmma m64nN: the tile's rows are staged 64 at a time
STAGING_BYTES = 2 * 2 * SLAB * CHUNK * 2  # per consumer warpgroup, two halves of 64 x 64 halves


def _smem_bytes(stages: int, tm: int = 128, tn: int = 128) -> int:
    """The block's shared memory: the tile buffers, each consumer warpgroup's staging buffer
    (two 64 x 64 chunks of C, 16 KiB), two tiles' bias in float32 for each (the fused
    epilogue's; counted for the plain kernel too), and the barriers (full and empty per
    buffer, and the turns')."""
    return stages * (tm + tn) * BK * 2 + STAGING_BYTES + 16 * tn + 8 * (2 * stages + 1)


def make_linear_pingpong(dtype="f16", stages=5, group=8, gelu=False, cluster=1, tile=(128, 128),
                         activation="gelu_poly"):
    """The pnex op ``c = linear(a, w, a_map, w_map, blocks)`` (``a @ w.T``), or with
    ``gelu=True`` ``c = linear(a, w, bias, a_map, w_map, blocks)``: ``gelu(a @ w.T +
    bias)``, the exact GELU in float32 (:func:`epilogue.gelu_poly`).  ``stages``: the buffers in flight (a
    ``Tune`` choice, or one value): 6 at most for 128 x 128 tiles, 4 for 64 x 256 (what
    fits beside the staging buffers).
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
                             f"is {(TM + TN) * BK * 2 // 1024} KiB, and the two staging buffers take "
                             f"{STAGING_BYTES // 1024} KiB of the 227), got {s}")
    wgmma = tc.wgmma if dtype == "f16" else tc.wgmma_bf16
    bf16 = dtype != "f16"
    half = TN // 2  # accumulators a thread holds for each 64 rows of the tile
    producer_regs, consumer_regs = REGS[cluster]
    everyone = (1 << cluster) - 1  # the multicast's CTA mask: every block of the cluster
    part = TN // cluster  # the rows of W's k-tile this block's producer loads
    clusters = {"cluster_dims": (cluster, 1, 1)} if cluster > 1 else {}
    chunk16 = make_chunk16(activation_named(activation), gelu, bf16, SLAB, 128)  # a warpgroup's
    words = STAGING_BYTES // 4  # both warpgroups' staging buffers, in 32-bit words
    mine = words // 2  # one warpgroup's

    @pnex.jit(
        n_threads=(f"blocks * {THREADS}",),
        threads_per_block=THREADS,
        shared_bytes=f"STAGES * {(TM + TN) * BK * 2} + {STAGING_BYTES + 16 * TN} + 8 * (2 * STAGES + 1)",
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
        tiled = STAGES * (TM + TN) * BK // 2  # the staging buffers, in 4-byte words, after the tile buffers
        staging = cuda.shared.array(0, uint32, alignment=1024)
        sbias = tc.tile(cuda.shared.array(0, float32, alignment=1024), tiled + words, (4 * TN,))  # 2 rows a wg
        bars = tc.tile(cuda.shared.array(0, uint64, alignment=1024), (tiled + words + 4 * TN) // 2,
                       (2 * STAGES + 1,))
        turn = 2 * STAGES  # full: s, empty: STAGES + s, the turns': 2 STAGES
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
            stage16 = tc.tile(staging, tiled + me * mine, (mine,))
            barrier = 1 + me  # this warpgroup's named barrier
            acc0 = cuda.local.array(half, float32)  # rows 0-63 of the tile
            acc1 = cuda.local.array(half, float32)  # rows 64-127 (TM = 128)
            mine_first = first + me * step
            if gelu:  # the first tile's bias; each later one's is loaded during the tile before
                if mine_first < tiles // cluster:
                    first_n = grouped_tile(mine_first * cluster + rank, tiles_m, tiles_n, group)[1]
                    for q in range(TN // 128):
                        sbias[2 * me * TN + q * 128 + wt] = float32(bias[first_n * TN + q * 128 + wt])
                tc.named_barrier(barrier, 128)
            i = me
            for t in range(mine_first, tiles // cluster, 2 * step):
                tile_m, tile_n = grouped_tile(t * cluster + rank, tiles_m, tiles_n, group)
                par = (i >> 1) & 1  # this warpgroup's tiles so far: the parity of its bias row
                b0 = float32(0.0)
                b1 = float32(0.0)
                if gelu:  # the next tile's bias, stored after the k-loop: its latency is hidden
                    if t + 2 * step < tiles // cluster:
                        next_n = grouped_tile((t + 2 * step) * cluster + rank, tiles_m, tiles_n, group)[1]
                        b0 = float32(bias[next_n * TN + wt])
                        if TN > 128:
                            b1 = float32(bias[next_n * TN + 128 + wt])
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
                if gelu:  # the next tile's bias row: this tile's last barrier orders the write before its
                    row_of = (2 * me + 1 - par) * TN  # readers, and the last tile's reads of that row before it
                    sbias[row_of + wt] = b0
                    if TN > 128:
                        sbias[row_of + 128 + wt] = b1
                bias0 = (2 * me + par) * TN
                m0 = tile_m * TM
                n0 = tile_n * TN
                # One call a chunk, its number a literal: acc's indices stay constants (registers).
                chunk16(c, stage16, 0, sbias, bias0, acc0, 0, r, col, m0, n0, wt, barrier)
                if TM == 128:  # rows 64-127 of the same columns next: their bias is the same
                    chunk16(c, stage16, 1, sbias, bias0, acc1, 0, r, col, m0 + SLAB, n0, wt, barrier)
                    chunk16(c, stage16, 0, sbias, bias0, acc0, 1, r, col, m0, n0, wt, barrier)
                    chunk16(c, stage16, 1, sbias, bias0, acc1, 1, r, col, m0 + SLAB, n0, wt, barrier)
                else:  # columns 64-255
                    chunk16(c, stage16, 1, sbias, bias0, acc0, 1, r, col, m0, n0, wt, barrier)
                    chunk16(c, stage16, 0, sbias, bias0, acc0, 2, r, col, m0, n0, wt, barrier)
                    chunk16(c, stage16, 1, sbias, bias0, acc0, 3, r, col, m0, n0, wt, barrier)
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
