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
``store_pair(array, index, lo, hi)``
    Two float32 values rounded to a float16/bfloat16 array's dtype and stored as one
    32-bit word at ``array[index]`` (``index`` even along the last axis).
``wgmma(acc, a, a_index, b, b_index, n)``, ``wgmma_bf16(...)``
    Hopper (sm_90a): ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32``, issued by a
    warpgroup (4 consecutive warps, 128 threads): 64 x n accumulators (``n // 2`` a
    thread; warp ``w`` holds rows 16 w.. in ``mma``'s accumulator layout, one m16n8 tile
    per 8 columns) ``+=`` A @ B^T, both operands read from shared memory through
    descriptors: K-major tiles of 64 16-bit elements a row (128 bytes) stored through
    ``swizzle(row, col, 64)``, 1024-byte aligned.  ``wgmma_fence()`` before,
    ``wgmma_commit()`` and ``wgmma_wait(n)`` after; ``fence_async_shared()`` after
    writing a tile (``cp_async`` included) and before the barrier that publishes it.
``warp_sum(x)``, ``warp_max(x)``; ``block_sum(x, scratch)``, ``block_max(x, scratch)``,
``block_scan_sum(x, scratch)``
    Reductions over the warp (shuffles) or the block (1-D blocks of whole warps;
    ``scratch``: a shared array of at least one element per warp); the scan is
    inclusive.

