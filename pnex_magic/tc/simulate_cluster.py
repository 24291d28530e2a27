"""Thread-block clusters on CPU, for numba-cuda's simulator: the primitives that reach
another block of the cluster (``cluster_ctarank``, ``cluster_sync``,
``mbarrier_arrive_cluster``, ``tma_load_multicast``) with the GPU's semantics.

The launch stage runs the blocks of one cluster at once, each with its own shared
memory (:mod:`pnex_magic.launch.block_simulator`), and gives their block managers one
``ClusterState`` (``pnex_cluster``): the cluster's shape (``dims``, ``size``), each
rank's shared memory (``shared``) and block manager, ``rank_of(block)``, ``threads()``,
``ended()``, ``failure()`` and the ``barrier`` of ``cluster_sync``.  A shared
array of another block is the one at the same offset of that block's shared memory, as
``mapa`` maps it on the GPU (:func:`remote`): its dynamic shared memory, or the static
array declared on the same line.  A kernel launched without ``cluster_dims`` is a
cluster of one block, as on the GPU: rank 0, and ``cluster_sync`` is the block's barrier.

A rank or a multicast mask outside the cluster raises (the GPU's behaviour there is
undefined).  ``cluster_sync`` counts a thread that has returned as arrived (PTX's
``exit`` releases a ``barrier.cluster`` that only exited threads hold up); threads of
the cluster that wait where they can never all meet are the launch's deadlock
(:mod:`pnex_magic.launch.waits`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from . import simulate_bulk as bulk
from .arrays import _declared, _root, declare, unwrap

__all__ = ["cluster_ctarank", "cluster_sync", "remote", "mbarrier_arrive_cluster",
           "tma_load_multicast", "cluster_of"]


def cluster_of(name: str) -> tuple[Any, Any]:
    """(the running cluster or ``None`` outside one, the calling simulated thread)."""
    thread = threading.current_thread()
    manager = getattr(thread, "_manager", None)
    if manager is None:
        raise RuntimeError(f"pnex.tc.{name} was called outside a simulated CUDA kernel")
    return getattr(manager, "pnex_cluster", None), thread


def cluster_ctarank() -> int:
    state, thread = cluster_of("cluster_ctarank")
    return 0 if state is None else state.rank_of(tuple(thread.blockIdx))


def _outside(state: Any) -> str:
    """``"outside the cluster (...)"``: what a rank past the cluster is outside of."""
    size = 1 if state is None else state.size
    shape = "a launch without cluster_dims is a cluster of 1 block" if state is None else \
        f"cluster_dims={state.dims}: {size} block{'s' if size > 1 else ''}"
    return (f"outside the cluster ({shape}, ranks 0 to {size - 1}); on the GPU it would reach no block's shared "
            f"memory")


def remote(name: str, array: Any, rank: Any) -> np.ndarray:
    """The shared array of block ``rank`` of this cluster at the place of ``array`` in this
    block's shared memory (``mapa.shared::cluster``): a view of that block's memory."""
    state, thread = cluster_of(name)
    r = int(rank)
    own_rank = 0 if state is None else state.rank_of(tuple(thread.blockIdx))
    if not 0 <= r < (1 if state is None else state.size):
        raise IndexError(f"pnex.tc.{name}: CTA rank {r} is {_outside(state)}")
    data = unwrap(array)
    if r == own_rank:
        return data
    own, target = state.shared[own_rank], state.shared[r]
    root = _root(data)
    address = data.__array_interface__["data"][0]
    root_address = root.__array_interface__["data"][0]
    dynamic = own._dynshared
    start = dynamic.__array_interface__["data"][0]
    if start <= root_address < start + max(dynamic.nbytes, 1):
        other = np.frombuffer(target._dynshared.data, dtype=root.dtype, count=root.size, offset=root_address - start)
        other = declare(other, _declared(root) or root.itemsize)
    else:
        key = next((k for k, a in list(own._allocations.items()) if _root(a) is root), None)
        if key is None:
            raise ValueError(f"pnex.tc.{name}: the array is not in this block's shared memory (a cuda.shared.array "
                             f"or a tile of one), so no other block has one at its place")
        fresh = declare(np.empty(root.shape, root.dtype), _declared(root) or root.itemsize)
        other = target._allocations.setdefault(key, fresh)  # (that block may not have reached its line yet)
    view = np.ndarray(data.shape, data.dtype, buffer=other, offset=address - root_address, strides=data.strides)
    return view if type(data) is np.ndarray else view.view(type(data))


def mbarrier_arrive_cluster(bars: Any, index: Any, rank: Any) -> None:
    """``mbarrier.arrive.shared::cluster``: one arrival on barrier
    ``bars[index]`` of block ``rank`` of the cluster (its own rank included)."""
    bulk.mbarrier_arrive(remote("mbarrier_arrive_cluster", bars, rank), index)


def tma_load_multicast(tile: Any, index: Any, desc: Any, coords: Any, bars: Any, bar_index: Any, cta_mask: Any) -> None:
    """The box of ``desc`` at ``coords`` into ``tile[index]`` of every block whose rank is
    a bit of ``cta_mask``, completing its bytes on each one's ``bars[bar_index]``."""
    mask = int(cta_mask)
    state, _ = cluster_of("tma_load_multicast")
    size = 1 if state is None else state.size
    if not 0 < mask < 1 << 16:
        raise ValueError(f"pnex.tc.tma_load_multicast: cta_mask must name 1 to 16 CTA ranks (a 16-bit mask, not 0), "
                         f"got {mask:#x}")
    outside = [r for r in range(16) if mask >> r & 1 and r >= size]
    if outside:
        raise IndexError(f"pnex.tc.tma_load_multicast: cta_mask {mask:#b} names CTA rank {outside[0]}, "
                         f"{_outside(state)}")
    for r in range(size):
        if mask >> r & 1:
            bulk.tma_load(remote("tma_load_multicast", tile, r), index, desc, coords,
                          remote("tma_load_multicast", bars, r), bar_index)


