"""The tensor-core primitives as Python functions: what a kernel calls.  On CPU tensors
the simulator runs them (:mod:`.simulate`'s NumPy references); on the GPU Numba
replaces each with its intrinsic (:mod:`.lowering`).  :mod:`pnex_magic.tc` documents them."""


from __future__ import annotations

from typing import Any

import numpy as np

from . import layouts, rules, simulate, simulate_bulk, simulate_cluster

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
    "unpack_f16x2",
    "unpack_bf16x2",
    "store_pair",
    "store_words",
    "to_tf32",
    "exp2_approx",
    "tile",
    "wgmma",
    "wgmma_bf16",
    "wgmma_fence",
    "wgmma_commit",
    "wgmma_wait",
    "fence_async_shared",
    "mbarrier_init",
    "mbarrier_arrive",
    "mbarrier_arrive_expect_tx",
    "mbarrier_wait",
    "tma_load",
    "tensor_map_acquire",
    "setmaxnreg_inc",
    "setmaxnreg_dec",
    "named_barrier",
    "cluster_ctarank",
    "cluster_sync",
    "mbarrier_arrive_cluster",
    "tma_load_multicast",
    "fence_mbarrier_init_cluster",
    "warp_sum",
    "warp_max",
    "block_sum",
    "block_max",
    "block_scan_sum",
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
    """Wait until at most ``pending`` committed groups of copies are still in flight
    (an integer known when the kernel is compiled, such as ``STAGES - 2`` of a ``Tune``
    parameter; PTX counts 0 to 7, and a count outside waits for 0 or 7: more waiting
    is always safe)."""


def tile(raw: Any, offset: Any, shape: Any) -> Any:
    """The C-contiguous array of ``shape`` (a tuple of ints) made of ``raw``'s elements from
    ``offset`` on: how a kernel carves tiles out of its dynamic shared memory
    (``raw = cuda.shared.array(0, float16, alignment=1024)``).  Numba's own
    ``raw[offset:].reshape(shape)`` does the same through a call to a C function (a
    stack frame and an external call in every kernel that uses it); this is pointer
    arithmetic."""
    array = simulate.unwrap(raw)
    count = 1
    for n in shape:
        count *= int(n)
    start = int(offset)
    if array.ndim != 1 or start < 0 or start + count > array.shape[0]:
        raise IndexError(
            f"pnex.tc.tile: {count} elements from element {start} do not fit a 1-D array of {array.shape} elements"
        )
    view = array[start:start + count].reshape(tuple(int(n) for n in shape))
    return view


def wgmma(acc: Any, a: Any, a_index: Any, b: Any, b_index: Any, n: int, accumulate: bool = True) -> None:
    """Hopper's ``wgmma.mma_async`` m64nNk16, float16: the warpgroup's 64 x ``n``
    float32 accumulators (``acc``: ``n // 2`` per thread) ``+=`` A @ B^T, A 64 x 16 at
    ``a[a_index]`` and B ``n`` x 16 at ``b[b_index]``, both K-major shared tiles of 64
    elements per row stored through :func:`swizzle` (the 128-byte swizzle), 1024-byte
    aligned.  Asynchronous: ``wgmma_fence()`` before, ``wgmma_commit()`` after,
    ``wgmma_wait(n)`` before the accumulators or the tiles are touched again.
    ``accumulate=False``: ``acc = A @ B^T``, whatever ``acc`` held (the first product
    of a tile, instead of zeroing ``n // 2`` registers first)."""
    simulate.wgmma(acc, a, a_index, b, b_index, n, "f16", bool(accumulate))


def wgmma_bf16(acc: Any, a: Any, a_index: Any, b: Any, b_index: Any, n: int, accumulate: bool = True) -> None:
    """:func:`wgmma` on bfloat16 operands."""
    simulate.wgmma(acc, a, a_index, b, b_index, n, "bf16", bool(accumulate))


def wgmma_fence() -> None:
    """``wgmma.fence``: order the warpgroup's earlier register and shared-memory writes
    before the next ``wgmma``."""


def wgmma_commit() -> None:
    """``wgmma.commit_group``: close the group of ``wgmma`` issued since the last one."""


def wgmma_wait(pending: int) -> None:
    """``wgmma.wait_group``: wait until at most ``pending`` groups are in flight (an
    integer known when the kernel is compiled, as for :func:`cp_async_wait`)."""


def fence_async_shared() -> None:
    """``fence.proxy.async.shared::cta``: make this thread's shared-memory writes
    (``cp_async``'s included, once waited for) visible to ``wgmma``, before the barrier."""


def mbarrier_init(bars: Any, index: Any, count: Any) -> None:
    """``mbarrier.init``: barrier ``bars[index]`` (8 bytes of shared memory, a uint64
    element) expects ``count`` arrivals a phase; its first phase has parity 0.  One
    thread initialises; ``cuda.syncthreads()`` before any other thread uses it."""
    simulate_bulk.mbarrier_init(bars, index, count)


