"""Bulk tensor copies and mbarriers on CPU, for numba-cuda's simulator (one Python thread
per CUDA thread), with the GPU's semantics:

* an mbarrier (8 bytes of shared memory) counts arrivals and transaction bytes; its
  phase completes when both reach zero, then it rearms with the count it was
  initialised with.  Its state lives in the barrier's own 8 bytes (re-initialising it
  resets it, as on the GPU);
* ``mbarrier_wait(bars, i, parity)`` returns once the phase of that parity has
  completed (at once for the parity before the current one);
* ``tma_load`` copies the box at once (as :mod:`.simulate`'s ``cp_async`` does) with the
  128-byte swizzle and zeros outside the tensor, then completes its bytes on the
  barrier: a program that waits on the barrier before it reads the tile computes what
  the GPU computes.

A program that would hang on the GPU (a wait no arrival can end) raises instead: in a
pnex launch, once no thread of its block (or cluster, or grid) is left running, whatever
the others wait at (:mod:`pnex_magic.launch.waits`); under numba's own block manager,
once every thread of its block waits on an mbarrier or has ended; and in any, once no
barrier anywhere has moved for :data:`STALL_S` seconds (a thread that spins on memory
instead of waiting).  So does a block whose warpgroups ask ``setmaxnreg`` for more
registers than the block is launched with (:func:`setmaxnreg`): on the GPU its
``setmaxnreg.inc`` waits for them forever.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from .arrays import alignment, itemsize, unwrap
from .tensormap import SWIZZLES, source_of

__all__ = ["named_barrier", "mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_wait",
           "tma_load", "check_map", "setmaxnreg", "STALL_S", "REGISTER_FILE"]

#: 32-bit registers an SM has for a block: a kernel that calls setmaxnreg is compiled with
#: its block size T as launch bounds, which gives a thread at most REGISTER_FILE // T,
#: rounded down to a multiple of 8 (168 for 384 threads; ptxas's figure for the GEMMs).
REGISTER_FILE = 65536
#: Seconds without any barrier moving after which a waiting thread gives up (a hang on the GPU).
STALL_S = 300.0
_WAIT_S = 0.05
_CHANGED = threading.Condition()
_last_change = [time.monotonic()]
_WAITING: dict[Any, dict] = {}  # (block manager, block) -> {thread in mbarrier_wait: (barriers, index, parity)}

_PENDING, _COUNT, _TX = (0, 20), (20, 20), (40, 23)
_FIELD_MAX = (1 << 20) - 1


def _get(word: int, field: tuple[int, int]) -> int:
    return (word >> field[0]) & ((1 << field[1]) - 1)


def _pack(pending: int, count: int, tx: int, phase: int) -> int:
    return pending | (count << 20) | ((tx & ((1 << 23) - 1)) << 40) | (phase << 63)


def _state(word: int) -> tuple[int, int, int, int]:
    tx = _get(word, _TX)
    if tx >= 1 << 22:  # signed: the bytes can land before they are expected
        tx -= 1 << 23
    return _get(word, _PENDING), _get(word, _COUNT), tx, word >> 63


def _barrier(name: str, bars: Any, index: Any) -> tuple[np.ndarray, int]:
    array = unwrap(bars)
    if array.ndim != 1 or array.dtype not in (np.uint64, np.int64):
        raise TypeError(f"pnex.tc.{name}: the barriers must be a 1-D shared array of uint64, got {array.dtype} "
                        f"{array.shape}")
    i = int(index)
    if not 0 <= i < array.shape[0]:
        raise IndexError(f"pnex.tc.{name}: barrier {i} is outside the {array.shape[0]} barriers")
    return array, i


def _word(array: np.ndarray, i: int) -> int:
    return int(array.view(np.uint64)[i])


def _store(array: np.ndarray, i: int, word: int) -> None:
    array.view(np.uint64)[i] = np.uint64(word)
    _last_change[0] = time.monotonic()
    _CHANGED.notify_all()


def _settle(name: str, array: np.ndarray, i: int, arrivals: int, tx: int) -> None:
    """Apply ``arrivals`` arrivals and ``tx`` transaction bytes to barrier ``i`` (under the lock)."""
    pending, count, pending_tx, phase = _state(_word(array, i))
    if count == 0:
        raise RuntimeError(f"pnex.tc.{name}: barrier {i} was not initialised (pnex.tc.mbarrier_init)")
    pending -= arrivals
    pending_tx += tx
    if pending < 0:
        raise RuntimeError(f"pnex.tc.{name}: barrier {i} got more arrivals in one phase than the {count} it was "
                           f"initialised with")
    if pending == 0 and pending_tx == 0:
        pending, phase = count, phase ^ 1
    _store(array, i, _pack(pending, count, pending_tx, phase))


def mbarrier_init(bars: Any, index: Any, count: Any) -> None:
    array, i = _barrier("mbarrier_init", bars, index)
    n = int(count)
    if not 1 <= n <= _FIELD_MAX:
        raise ValueError(f"pnex.tc.mbarrier_init: the arrival count must be from 1 to {_FIELD_MAX}, got {n}")
    with _CHANGED:
        _store(array, i, _pack(n, n, 0, 0))


def mbarrier_arrive(bars: Any, index: Any) -> None:
    array, i = _barrier("mbarrier_arrive", bars, index)
    with _CHANGED:
        _settle("mbarrier_arrive", array, i, 1, 0)


def mbarrier_arrive_expect_tx(bars: Any, index: Any, nbytes: Any) -> None:
    array, i = _barrier("mbarrier_arrive_expect_tx", bars, index)
    n = int(nbytes)
    if not 0 <= n < 1 << 20:
        raise ValueError(f"pnex.tc.mbarrier_arrive_expect_tx: the byte count must be from 0 to 2**20 - 1, got {n}")
    with _CHANGED:
        _settle("mbarrier_arrive_expect_tx", array, i, 1, n)


def _block_threads(manager: Any) -> int:
    return int(np.prod(manager._block_dim))


def mbarrier_wait(bars: Any, index: Any, parity: Any) -> None:
    array, i = _barrier("mbarrier_wait", bars, index)
    want = int(parity) & 1
    thread = threading.current_thread()
    manager = getattr(thread, "_manager", None)
    block = tuple(getattr(thread, "blockIdx", ()))
    cluster = getattr(manager, "pnex_cluster", None)  # its blocks run at once: one may arrive for another's
    key = (id(cluster),) if cluster is not None else (id(manager), block)
    with _CHANGED:
        if _state(_word(array, i))[1] == 0:
            raise RuntimeError(f"pnex.tc.mbarrier_wait: barrier {i} was not initialised (pnex.tc.mbarrier_init)")
        waits = getattr(manager, "pnex_waits", None)  # the launch's deadlock detection, where it has one
        if waits is not None:
            _park_wait(waits, thread, array, i, want)
            return
        waiting = _WAITING.setdefault(key, {})
        waiting[thread] = (array, i, want)
        try:
            while _state(_word(array, i))[3] == want:  # the phase of this parity has not completed yet
                if manager is not None:
                    if cluster is not None:
                        ended, total, failed = cluster.ended(), cluster.threads(), [cluster.failure()]
                    else:
                        ended = len([t for t in getattr(manager, "pnex_ended_threads", ()) if t[0] == block])
                        total = _block_threads(manager)
                        failed = [e for (b, _), e in sorted(getattr(manager, "pnex_failed_threads", {}).items())
                                  if b == block]
                    # blocked: the waiting threads whose phase has not completed (one that has will wake)
                    blocked = sum(_state(_word(b, j))[3] == p for b, j, p in waiting.values())
                    if blocked + ended >= total:
                        failed = [e for e in failed if e is not None]
                        if failed:  # the thread that would have arrived failed first: its error is the cause
                            raise type(failed[0])(str(failed[0]))
                        where = f"block {block}" if cluster is None else f"the cluster of block {block}"
                        raise RuntimeError(
                            f"pnex.tc.mbarrier_wait: every thread of {where} waits on a barrier "
                            f"(barrier {i}, phase parity {want}) that no arrival or copy can complete: the GPU "
                            f"would hang here"
                        )
                _pause(thread, f"on barrier {i}", _mbarrier_stalled(i, want))
        finally:
            waiting.pop(thread, None)


def _pause(thread: Any, where: str, stalled: str) -> None:
    """One turn of a barrier wait's loop (``_CHANGED`` held): raise if the launch aborts
    the thread (``where`` it waits) or if no barrier has moved for :data:`STALL_S`
    seconds (``stalled``: the error), else sleep until a barrier changes."""
    if getattr(thread, "abort", False):
        raise RuntimeError(f"abort flag set while waiting {where}")
    if time.monotonic() - _last_change[0] > STALL_S:
        raise RuntimeError(stalled)
    _CHANGED.wait(_WAIT_S)


def _mbarrier_stalled(i: int, want: int) -> str:
    return (f"pnex.tc.mbarrier_wait: barrier {i} (phase parity {want}) did not complete "
            f"in {STALL_S:.0f} s with no barrier moving: the GPU would hang here")


def _park_wait(waits: Any, thread: Any, array: np.ndarray, i: int, want: int) -> None:
    """:func:`mbarrier_wait` (``_CHANGED`` held) in a launch that detects deadlocks
    (:class:`pnex_magic.launch.waits.Waits`): it raises when no thread is left to complete
    the phase."""
    if _state(_word(array, i))[3] != want:
        return  # (complete already)

    def what() -> str:
        pending, count, tx, _ = _state(_word(array, i))
        return (f"pnex.tc.mbarrier_wait (barrier {i}, phase parity {want}: {pending} of {count} "
                f"arrival{'s' if count != 1 else ''} and {max(-tx, 0)} bytes still to come)")

    waits.park(thread, what, lambda: _state(_word(array, i))[3] != want)
    try:
        while _state(_word(array, i))[3] == want:  # the phase of this parity has not completed yet
            _pause(thread, f"on barrier {i}", _mbarrier_stalled(i, want))
    finally:
        waits.unpark(thread)


def check_map(name: str, desc: Any) -> tuple[Any, int, int, int]:
    """(the tensor, box rows, box columns, swizzle bytes) of a tensor map made on CPU."""
    array = unwrap(desc)
    if array.dtype != np.uint8 or array.shape != (128,):
        raise TypeError(f"pnex.tc.{name}: the tensor map must be the 128-byte uint8 tensor pnex.tc.tensor_map() "
                        f"made, got {array.dtype} {array.shape}")
    return source_of(bytes(array), f"pnex.tc.{name}")


def _swizzle_rows(data: np.ndarray, swizzle: int) -> np.ndarray:
    """Rows of ``data`` (uint8, rows x bytes) with 16-byte chunks permuted as the GPU's
    ``swizzle``-byte mode stores them (row r of a 1024-byte-aligned tile: chunk c of each
    ``swizzle`` bytes goes to c ^ (r % (swizzle / 16)) for 128, (r / 2) % 4 for 64, ...)."""
    if swizzle == 0:
        return data
    rows, width = data.shape
    span = swizzle // 16  # chunks a swizzle span holds
    chunks = data.reshape(rows, width // 16, 16)
    out = np.empty_like(chunks)
    group = {128: 1, 64: 2, 32: 4}[swizzle]  # rows of 128 bytes that share one XOR value
    for r in range(rows):
        x = (r // group) % span
        c = np.arange(width // 16)
        target = (c // span) * span + ((c % span) ^ x)
        out[r, target] = chunks[r, c]
    return out.reshape(rows, width)


def tma_load(tile: Any, index: Any, desc: Any, coords: Any, bars: Any, bar_index: Any) -> None:
    tensor, box_rows, box_cols, swizzle = check_map("tma_load", desc)
    dst = unwrap(tile)
    size = tensor.element_size()
    if itemsize(dst) != size:
        raise TypeError(f"pnex.tc.tma_load: the tile holds {itemsize(dst)}-byte elements and the tensor map "
                        f"{size}-byte ones")
    idx = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
    if len(idx) != dst.ndim:
        raise IndexError(f"pnex.tc.tma_load: {len(idx)} subscripts for the {dst.ndim}-D tile")
    for axis, (i, n) in enumerate(zip(idx, dst.shape)):
        if not 0 <= i < n:
            raise IndexError(f"pnex.tc.tma_load: tile index {idx} is out of bounds on axis {axis} of the tile's "
                             f"shape {dst.shape}")
    if not dst.flags.c_contiguous:
        raise ValueError("pnex.tc.tma_load: the tile must be C-contiguous (a tc.tile or a shared array)")
    nbytes = box_rows * box_cols * size
    start = int(np.ravel_multi_index(idx, dst.shape)) * size
    flat = dst.reshape(-1).view(np.uint8) if dst.dtype.itemsize == size else None
    if flat is None:
        raise TypeError("pnex.tc.tma_load: a bfloat16 shadow tile cannot take raw bytes; declare the tile as float16")
    if start + nbytes > flat.size:
        raise IndexError(f"pnex.tc.tma_load: the box of {box_rows} x {box_cols} elements ({nbytes} bytes) from tile "
                         f"index {idx} runs past the tile's end ({dst.shape})")
    need = 1024 if swizzle == 128 else 128  # the swizzle is a function of the address
    _, address, declared = alignment(dst, idx)
    if address % need or (declared is not None and declared < need):
        held = f"declared with alignment={declared}" if declared is not None else f"at address {address:#x}"
        raise ValueError(f"pnex.tc.tma_load: the tile from index {idx} must start on a {need}-byte boundary "
                         f"(the {'128-byte swizzle' if swizzle == 128 else 'bulk copy'} needs it); it is {held}, "
                         f"{address % need} bytes past one: declare it with alignment={need} (or more)")
    row0, col0 = (int(c) for c in coords)
    if (col0 * size) % 16:
        raise ValueError(f"pnex.tc.tma_load: the column coordinate {col0} is {col0 * size} bytes into a row, not a "
                         f"multiple of 16 bytes ({16 // size} elements): the GPU stops at such a copy with an illegal "
                         f"instruction")
    source = _bytes_of(tensor)
    rows, cols = tensor.shape
    box = np.zeros((box_rows, box_cols * size), np.uint8)  # out of the tensor: zeros, as the GPU fills
    r_lo, r_hi = max(row0, 0), min(row0 + box_rows, rows)
    c_lo, c_hi = max(col0, 0), min(col0 + box_cols, cols)
    if r_lo < r_hi and c_lo < c_hi:
        box[r_lo - row0:r_hi - row0, (c_lo - col0) * size:(c_hi - col0) * size] = source[r_lo:r_hi, c_lo * size:c_hi * size]
    flat[start:start + nbytes] = _swizzle_rows(box, swizzle).reshape(-1)
    array, i = _barrier("tma_load", bars, bar_index)
    with _CHANGED:
        _settle("tma_load", array, i, 0, -nbytes)


def _bytes_of(tensor: Any) -> np.ndarray:
    """The tensor's elements as bytes: rows x (columns * element size) uint8."""
    import torch

    return tensor.detach().contiguous().view(torch.uint8).numpy()