def cluster_sync() -> None:
    """``barrier.cluster.arrive`` then ``barrier.cluster.wait``: every thread of every block
    of the cluster (a thread that has returned counts as arrived)."""
    state, thread = cluster_of("cluster_sync")
    if state is None:
        thread.syncthreads()
        return
    total = state.threads()
    waits = getattr(thread._manager, "pnex_waits", None)  # the launch's deadlock detection, where it has one
    parked = False
    with bulk._CHANGED:
        generation = state.barrier[1]
        state.barrier[0] += 1
        bulk._last_change[0] = time.monotonic()  # an arrival is progress
        try:
            while state.barrier[1] == generation:
                if state.barrier[0] + state.ended() >= total:
                    state.barrier[0], state.barrier[1] = 0, generation + 1
                    bulk._last_change[0] = time.monotonic()
                    bulk._CHANGED.notify_all()
                    return
                if waits is not None and not parked:  # (ended or releasable by a waiting thread's next look)
                    parked = True
                    waits.park(thread, "pnex.tc.cluster_sync()", lambda: state.barrier[1] != generation
                               or state.barrier[0] + state.ended() >= total)
                failed = state.failure()
                if failed is not None or getattr(thread, "abort", False):
                    raise RuntimeError(f"pnex.tc.cluster_sync: a thread of the cluster failed: {failed}")
                if time.monotonic() - bulk._last_change[0] > bulk.STALL_S:
                    raise RuntimeError(f"pnex.tc.cluster_sync waited {bulk.STALL_S:.0f} s for the cluster's {total} "
                                       f"threads with nothing moving: the GPU would hang here")
                bulk._CHANGED.wait(bulk._WAIT_S)
        finally:
            if parked:
                waits.unpark(thread)
