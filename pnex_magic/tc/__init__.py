"""Tensor cores from a pnex kernel: warp-level matrix multiply-accumulate, fragment
loads from shared memory, asynchronous copies, and warp and block reductions.

Numba-CUDA has no way to the tensor cores; these primitives are that way.  Each is
one PTX instruction on the GPU (a Numba intrinsic with inline assembly: no call, the
fragments in registers) and a NumPy reference on CPU tensors, where numba-cuda's
simulator runs the kernel (:mod:`.simulate`), with the fragment layouts of the PTX
ISA (:mod:`.layouts`).  Inside a kernel::

    from pnex_magic import tc

    acc = cuda.local.array((MI, NI, 4), float32)   # accumulators: 16 x 8 per (i, j)
    af = cuda.local.array((MI, 4), uint32)          # A fragments: 16 x 16 halves per i
    bf = cuda.local.array((NI, 2), uint32)          # B fragments: 16 x 8 halves per j
    ...
    tc.cp_async(sa, (row, tc.swizzle(row, col, BK)), a, (m0 + row, k0 + col))
    tc.cp_async_commit()
    tc.cp_async_wait(0)
    cuda.syncthreads()
    tc.ldmatrix(af[i], sa, (r, tc.swizzle(r, c, BK)))         # x4: one 16 x 16 A tile
    tc.ldmatrix(bf4, sb, (k, tc.swizzle(k, n, BN)), 4, True)   # x4.trans: two 16 x 8 B tiles
    tc.mma(acc[i, j], af[i], bf[j])                            # acc += A @ B

Primitives (``lane = 4 * g + t``; the layouts are :mod:`.layouts`' tables):

``mma(acc, a, b)``, ``mma_bf16(acc, a, b)``
    ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}``: ``acc`` (4 float32) ``+=``
    A (16 x 16, ``a``: 4 uint32 words of two halves) @ B (16 x 8, ``b``: 2 words).
    Lane ``(g, t)`` holds accumulators (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
    Needs sm_80 or newer.
``mma_tf32(acc, a, b)``
    ``m16n8k8`` on tf32 words (``to_tf32(x)`` rounds a float32 to one).
``ldmatrix(frag, tile, index, count=4, trans=False)``
    ``ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16``: lane ``8 j + r`` gives
    the address of row ``r`` of 8 x 8 matrix ``j`` as ``tile[index]`` (16 aligned bytes
    of a shared tile of 16-bit elements); ``frag`` gets one word per matrix.  The x4
    load of rows ``lane % 16`` at column ``8 * (lane // 16)`` of a row-major 16 x 16
    tile is exactly ``mma``'s A fragment; with ``trans`` from a row-major (k, n) tile,
    rows ``lane % 16`` at column ``8 * (lane // 16)`` give two B fragments.
``cp_async(dst, dst_index, src, src_index, valid=True)``
    ``cp.async.cg.shared.global``: 16 bytes from ``src[src_index]`` (global memory) to
    ``dst[dst_index]`` (shared), both 16-byte aligned, in the background; zeros where
    ``valid`` is false (the tile's edge).  ``cp_async_commit()`` closes a group of
    copies; ``cp_async_wait(n)`` waits until at most ``n`` groups are pending (a
    constant), after which a ``cuda.syncthreads()`` makes the tile visible to the block.
``swizzle(row, col, row_elems)``
    The column at which element (row, col) of a row-major tile of 16-bit elements,
    ``row_elems`` to a row, is stored so that ``ldmatrix`` and ``cp_async`` meet no
    bank conflicts: 16-byte chunks are permuted within each 128-byte line (CUTLASS's
    ``Swizzle<3,4,3>`` for rows of 128 bytes or more).  Store and load through it.
``pack_f16x2(lo, hi)``, ``pack_bf16x2(lo, hi)``, ``to_tf32(x)``
    A fragment word from two values (round to nearest): how an accumulator tile becomes
    the A operand of the next ``mma`` (attention's P @ V).
``unpack_f16x2(word)``, ``unpack_bf16x2(word)``
    The two float32 values of a packed pair (low half first; exact): a 16-byte vector of
    float16/bfloat16 read from shared memory as four words, back to arithmetic.
``exp2_approx(x)``
    ``2 ** x`` in float32 by ``ex2.approx.ftz.f32``, one instruction (relative error within
    2**-21, subnormals flushed to zero): ``math.exp2`` wraps the same instruction in the
    handling of subnormal results (softmax and GELU epilogues).
``store_pair(array, index, lo, hi)``
    Two float32 values rounded to a float16/bfloat16 array's dtype and stored as one
    32-bit word at ``array[index]`` (``index`` even along the last axis).
``tile(raw, offset, shape)``
    A C-contiguous view of ``shape`` from a 1-D array (dynamic shared memory,
    ``jit(shared_bytes=...)``) at element ``offset``: pointer arithmetic, where Numba's
    ``.reshape`` calls a C function.
``wgmma(acc, a, a_index, b, b_index, n)``, ``wgmma_bf16(...)``
    Hopper (sm_90a): ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32``, issued by a
    warpgroup (4 consecutive warps, 128 threads): 64 x n accumulators (``n // 2`` a
    thread; warp ``w`` holds rows 16 w.. in ``mma``'s accumulator layout, one m16n8 tile
    per 8 columns) ``+=`` A @ B^T, both operands read from shared memory through
    descriptors: K-major tiles of 64 16-bit elements a row (128 bytes) stored through
    ``swizzle(row, col, 64)``, 1024-byte aligned.  ``wgmma_fence()`` before,
    ``wgmma_commit()`` and ``wgmma_wait(n)`` after; ``fence_async_shared()`` after
    writing a tile (``cp_async`` included) and before the barrier that publishes it.
``tma_load(tile, index, desc, (row, col), bars, i)``, ``mbarrier_init/arrive/arrive_expect_tx/wait``
    Hopper's Tensor Memory Accelerator: one thread copies the box of the tensor map ``desc``
    (``tensor_map(tensor, (rows, cols))`` on the host; a ``pnex.In("uint8", (128,))``
    parameter) from ``(row, col)`` into ``tile[index]`` in the 128-byte swizzle, zeros
    outside the tensor, completing its bytes on the mbarrier ``bars[i]`` (a shared uint64
    array); readers wait on its phase (``mbarrier_wait(bars, i, round % 2)``).
    ``tensor_map_acquire(desc)`` before the first copy; ``named_barrier(i, threads)``;
    ``setmaxnreg_inc(n)`` / ``setmaxnreg_dec(n)`` move registers between warpgroups (the
    kernel then compiles with its block size as launch bounds).  sm_90.
``cluster_ctarank()``, ``cluster_sync()``, ``mbarrier_arrive_cluster(bars, i, rank)``, ``tma_load_multicast(..., cta_mask)``
    Thread-block clusters (``jit(cluster_dims=(x, y, z))``, sm_90): the block's rank in its
    cluster (x fastest); a barrier of every thread of the cluster (after ``mbarrier_init``,
    before the other blocks use the barriers; before exiting while others may still reach
    this block); one arrival on ``bars[i]`` of block ``rank`` (``mapa``: the barrier at
    the same place of its shared memory); ``tma_load`` into every block whose rank is a
    bit of the 16-bit ``cta_mask``, completing the bytes on each one's barrier.
    ``fence_mbarrier_init_cluster()`` (``mbarrier_init`` issues it too).  A constant rank
    or mask outside the cluster is refused at definition; the simulator runs a cluster's
    blocks at once.
``warp_sum(x)``, ``warp_max(x)``, ``block_sum(x, scratch)``, ``block_max(x, scratch)``, ``block_scan_sum(x, scratch)``
    Reductions over the warp (shuffles) or the block (1-D blocks of whole warps;
    ``scratch``: a shared array of at least one element per warp); the scan is
    inclusive.

Shared tiles: declare them aligned.  Numba aligns a shared array to its element size
(``.shared .align 2`` for float16 in the PTX), so a tile may start 2 bytes past a
16-byte boundary, where ``cp.async`` and ``ldmatrix`` fault.  Declare
``cuda.shared.array(shape, float16, alignment=128)`` (16 bytes is the instructions'
minimum; from a 128-byte boundary the swizzle is conflict-free), and
``alignment=1024`` for ``wgmma`` tiles, whose 128-byte swizzle is a function of the
address: a tile 128 but not 1024 bytes aligned gives wrong products, without a fault.
``alignment=`` is emitted as the PTX's ``.align``.

What each primitive requires of its operands (:mod:`.rules`): a span in bounds along
the last axis, which is contiguous, from an aligned address (``cp_async``: 16 bytes
of each side, the source only where ``valid``; ``ldmatrix``: 8 elements from each
lane's index, for the lanes ``count`` reads; ``store_pair``: 2 elements, 4-byte
aligned; ``wgmma``: 64 x 16 (A) and ``n`` x 16 (B) elements from a row that is a
multiple of 8 and a column that is a multiple of 16, of tiles with rows of 64
elements, their row block 1024-byte aligned); fragments of their lengths (``mma``:
exactly 4, 4 and 2 (tf32 included); ``ldmatrix``: at least ``count``; ``wgmma``: at
least ``n // 2`` accumulators); whole warps (warpgroups for ``wgmma``).  Where they
are checked:

* types: at definition, by Numba's typing (a fragment of the wrong dtype names the
  primitive and the operand; ``cp_async`` between arrays of different element sizes;
  an index with the wrong number of subscripts), and by the simulator in the same words;
* the CPU simulator raises on any violation (a shared tile declared with less
  alignment than an instruction needs included, wherever NumPy placed it);
* a checked launch (``check=True``, ``%%pnex --check``, ``PNEX_CHECK=1``), on the GPU
  or in the simulator, records the first violation and skips the instruction (a warp
  or a warpgroup skips it together) and raises :class:`~pnex_magic.KernelIndexError`
  naming the primitive, the operand and the line.  On the GPU the alignment checked
  is the address's, so a tile that Numba's default happened to place well passes.
  As for subscripts, the calls checked are the kernel's own, not a device function's;
* the fast GPU variant checks nothing at run time: an out-of-bounds index or a short
  fragment there reads or writes what lies beyond, and a misaligned address faults.

``mma`` needs sm_80 or newer, ``wgmma`` sm_90 exactly (it is an sm_90a instruction:
Blackwell's sm_100 has none); a kernel that calls one is refused at definition for any
other GPU, naming the primitive.  ``backward="auto"`` refuses them, naming the line:
attach a hand-written backward with ``pnex.attach_backward``.
"""

from .api import *  # noqa: F401,F403 - the primitives
from .api import __all__  # noqa: F401
from .tensormap import tensor_map  # noqa: F401 - host side: the descriptor tma_load reads

# The compile stage registers the GPU implementations (.lowering.register_cuda).
