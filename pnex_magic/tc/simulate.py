"""The tensor-core primitives and warp collectives on CPU: NumPy references that
numba-cuda's CUDA simulator runs, one Python thread per CUDA thread.

A warp-level instruction (``mma``, ``ldmatrix``, a shuffle) needs every lane's
operands at once.  Each lane hands its operands to its warp's rendezvous
(:func:`collective`, from :mod:`.rendezvous`); the last lane to arrive computes every
lane's result from the whole warp's operands, with the fragment layouts of
:mod:`.layouts`, and each lane takes its own.  Lanes of a warp that call different
collectives, or a collective inside a branch that some lanes skip, are reported, as the
GPU would hang or compute garbage (``.aligned`` instructions need the whole warp).

Asynchronous copies (``cp.async``) complete at once here: a program that is correct
on the GPU (it waits for its copies before it reads them) computes the same result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import layouts, rules
from .arrays import Bf16Shadow, declare, itemsize, unwrap
from .rendezvous import checked_collective, collective, lane_id, thread_position, track_thread_ends

__all__ = [
    "collective",
    "checked_collective",
    "lane_id",
    "unwrap",
    "Bf16Shadow",
    "mma",
    "ldmatrix",
    "cp_async",
    "shfl",
]

# --- element bytes ------------------------------------------------------------------------------------
# The spans the primitives touch lie along the last axis of their array, checked first by
# pnex_magic.tc.rules (in bounds, contiguous, aligned).

def _index(index: Any) -> tuple[int, ...]:
    return tuple(map(int, index)) if isinstance(index, tuple) else (int(index),)


def _row(array: np.ndarray, index: Any, count: int) -> np.ndarray:
    """The ``count`` elements of ``array`` from ``index`` along its last axis (a view)."""
    idx = _index(index)
    return array[idx[:-1] + (slice(idx[-1], idx[-1] + count),)]


def _to_bits16(values: np.ndarray, array: np.ndarray) -> np.ndarray:
    """16-bit words of ``values`` (elements of ``array``)."""
    if isinstance(array, Bf16Shadow):
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        # round to nearest even (the values are bfloat16 already: this only drops zeros)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return (rounded >> 16).astype(np.uint16)
    return np.ascontiguousarray(values).view(np.uint16)


def _read_bytes(array: np.ndarray, index: Any, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes of ``array`` from ``index`` on along its last axis, as uint8."""
    values = _row(array, index, nbytes // itemsize(array))
    if isinstance(array, Bf16Shadow):
        return _to_bits16(values, array).view(np.uint8)
    return np.ascontiguousarray(values).view(np.uint8)


def write_bytes(array: np.ndarray, index: Any, data: np.ndarray) -> None:
    """``data`` (uint8) into ``array`` from ``array[index]`` along its last axis (checked first)."""
    _write_bytes(array, index, data)


def _write_bytes(array: np.ndarray, index: Any, data: np.ndarray) -> None:
    row = _row(array, index, data.size // itemsize(array))
    if isinstance(array, Bf16Shadow):
        row[...] = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        row[...] = data.view(array.dtype)


def _check(fault: rules.Fault | None, primitive: str, operand: str) -> None:
    if fault is not None:
        raise fault.exception(primitive, operand)


#: The primitives' names by mma kind.
MMA_NAMES = {"f16": "mma", "bf16": "mma_bf16", "tf32": "mma_tf32"}
_WORDS = ("uint32", "int32")


# --- the primitives -----------------------------------------------------------------------------------

def _decode(words: np.ndarray, kind: str) -> np.ndarray:
    """Fragment words (uint32) as float64 element values, low half first."""
    words = np.ascontiguousarray(words, dtype=np.uint32)
    if kind == "f16":
        return words.view(np.uint16).view(np.float16).astype(np.float64)
    if kind == "bf16":
        return (words.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if kind == "tf32":  # the tensor cores read the top 19 bits of each word
        return (words & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    raise ValueError(f"no mma kind {kind!r}")


def mma(acc: Any, a: Any, b: Any, kind: str) -> None:
    """``acc += A @ B`` for one m16n8k16 (f16, bf16) or m16n8k8 (tf32) tile, every lane
    giving its fragments in the layouts of :mod:`.layouts`."""
    acc_, a_, b_ = unwrap(acc), unwrap(a), unwrap(b)
    m, n, k, a_words, b_words, _ = layouts.MMA_SHAPES[kind]
    what = f"pnex.tc.{MMA_NAMES[kind]}"
    for array, dtypes, operand in ((acc_, ("float32",), "the accumulator"), (a_, _WORDS, "the A fragment"),
                                   (b_, _WORDS, "the B fragment")):
        rules.fragment_dtype(array, dtypes, f"{what}: {operand}")

    def prepare() -> tuple[np.ndarray, ...]:
        _check(rules.whole(32), what, "the warp")
        for array, length, operand in ((acc_, 4, "the accumulator"), (a_, a_words, "the A fragment"),
                                       (b_, b_words, "the B fragment")):
            _check(rules.fragment(array, length, True, f"{what}: {operand}"), what, operand)
        return acc_.astype(np.float64), a_.astype(np.uint32), b_.astype(np.uint32)

    def combine(lanes: list[Any]) -> list[np.ndarray]:
        if len(lanes) != 32:
            raise RuntimeError("pnex.tc.mma needs a whole warp of 32 threads")
        c = np.array([x[0] for x in lanes])  # (all of one shape: np.stack, 3x slower)
        av = _decode(np.array([x[1] for x in lanes]), kind)
        bv = _decode(np.array([x[2] for x in lanes]), kind)
        A = np.zeros((m, k))
        B = np.zeros((k, n))
        C = np.zeros((m, n))
        la, lb, lc = layouts.mma_a_layout(kind), layouts.mma_b_layout(kind), layouts.mma_c_layout()
        A[la[..., 0], la[..., 1]] = av
        B[lb[..., 0], lb[..., 1]] = bv
        C[lc[..., 0], lc[..., 1]] = c
        D = (A @ B + C).astype(np.float32)
        return list(D[lc[..., 0], lc[..., 1]])  # lane by lane

    acc_[...] = checked_collective(f"mma.{kind}", prepare, combine)


def ldmatrix(frag: Any, tile: Any, index: Any, count: int, trans: bool) -> None:
    """``ldmatrix.sync.aligned.m8n8.x{count}{.trans}.b16``: lane ``8 j + r`` points at
    row ``r`` of matrix ``j`` (16 bytes at ``tile[index]``); each lane gets one word per
    matrix in ``frag``."""
    frag_, tile_ = unwrap(frag), unwrap(tile)
    what = f"pnex.tc.ldmatrix (x{count}{', trans' if trans else ''})"
    rules.fragment_dtype(frag_, _WORDS, f"{what}: the fragment")
    if itemsize(tile_) != 2:
        raise TypeError(f"{what}: the tile must hold 16-bit elements (float16, bfloat16, int16), got {tile_.dtype}")

    def prepare() -> np.ndarray | None:
        _check(rules.whole(32), what, "the warp")
        _check(rules.fragment(frag_, count, False, f"{what}: the fragment"), what, "the fragment")
        if lane_id() >= 8 * count:  # a lane whose address the instruction does not read
            return None
        _check(rules.span(tile_, index, 8, 16, f"{what}: the tile"), what, "the tile")
        return _to_bits16(_row(tile_, index, 8), tile_)

    def combine(lanes: list[np.ndarray]) -> list[np.ndarray]:
        if len(lanes) != 32:
            raise RuntimeError(f"{what} needs a whole warp of 32 threads")
        mats = np.array(lanes[: 8 * count]).reshape(count, 8, 8)  # matrix, row, column
        lay = layouts.ldmatrix_layout(trans)
        halves = mats[:, lay[..., 0], lay[..., 1]]  # (count, lane, 2)
        words = halves.astype(np.uint32)
        words = words[..., 0] | (words[..., 1] << 16)  # (count, lane)
        return list(words.T)  # lane by lane

    frag_[:count] = checked_collective(f"ldmatrix.x{count}{'.trans' if trans else ''}", prepare, combine)


def cp_async(dst: Any, dst_index: Any, src: Any, src_index: Any, nbytes: int, valid: bool) -> None:
    """``cp.async``: ``nbytes`` bytes from ``src[src_index]`` on to ``dst[dst_index]`` on
    (zeros where ``valid`` is false).  Completes at once in the simulator."""
    dst_, src_ = unwrap(dst), unwrap(src)
    what = "pnex.tc.cp_async"
    rules.same_element_size(dst_, src_, what)
    count = nbytes // itemsize(dst_)
    _check(rules.span(dst_, dst_index, count, nbytes, f"{what}: the destination"), what, "the destination")
    if valid:
        _check(rules.span(src_, src_index, count, nbytes, f"{what}: the source"), what, "the source")
        data = _read_bytes(src_, src_index, nbytes)
    else:
        data = np.zeros(nbytes, dtype=np.uint8)
    _write_bytes(dst_, dst_index, data)


def _swizzled_rows(tile: np.ndarray, index: Any, rows: int, cols: int) -> np.ndarray:
    """``rows`` x ``cols`` logical elements of a K-major tile of 64 16-bit elements per row,
    stored through :func:`pnex_magic.tc.swizzle` (128-byte swizzle), from ``tile[index]`` on
    (:func:`pnex_magic.tc.rules.wgmma_tile` checked it)."""
    swizzle = layouts.swizzle_arithmetic
    *lead, r0, c0 = _index(index)
    plane = tile[tuple(lead)] if lead else tile
    out = np.empty((rows, cols), dtype=np.uint16)
    for r in range(rows):
        row = r0 + r
        physical = [swizzle(row, c0 + c, 64) for c in range(cols)]
        out[r] = _to_bits16(plane[row, physical], tile)
    return out  # the elements' 16-bit patterns


def _decode16(bits: np.ndarray, kind: str) -> np.ndarray:
    if kind == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.view(np.float16).astype(np.float64)


def wgmma(acc: Any, a: Any, a_index: Any, b: Any, b_index: Any, n: int, kind: str, accumulate: bool = True) -> None:
    """``wgmma.mma_async`` m64nNk16 (completes at once here): the warpgroup's 64 x N
    accumulators ``+=`` A (64 x 16 at ``a[a_index]``) @ B^T (B: N x 16 at ``b[b_index]``),
    both K-major tiles of 64 16-bit elements per row through :func:`~pnex_magic.tc.swizzle`."""
    acc_, a_, b_ = unwrap(acc), unwrap(a), unwrap(b)
    what = f"pnex.tc.{'wgmma' if kind == 'f16' else 'wgmma_bf16'} (m64n{n}k16)"
    rules.fragment_dtype(acc_, ("float32",), f"{what}: the accumulator")
    for tile, operand in ((a_, "the A tile"), (b_, "the B tile")):
        if itemsize(tile) != 2:
            raise TypeError(f"{what}: {operand} must hold 16-bit elements (float16, bfloat16), got {tile.dtype}")
    held = acc_[: n // 2]

    def prepare() -> tuple[Any, ...]:
        _check(rules.whole(128), what, "the warpgroup")
        _check(rules.fragment(acc_, n // 2, False, f"{what}: the accumulator"), what, "the accumulator")
        _check(rules.wgmma_tile(a_, a_index, 64, f"{what}: the A tile"), what, "the A tile")
        _check(rules.wgmma_tile(b_, b_index, n, f"{what}: the B tile"), what, "the B tile")
        return held.astype(np.float64) if accumulate else np.zeros(n // 2), _where(a_), a_index, _where(b_), b_index

    def combine(threads: list[Any]) -> list[np.ndarray]:
        if len(threads) != 128:
            raise RuntimeError(f"{what} needs a whole warpgroup of 128 threads (4 warps)")
        if len({(t[1], repr(t[2]), t[3], repr(t[4])) for t in threads}) != 1:
            raise RuntimeError(f"{what}: the threads of a warpgroup gave different operand tiles or indices")
        A = _decode16(_swizzled_rows(a_, a_index, 64, 16), kind)
        B = _decode16(_swizzled_rows(b_, b_index, n, 16), kind)
        C = np.zeros((64, n))
        rows, cols = _wgmma_c_layout(n)
        for t, x in enumerate(threads):
            C[rows[t], cols[t]] = x[0]
        D = (A @ B.T + C).astype(np.float32)
        return [D[rows[t], cols[t]] for t in range(128)]

    held[...] = checked_collective(f"wgmma.m64n{n}k16.{kind}", prepare, combine, group=128)


def _where(array: np.ndarray) -> tuple:
    """What identifies an array's memory across threads: each thread makes its own view
    objects (``tc.tile``), which must show the same bytes the same way."""
    return array.__array_interface__["data"][0], array.shape, array.strides


def _wgmma_c_layout(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(128, n/2) rows and columns of the 64 x n accumulator each thread of a warpgroup
    holds: warp w has rows 16 w.., and each n8 block is an m16n8 accumulator tile."""
    thread = np.arange(128)[:, None]
    v = np.arange(n // 2)[None, :]
    warp, lane = thread // 32, thread % 32
    g, t = lane // 4, lane % 4
    rows = 16 * warp + g + 8 * ((v // 2) % 2)
    cols = 8 * (v // 4) + 2 * t + v % 2
    return np.broadcast_to(rows, (128, n // 2)), np.broadcast_to(cols, (128, n // 2))


def shfl(kind: str, mask: int, value: Any, operand: int, width: int = 32) -> Any:
    """``shfl.sync``: ``kind`` is "idx", "up", "down" or "xor"; every lane of the warp
    takes part (``mask`` must name them all, as in nearly every kernel)."""
    manager, block, warp, lane, lanes = thread_position()
    full = (1 << lanes) - 1
    if int(mask) & full != full:
        raise NotImplementedError(
            f"cuda.shfl_{kind}_sync with mask {int(mask):#x}: the CPU simulator runs warp shuffles in which every "
            f"lane of the warp takes part (mask 0xffffffff)"
        )

    def combine(values: list[Any]) -> list[Any]:
        out = []
        for me in range(len(values)):
            if kind == "idx":
                src = int(operand_of[me]) % 32
            elif kind == "up":
                src = me - int(operand_of[me])
                src = src if src >= 0 else me
            elif kind == "down":
                src = me + int(operand_of[me])
                src = src if src < len(values) else me
            else:
                src = me ^ int(operand_of[me])
                src = src if src < len(values) else me
            out.append(values[src])
        return out

    operand_of: dict[int, int] = {}

    def gather(items: list[Any]) -> list[Any]:
        for i, (_, op) in enumerate(items):
            operand_of[i] = op
        return combine([v for v, _ in items])

    return collective(f"shfl.{kind}", (value, operand), gather)


def _vote(kind: str, mask: int, predicate: Any) -> Any:
    manager, block, warp, lane, lanes = thread_position()
    full = (1 << lanes) - 1
    if int(mask) & full != full:
        raise NotImplementedError(
            f"cuda.{kind}_sync with mask {int(mask):#x}: the CPU simulator runs warp votes in which every lane of "
            f"the warp takes part (mask 0xffffffff)"
        )

    def combine(values: list[Any]) -> list[Any]:
        if kind == "ballot":
            word = sum(1 << i for i, v in enumerate(values) if v)
            return [np.uint32(word)] * len(values)
        if kind == "all":
            return [bool(all(values))] * len(values)
        if kind == "any":
            return [bool(any(values))] * len(values)
        first = values[0]  # eq
        return [bool(all(v == first for v in values))] * len(values)

    return collective(f"vote.{kind}", predicate, combine)


_WARP_FUNCTIONS = {
    "shfl_sync": lambda self, mask, value, src: shfl("idx", mask, value, src),
    "shfl_up_sync": lambda self, mask, value, delta: shfl("up", mask, value, delta),
    "shfl_down_sync": lambda self, mask, value, delta: shfl("down", mask, value, delta),
    "shfl_xor_sync": lambda self, mask, value, lane_mask: shfl("xor", mask, value, lane_mask),
    "ballot_sync": lambda self, mask, predicate: _vote("ballot", mask, predicate),
    "all_sync": lambda self, mask, predicate: _vote("all", mask, predicate),
    "any_sync": lambda self, mask, predicate: _vote("any", mask, predicate),
    "eq_sync": lambda self, mask, predicate: _vote("eq", mask, predicate),
    "syncwarp": lambda self, mask=0xFFFFFFFF: _vote("all", mask, True) and None,
    "activemask": lambda self: np.uint32((1 << thread_position()[4]) - 1),
    "lanemask_lt": lambda self: np.uint32((1 << thread_position()[3]) - 1),
}


def _check_alignment(alignment: Any) -> None:
    if alignment is not None and (not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1)):
        raise ValueError(f"alignment must be a power of two, got {alignment!r}")


def _shared_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
    """numba's ``FakeCUDAShared.array``, taking ``alignment=`` as the GPU does (tensor-core
    tiles need 128- or 1024-byte alignment) instead of refusing it, and recording it
    (:func:`pnex_magic.tc.arrays.declare`; Numba's default is the element size) for the
    primitives' alignment checks.  Written out, not wrapped: numba tells allocations
    apart by the line of its caller, the kernel's."""
    import sys
    import traceback

    from numba.cuda import types as nbtypes
    from numba.cuda.np import numpy_support

    _check_alignment(alignment)
    dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, nbtypes.Type) else np.dtype(dtype)
    if shape == 0:
        count = self._dynshared_size // dtype.itemsize
        return declare(np.frombuffer(self._dynshared.data, dtype=dtype, count=count), alignment or dtype.itemsize)
    caller = traceback.extract_stack(sys._getframe())[-2][0:2]
    found = self._allocations.get(caller)
    if found is None:
        found = self._allocations[caller] = declare(np.empty(shape, dtype), alignment or dtype.itemsize)
    return found


def _local_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
    from numba.cuda import types as nbtypes
    from numba.cuda.np import numpy_support

    _check_alignment(alignment)
    if isinstance(dtype, nbtypes.Type):
        dtype = numpy_support.as_dtype(dtype)
    return np.empty(shape, dtype)


def install_warp_functions() -> None:
    """Give numba-cuda's simulated ``cuda`` module the warp-level functions it lacks
    (``shfl_*_sync``, votes, ``syncwarp``), run through :func:`collective`, and let its
    shared and local arrays take ``alignment=``, and note when a thread ends (a lane that
    ends before a warp-level operation fails it instead of leaving the others waiting).
    Adds only what is missing; once per process."""
    from numba.cuda.simulator.kernelapi import FakeCUDALocal, FakeCUDAModule, FakeCUDAShared

    for name, function in _WARP_FUNCTIONS.items():
        if not hasattr(FakeCUDAModule, name):
            setattr(FakeCUDAModule, name, function)
    FakeCUDAShared.array = _shared_array
    FakeCUDALocal.array = _local_array
    track_thread_ends()