def mbarrier_arrive(bars: Any, index: Any) -> None:
    """``mbarrier.arrive``: one of the phase's arrivals."""
    simulate_bulk.mbarrier_arrive(bars, index)


def mbarrier_arrive_expect_tx(bars: Any, index: Any, nbytes: Any) -> None:
    """``mbarrier.arrive.expect_tx``: one arrival, and ``nbytes`` more bytes that copies
    (:func:`tma_load`) must complete before the phase does."""
    simulate_bulk.mbarrier_arrive_expect_tx(bars, index, nbytes)


def mbarrier_wait(bars: Any, index: Any, parity: Any) -> None:
    """Wait until the phase of ``parity`` (0 or 1) of ``bars[index]`` has completed
    (``mbarrier.try_wait.parity`` in a loop).  Phase ``p`` of a barrier used once per
    round ``r`` has parity ``r % 2``."""
    simulate_bulk.mbarrier_wait(bars, index, parity)


def tma_load(tile: Any, index: Any, desc: Any, coords: Any, bars: Any, bar_index: Any) -> None:
    """``cp.async.bulk.tensor.2d``: the box of the tensor map ``desc`` (made by
    :func:`pnex_magic.tc.tensor_map`) whose first element is ``coords = (row, column)``
    of its tensor, into the shared ``tile`` from ``tile[index]`` (box rows x box
    columns elements, stored with the map's swizzle; 1024-byte aligned for the 128-byte
    swizzle), completing its bytes on barrier ``bars[bar_index]``.  Issued by one thread;
    the readers wait on the barrier (after :func:`mbarrier_arrive_expect_tx` of the
    box's bytes).  Elements outside the tensor are read as zeros; the column must be a
    multiple of 16 bytes (8 float16), else the GPU stops with an illegal instruction
    (the simulator raises)."""
    simulate_bulk.tma_load(tile, index, desc, coords, bars, bar_index)


def tensor_map_acquire(desc: Any) -> None:
    """Make the tensor map ``desc`` (device memory, written before the launch) visible to
    the copies of this thread (``fence.proxy.tensormap::generic.acquire``), and prefetch
    it: once, by the thread that issues :func:`tma_load`, before the first."""
    simulate_bulk.check_map("tensor_map_acquire", desc)


def named_barrier(index: Any, threads: Any) -> None:
    """``bar.sync index, threads``: wait until ``threads`` threads (whole warps, a
    multiple of 32) have reached barrier ``index`` (1 to 15; ``cuda.syncthreads()`` is
    barrier 0 of every thread): a barrier among the warpgroups that compute, which the
    producer does not join."""
    simulate_bulk.named_barrier(index, threads)


def cluster_ctarank() -> Any:
    """``%cluster_ctarank``: this block's rank in its thread-block cluster (``jit(cluster_dims=...)``),
    0 to the cluster's blocks - 1, x fastest; 0 in a launch without clusters."""
    return simulate_cluster.cluster_ctarank()


def cluster_sync() -> None:
    """``barrier.cluster.arrive`` + ``barrier.cluster.wait``: wait until every thread of every
    block of the cluster has arrived (every thread calls it, like ``cuda.syncthreads()``);
    their shared-memory writes before it are visible to all after it.  Before a block's
    barriers are used by another (after :func:`mbarrier_init`), and before a block exits
    while others may still reach its shared memory."""
    simulate_cluster.cluster_sync()


def mbarrier_arrive_cluster(bars: Any, index: Any, rank: Any) -> None:
    """``mapa`` + ``mbarrier.arrive.shared::cluster`` (release, at the default .cta scope, as
    CUTLASS's ``ClusterBarrier::arrive``): one arrival on the barrier ``bars[index]`` of the
    cluster's block ``rank`` (the barrier at the same place of its shared memory; ``rank``
    may be this block's own): how the blocks that read a multicast tile tell each block that
    writes into it that its buffer is free."""
    simulate_cluster.mbarrier_arrive_cluster(bars, index, rank)


def tma_load_multicast(tile: Any, index: Any, desc: Any, coords: Any, bars: Any, bar_index: Any, cta_mask: Any) -> None:
    """:func:`tma_load` into every block of the cluster whose rank is a bit of ``cta_mask``
    (``cp.async.bulk.tensor.2d...multicast::cluster``, a 16-bit mask): one read of the box
    from global memory lands at ``tile[index]`` of each of them and completes its bytes on
    each one's ``bars[bar_index]``.  Each block then expects the bytes of every copy that
    lands in it.  The barrier must be initialised in every block of the mask (a
    :func:`cluster_sync` after :func:`mbarrier_init`).  sm_90."""
    simulate_cluster.tma_load_multicast(tile, index, desc, coords, bars, bar_index, cta_mask)


def fence_mbarrier_init_cluster() -> None:
    """``fence.mbarrier_init.release.cluster``: make this thread's :func:`mbarrier_init`
    visible to the cluster's other blocks (whose :func:`mbarrier_arrive_cluster` and
    multicast copies reach it), before the :func:`cluster_sync` that publishes it.
    (:func:`mbarrier_init` issues it after each barrier too.)"""