_NAMED: dict[tuple, list[int]] = {}  # (block manager, block, index) -> [threads arrived, generation]


def named_barrier(index: Any, threads: Any) -> None:
    """``bar.sync index, threads`` among the simulated threads of this block."""
    i, n = int(index), int(threads)
    thread = threading.current_thread()
    manager = getattr(thread, "_manager", None)
    if manager is None:
        raise RuntimeError("pnex.tc.named_barrier was called outside a simulated CUDA kernel")
    total = _block_threads(manager)
    if not 1 <= i <= 15:
        raise ValueError(f"pnex.tc.named_barrier: the barrier index must be from 1 to 15 (0 is cuda.syncthreads()), "
                         f"got {i}")
    if n % 32 or not 32 <= n <= total:
        raise ValueError(f"pnex.tc.named_barrier: the thread count must be a multiple of 32 from 32 to the block's "
                         f"{total}, got {n}")
    block = tuple(thread.blockIdx)
    key = (id(manager), block, i)
    with _CHANGED:
        state = _NAMED.setdefault(key, [0, 0])
        generation = state[1]
        state[0] += 1
        if state[0] == n:
            state[0], state[1] = 0, generation + 1
            _last_change[0] = time.monotonic()
            _CHANGED.notify_all()
            return
        waits = getattr(manager, "pnex_waits", None)  # the launch's deadlock detection, where it has one
        if waits is not None:
            waits.park(thread, lambda: f"pnex.tc.named_barrier({i}, {n}) ({state[0]} of its {n} threads have come)",
                       lambda: state[1] != generation)
        try:
            while state[1] == generation:
                _pause(thread, f"at named barrier {i}",
                       f"pnex.tc.named_barrier: barrier {i} waited {STALL_S:.0f} s for {n} threads with nothing "
                       f"moving: the GPU would hang here")
        finally:
            if waits is not None:
                waits.unpark(thread)