Shared tiles must start 16-byte aligned (128-byte aligned for the swizzle to avoid
conflicts): declare them first, or with sizes that are multiples of 128 bytes.
"""

from __future__ import annotations

from typing import Any

from . import simulate

__all__ = [
    "mma",
    "mma_bf16",
    "mma_tf32",
    "ldmatrix",
    "cp_async",
    "cp_async_commit",
    "cp_async_wait",
    "swizzle",
    "pack_f16x2",
    "pack_bf16x2",
    "store_pair",
    "to_tf32",
    "wgmma",
    "wgmma_bf16",
    "wgmma_fence",
    "wgmma_commit",
    "wgmma_wait",
    "fence_async_shared",
    "warp_sum",
    "warp_max",
    "block_sum",
    "block_max",
    "block_scan_sum",
    "register_cuda",
    "FUNCTIONS",
]


def mma(acc: Any, a: Any, b: Any) -> None:
    """``acc += A @ B``, m16n8k16, float16 inputs, float32 accumulators (see the module)."""
    simulate.mma(acc, a, b, "f16")


def mma_bf16(acc: Any, a: Any, b: Any) -> None:
    """``acc += A @ B``, m16n8k16, bfloat16 inputs, float32 accumulators."""
    simulate.mma(acc, a, b, "bf16")


def mma_tf32(acc: Any, a: Any, b: Any) -> None:
    """``acc += A @ B``, m16n8k8, tf32 inputs, float32 accumulators."""
    simulate.mma(acc, a, b, "tf32")


def ldmatrix(frag: Any, tile: Any, index: Any, count: int = 4, trans: bool = False) -> None:
    """``count`` 8 x 8 matrices of 16-bit elements from a shared tile into ``frag``."""
    simulate.ldmatrix(frag, tile, index, count, trans)


def cp_async(dst: Any, dst_index: Any, src: Any, src_index: Any, valid: bool = True) -> None:
    """16 bytes from global ``src[src_index]`` to shared ``dst[dst_index]``, asynchronously."""
    simulate.cp_async(dst, dst_index, src, src_index, 16, bool(valid))


def cp_async_commit() -> None:
    """Close the group of ``cp_async`` copies issued since the last commit."""


def cp_async_wait(pending: int) -> None:
    """Wait until at most ``pending`` committed groups of copies are still in flight."""


def wgmma(acc: Any, a: Any, a_index: Any, b: Any, b_index: Any, n: int) -> None:
    """Hopper's ``wgmma.mma_async`` m64nNk16, float16: the warpgroup's 64 x ``n``
    float32 accumulators (``acc``: ``n // 2`` per thread) ``+=`` A @ B^T, A 64 x 16 at
    ``a[a_index]`` and B ``n`` x 16 at ``b[b_index]``, both K-major shared tiles of 64
    elements per row stored through :func:`swizzle` (the 128-byte swizzle), 1024-byte
    aligned.  Asynchronous: ``wgmma_fence()`` before, ``wgmma_commit()`` after,
    ``wgmma_wait(n)`` before the accumulators or the tiles are touched again."""
    simulate.wgmma(acc, a, a_index, b, b_index, n, "f16")


def wgmma_bf16(acc: Any, a: Any, a_index: Any, b: Any, b_index: Any, n: int) -> None:
    """:func:`wgmma` on bfloat16 operands."""
    simulate.wgmma(acc, a, a_index, b, b_index, n, "bf16")


def wgmma_fence() -> None:
    """``wgmma.fence``: order the warpgroup's earlier register and shared-memory writes
    before the next ``wgmma``."""


def wgmma_commit() -> None:
    """``wgmma.commit_group``: close the group of ``wgmma`` issued since the last one."""


def wgmma_wait(pending: int) -> None:
    """``wgmma.wait_group``: wait until at most ``pending`` groups are in flight (a constant)."""


def fence_async_shared() -> None:
    """``fence.proxy.async.shared::cta``: make this thread's shared-memory writes
    (``cp_async``'s included, once waited for) visible to ``wgmma``, before the barrier."""


def _swizzle_arithmetic(row, col, row_elems):  # no annotations: Numba compiles it as the overload
    chunk = col >> 3
    if row_elems >= 64:
        chunk = chunk ^ (row & 7)
    elif row_elems == 32:
        chunk = chunk ^ ((row >> 1) & 3)
    elif row_elems == 16:
        chunk = chunk ^ ((row >> 2) & 1)
    return (chunk << 3) | (col & 7)


def swizzle(row: Any, col: Any, row_elems: Any) -> Any:
    """The stored column of element (row, col) of a swizzled tile of 16-bit elements."""
    return _swizzle_arithmetic(row, col, row_elems)


def _half_bits(value: Any, kind: str) -> int:
    import numpy as np

    if kind == "f16":
        return int(np.array(value, dtype=np.float32).astype(np.float16).view(np.uint16))
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:  # NaN stays NaN
        return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def pack_f16x2(lo: Any, hi: Any) -> Any:
    """A uint32 word holding ``lo`` and ``hi`` as float16 (low half first)."""
    import numpy as np

    return np.uint32(_half_bits(lo, "f16") | (_half_bits(hi, "f16") << 16))


def pack_bf16x2(lo: Any, hi: Any) -> Any:
    """A uint32 word holding ``lo`` and ``hi`` as bfloat16 (low half first)."""
    import numpy as np

    return np.uint32(_half_bits(lo, "bf16") | (_half_bits(hi, "bf16") << 16))


def store_pair(array: Any, index: Any, lo: Any, hi: Any) -> None:
    """``array[index] = lo`` and the next element ``= hi``, rounded to the array's
    16-bit float dtype (float16 or bfloat16), as one 32-bit store (``index`` even along
    the last axis): how an accumulator pair reaches a float16/bfloat16 output."""
    target = simulate.unwrap(array)
    idx = index if isinstance(index, tuple) else (index,)
    nxt = idx[:-1] + (idx[-1] + 1,)
    if isinstance(target, simulate.Bf16Shadow):
        target[idx] = pack_rounded_bf16(lo)
        target[nxt] = pack_rounded_bf16(hi)
    else:
        target[idx] = lo
        target[nxt] = hi


def pack_rounded_bf16(x: Any) -> Any:
    """``x`` rounded to bfloat16 (to nearest even), as a float32."""
    import numpy as np

    return np.uint32(_half_bits(x, "bf16") << 16).view(np.float32)


def to_tf32(x: Any) -> Any:
    """The tf32 word of ``x`` (round to nearest, ties away: ``cvt.rna.tf32.f32``)."""
    import numpy as np

    bits = int(np.array(x, dtype=np.float32).view(np.uint32))
    if (bits & 0x7F800000) != 0x7F800000:
        bits = (bits + 0x1000) & 0xFFFFE000
    return np.uint32(bits)


def warp_sum(x: Any) -> Any:
    """The sum of ``x`` over the warp, in every lane."""
    return simulate.collective("warp_sum", x, lambda xs: [_tree(xs, lambda p, q: p + q)] * len(xs))


def warp_max(x: Any) -> Any:
    """The maximum of ``x`` over the warp, in every lane."""
    return simulate.collective("warp_max", x, lambda xs: [_tree(xs, max)] * len(xs))


def _tree(values: list[Any], op: Any) -> Any:
    """The butterfly the GPU computes (xor 16, 8, 4, 2, 1): same order, same rounding."""
    vals = list(values) + [values[0]] * (32 - len(values))
    for step in (16, 8, 4, 2, 1):
        vals = [op(vals[i], vals[i ^ step]) for i in range(32)]
    return vals[0]


def _block_combine(name: str, x: Any, scratch: Any, warp_result: Any, fold: Any) -> Any:
    import threading

    thread = threading.current_thread()
    lane, wid = thread.thread_id % 32, thread.thread_id // 32
    threads = int(thread._manager._block_dim[0] * thread._manager._block_dim[1] * thread._manager._block_dim[2])
    nwarps = (threads + 31) // 32
    if lane == 0:
        scratch[wid] = warp_result
    thread.syncthreads()
    total = fold(scratch, wid, nwarps)
    thread.syncthreads()
    return total


def block_sum(x: Any, scratch: Any) -> Any:
    """The sum of ``x`` over the block (``scratch``: shared, one element per warp)."""
    def fold(s: Any, wid: int, nwarps: int) -> Any:
        total = s[0]
        for w in range(1, nwarps):
            total += s[w]
        return total
    return _block_combine("block_sum", x, scratch, warp_sum(x), fold)


def block_max(x: Any, scratch: Any) -> Any:
    """The maximum of ``x`` over the block."""
    def fold(s: Any, wid: int, nwarps: int) -> Any:
        total = s[0]
        for w in range(1, nwarps):
            total = max(total, s[w])
        return total
    return _block_combine("block_max", x, scratch, warp_max(x), fold)


def block_scan_sum(x: Any, scratch: Any) -> Any:
    """The inclusive prefix sum of ``x`` over the block's threads, in thread order."""
    import threading

    def scan(xs: list[Any]) -> list[Any]:
        vals = list(xs)
        for d in (1, 2, 4, 8, 16):
            vals = [vals[i] + vals[i - d] if i >= d else vals[i] for i in range(len(vals))]
        return vals

    v = simulate.collective("block_scan_sum", x, scan)
    thread = threading.current_thread()
    lane, wid = thread.thread_id % 32, thread.thread_id // 32
    threads = int(thread._manager._block_dim[0] * thread._manager._block_dim[1] * thread._manager._block_dim[2])
    nwarps = (threads + 31) // 32
    if lane == 31:
        scratch[wid] = v
    thread.syncthreads()
    before = v - v
    for w in range(nwarps):
        if w < wid:
            before += scratch[w]
    thread.syncthreads()
    return v + before


#: The primitives, by name, for the passes that must know them (the derived backward
#: refuses them; the checked launch bounds-checks their tile accesses).
FUNCTIONS = {name: globals()[name] for name in __all__ if name not in ("register_cuda", "FUNCTIONS")}


def register_cuda() -> None:
    """Register the GPU implementations with Numba (the compile stage calls it)."""
    from .lowering import register_cuda as register

    register()