def _register_count(name: str, count: Any) -> None:
    n = int(count)
    if n % 8 or not 24 <= n <= 256:
        raise ValueError(f"pnex.tc.{name}: the register count must be a multiple of 8 from 24 to 256, got {n}")


def setmaxnreg_inc(count: Any) -> None:
    """``setmaxnreg.inc``: the warpgroup's threads may use up to ``count`` registers (a
    constant; the warpgroups that compute, after a producer gave some back).  The
    simulator checks that the block's warpgroups hold no more than it was launched with
    (:func:`.simulate_bulk.setmaxnreg`): on the GPU the increase would wait forever."""
    _register_count("setmaxnreg_inc", count)
    simulate_bulk.setmaxnreg("setmaxnreg_inc", int(count))


def setmaxnreg_dec(count: Any) -> None:
    """``setmaxnreg.dec``: the warpgroup's threads give registers back, down to ``count``."""
    _register_count("setmaxnreg_dec", count)
    simulate_bulk.setmaxnreg("setmaxnreg_dec", int(count))


def swizzle(row: Any, col: Any, row_elems: Any) -> Any:
    """The stored column of element (row, col) of a swizzled tile of 16-bit elements."""
    return layouts.swizzle_arithmetic(row, col, row_elems)


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


def unpack_f16x2(word: Any) -> tuple:
    """The two float16 values of a 32-bit word (low half first), as float32: the inverse
    of :func:`pack_f16x2` (``cvt.f32.f16``, exact)."""
    bits = int(word) & 0xFFFFFFFF
    halves = np.array([bits & 0xFFFF, bits >> 16], dtype=np.uint16).view(np.float16).astype(np.float32)
    return halves[0], halves[1]


def unpack_bf16x2(word: Any) -> tuple:
    """The two bfloat16 values of a 32-bit word (low half first), as float32: the inverse
    of :func:`pack_bf16x2` (a shift and a mask, exact)."""
    bits = int(word) & 0xFFFFFFFF
    floats = np.array([(bits & 0xFFFF) << 16, bits & 0xFFFF0000], dtype=np.uint32).view(np.float32)
    return floats[0], floats[1]


def store_pair(array: Any, index: Any, lo: Any, hi: Any) -> None:
    """``array[index] = lo`` and the next element ``= hi``, rounded to the array's
    16-bit float dtype (float16 or bfloat16), as one 32-bit store (``index`` even along
    the last axis): how an accumulator pair reaches a float16/bfloat16 output."""
    target = simulate.unwrap(array)
    if not isinstance(target, simulate.Bf16Shadow) and target.dtype.name != "float16":
        raise TypeError(f"pnex.tc.store_pair: the array must hold float16 or bfloat16, got {target.dtype.name}")
    fault = rules.span(target, index, 2, 4, "pnex.tc.store_pair: the array")
    if fault is not None:
        raise fault.exception("pnex.tc.store_pair", "the array")
    idx = index if isinstance(index, tuple) else (index,)
    nxt = idx[:-1] + (idx[-1] + 1,)
    if isinstance(target, simulate.Bf16Shadow):
        target[idx] = pack_rounded_bf16(lo)
        target[nxt] = pack_rounded_bf16(hi)
    else:
        target[idx] = lo
        target[nxt] = hi


def store_words(array: Any, index: Any, words: Any) -> None:
    """The 32-bit ``words`` (a tuple of 1, 2 or 4 uint32) stored as they are into
    ``array`` from ``array[index]`` on, as one 4-, 8- or 16-byte store (aligned to its
    size): how packed float16/bfloat16 pairs, staged in shared memory, reach the output
    16 bytes a thread."""
    target = simulate.unwrap(array)
    data = np.array([int(w) & 0xFFFFFFFF for w in words], dtype="<u4").view(np.uint8)
    fault = rules.span(target, index, data.size // simulate.itemsize(target), data.size, "pnex.tc.store_words: the array")
    if fault is not None:
        raise fault.exception("pnex.tc.store_words", "the array")
    simulate.write_bytes(target, index, data)


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


def exp2_approx(x: Any) -> Any:
    """``2 ** x`` in float32 as ``ex2.approx.ftz.f32`` computes it: one ``MUFU.EX2``
    instruction, where ``math.exp2`` adds the handling of subnormal results around it
    (three more).  An approximation within a few units in the last place (relative error
    within 2**-21, checked on an H200 by ``tests/test_tc_gpu.py``); subnormal arguments
    and results are flushed to zero.  The simulator returns the correctly rounded value,
    flushed likewise."""
    import numpy as np

    v = float(np.float32(x))
    if v != v or v >= 128.0:  # NaN; past float32's range
        return np.float32(v if v != v else np.inf)
    if abs(v) < 2.0**-126:  # a subnormal argument counts as zero
        v = 0.0
    with np.errstate(over="ignore"):
        r = np.float32(2.0**v)
    return np.float32(0.0) if r < 2.0**-126 else r


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
FUNCTIONS = {name: globals()[name] for name in __all__ if name != "FUNCTIONS"}