def setmaxnreg(name: str, count: int) -> None:
    """Record that this thread's warpgroup set its registers to ``count``
    (``setmaxnreg.inc``/``.dec``); once every warpgroup of the block has, check that
    what they hold fits what the block was launched with.  ``setmaxnreg.inc`` takes its
    registers from what other warpgroups gave back and waits until they are there: a
    block that asks for more than it has hangs on the GPU (128 x 32 + 256 x 240 = 65536
    registers against 384 x 168 = 64512 did, on an H200), and here raises."""
    thread = threading.current_thread()
    manager = getattr(thread, "_manager", None)
    if manager is None or not hasattr(thread, "thread_id"):
        return
    threads = _block_threads(manager)
    launched = REGISTER_FILE // threads // 8 * 8
    groups = (threads + 127) // 128
    block = tuple(getattr(thread, "blockIdx", ()))
    with _CHANGED:
        pools = manager.__dict__.setdefault("pnex_register_pools", {})
        held = pools.setdefault(block, {})
        held[thread.thread_id // 128] = int(count)
        if len(held) < groups:
            return
        sizes = {g: min(128, threads - 128 * g) for g in held}
        total = sum(sizes[g] * n for g, n in held.items())
        if total > threads * launched:
            terms = " + ".join(f"{sizes[g]} x {n}" for g, n in sorted(held.items()))
            raise RuntimeError(
                f"pnex.tc.{name}: the warpgroups of a block of {threads} threads ask for {terms} = {total} registers, "
                f"but the block is launched with at most {launched} a thread ({threads} x {launched} = "
                f"{threads * launched}): on the GPU setmaxnreg_inc would wait forever for registers no warpgroup gives "
                f"back; lower the increase, or give back more with setmaxnreg_dec")
