"""numba-cuda's CUDA simulator, one block at a time, with a barrier that is told
instead of a manager that polls.

numba's ``BlockManager`` runs a block's threads as Python threads and finds out that
they all wait at ``cuda.syncthreads()`` (or have ended) by looking at every thread's
flags in a loop that never sleeps.  That loop holds the GIL whenever a simulated
thread lets it go (each wait at a warp rendezvous, :mod:`pnex_magic.tc.simulate`, or at
a barrier), for a whole switch interval (5 ms) at a time: sampled with ``py-spy
--gil``, it held the GIL 83% of a simulated FlashAttention launch
(``examples/tensor_cores/attention.py``, 128 threads a block).  Here each thread
counts itself in when it reaches the barrier or ends, and only the thread that
completes the count (or one that ended with an exception) wakes the manager, which
otherwise sleeps.  The manager then releases the barrier's threads one after another,
each thread waking the next (as :mod:`pnex_magic.tc.rendezvous` wakes a warp's lanes):
woken all at once, hundreds of threads would wake only to queue for the GIL.

The rest is numba's: its thread class (``BlockThread``: ``syncthreads_count`` and the
like, the exception it records, the ``tid=... ctaid=...`` prefix), its fake ``cuda``
module (one per launch, whose shared memory its blocks reuse in turn, as numba's do),
its argument wrappers, its blocks in ``np.ndindex`` order, one at a time.  A thread
that raises aborts the block's others (they raise at their next barrier), and the
launch raises its exception, as numba's manager does (the first to end with one here;
numba's raises whichever its scan meets first).

A block's threads begin one after another on one Python thread (:meth:`_Block.run_in_turn`),
each run to its end before the next begins, which is one of the orders the GPU may take: a
thread started costs about 0.2 ms of CPython's time, most of a simple kernel's.  The first
thread that waits (at ``cuda.syncthreads()``, at once; at anything else, a warp's rendezvous
or a spin on memory, after :data:`_TURN_SECONDS` without news) ends that: the block's other
threads then start at once, each on its own Python thread, as numba's do.  While a thread
runs in turn, ``threading.current_thread()`` is its own thread object (CPython's table of
running threads says so), so that numba's fake ``cuda`` module and :mod:`pnex_magic.tc`
find its indices and state as on a thread of its own.

A kernel with thread-block clusters (``cluster_dims``) runs one cluster at a time, its
blocks at once (each a :class:`_Block` run from a thread of its own), each with shared
memory of its own, their managers sharing a
:class:`ClusterState` through which the cluster primitives
(:mod:`pnex_magic.tc.simulate_cluster`) reach each other's shared memory.  A block that fails aborts the cluster's
others.

Each block, or each cluster's blocks together, has a :class:`~pnex_magic.launch.waits.Waits`
(``pnex_waits``) where every wait of its threads is noted (this barrier, and the waits of
:mod:`pnex_magic.tc`): once every thread that has not returned waits and none of the
waits can end, the launch raises :class:`~pnex_magic.launch.waits.Deadlock`, naming
where each group of threads waits, instead of hanging as the GPU would.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .waits import PARK_AFTER_S, Waits

__all__ = ["run"]

_POLL_SECONDS = 1.0  # the manager's longest sleep without news (every change wakes it at once)
_TURN_SECONDS = 0.002  # a thread run in turn that neither ends nor waits at the barrier for this long: start the rest


#: Begin a block's threads in turn (False: each on a Python thread of its own at once, as numba
#: does; ``benchmarks/simulator_turns.py`` times both).
RUN_IN_TURN = True


def _can_run_in_turn() -> bool:
    """Whether threads begin in turn: :data:`RUN_IN_TURN`, where CPython's table of running
    threads is the dict :meth:`_Block.run_in_turn` needs."""
    return RUN_IN_TURN and isinstance(getattr(threading, "_active", None), dict) and \
        hasattr(threading, "_active_limbo_lock")


@functools.lru_cache(maxsize=1)
def _thread_class() -> type:
    from numba.cuda.simulator.kernel import BlockThread

    class CountedThread(BlockThread):
        """numba's simulated CUDA thread, which tells its block when it reaches
        ``syncthreads()`` and when it ends, and wakes the next thread when the barrier
        releases it."""

        pnex_next: Any = None  # the thread this one wakes when the barrier releases it

        def run(self) -> None:
            try:
                super().run()
            finally:
                self._manager.ended(self)

        def syncthreads(self) -> None:
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            self._manager.arrived(self)
            if not self.syncthreads_event.wait(PARK_AFTER_S):  # a long wait: noted for the deadlock detection
                waits = self._manager.pnex_waits
                try:
                    waits.park(self, "cuda.syncthreads()", functools.partial(self._manager.releasable, self))
                    self.syncthreads_event.wait()
                finally:
                    waits.unpark(self)
            self.syncthreads_event.clear()
            after, self.pnex_next = self.pnex_next, None
            if after is not None:  # the next thread's turn (one at a time wants the GIL)
                after.syncthreads_event.set()
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    return CountedThread


class _Block:
    """Runs one block's threads (what numba's thread class reads of its manager:
    ``_block_dim``, ``block_state``) and releases its barriers."""

    def __init__(self, fn: Any, block_dim: tuple[int, int, int], waits: Waits | None = None):
        self._f = fn
        self._block_dim = block_dim
        self.block_state = np.zeros(block_dim, dtype=np.bool_)
        self._condition = threading.Condition()
        self._threads: list[Any] = []
        self._waiting = 0  # threads at the barrier
        self._ended: list[Any] = []  # threads that have ended, in the order they ended
        self._failed: Any = None  # the first thread that ended with an exception
        self._claimed = 0  # threads begun (in turn, or started on threads of their own)
        self._in_turn = False  # threads still begin one after another (run_in_turn)
        self._turns = 0  # threads run in turn that have ended
        # where the threads that run at once (this block, or its cluster's blocks) wait: a deadlock is an error
        self.pnex_waits = waits if waits is not None else Waits(int(np.prod(block_dim)), fn)
        self.pnex_waits.blocks.append(self)

    def releasable(self, thread: Any) -> bool:
        """Whether ``thread``'s wait at the barrier has ended or this manager will end it
        (every thread of the block that has not ended is at the barrier)."""
        return not thread.syncthreads_blocked or self._waiting + len(self._ended) == len(self._threads)

    def arrived(self, thread: Any) -> None:
        with self._condition:
            thread.syncthreads_blocked = True
            self._waiting += 1
            if self._in_turn or self._waiting + len(self._ended) == len(self._threads):
                self._condition.notify()  # (in turn: the others must start now)

    def ended(self, thread: Any) -> None:
        with self._condition:
            self._ended.append(thread)
            if thread.exception and self._failed is None:
                self._failed = thread
            deadlock = self.pnex_waits.ended(thread, bool(thread.exception))
            if deadlock is not None or self._failed is not None or \
                    self._waiting + len(self._ended) == len(self._threads):
                self._condition.notify()

    def abort(self) -> None:
        """Make every thread of this block raise at its next barrier or wait (another block
        of its cluster failed)."""
        with self._condition:
            threads = list(self._threads)
        for t in threads:
            t.abort = True
            t.syncthreads_blocked = False
            t.syncthreads_event.set()

    def run_in_turn(self) -> None:
        """Run the block's threads one after another on this Python thread, as long as each
        ends before the next begins and :meth:`run` has not started the rest."""
        ident = threading.get_ident()
        me = threading.current_thread()
        try:
            while True:
                with self._condition:
                    if not self._in_turn or self._failed is not None or self._claimed == len(self._threads):
                        return  # (the turns end below)
                    t = self._threads[self._claimed]
                    self._claimed += 1
                t._ident = ident  # (a deadlock's report finds its frames by it)
                with threading._active_limbo_lock:  # type: ignore[attr-defined]
                    threading._active[ident] = t  # type: ignore[attr-defined]
                try:
                    t.run()  # numba's BlockThread.run: the kernel, its exception kept; then ended()
                finally:
                    with threading._active_limbo_lock:  # type: ignore[attr-defined]
                        threading._active[ident] = me  # type: ignore[attr-defined]
                with self._condition:
                    self._turns += 1
        finally:
            with self._condition:
                self._in_turn = False
                self._condition.notify()

    def _start_the_rest(self) -> list[Any]:
        """End the turns (the condition held): the threads not begun, to start."""
        self._in_turn = False
        rest = self._threads[self._claimed:]
        self._claimed = len(self._threads)
        return rest

    def run(self, grid_point: tuple[int, ...], args: Sequence[Any]) -> None:
        thread_class = _thread_class()

        def target() -> None:
            self._f(*args)

        points = list(np.ndindex(*self._block_dim))
        with self._condition:  # the count of threads is known before any of them arrives
            self._threads = [thread_class(target, self, grid_point, point, False) for point in points]
            self._in_turn = _can_run_in_turn()
        if self._in_turn:
            threading.Thread(target=self.run_in_turn, daemon=True).start()
        else:
            self._claimed = len(self._threads)
            for t in self._threads:
                t.start()
        with self._condition:
            while True:
                if self._in_turn and self._failed is None and self.pnex_waits.deadlock is None:
                    turns = self._turns
                    if not self._waiting:
                        self._condition.wait(_TURN_SECONDS)
                    if self._in_turn and (self._waiting or self._turns == turns):  # a thread waits (or is slow)
                        rest = self._start_the_rest()
                        self._condition.release()
                        try:
                            for t in rest:
                                t.start()
                        finally:
                            self._condition.acquire()
                    continue
                deadlock = self.pnex_waits.deadlock
                if self._failed is not None or deadlock is not None:
                    for t in self._threads:  # (they end on their own: daemons, as numba's)
                        t.abort = True
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
                    if deadlock is not None:  # (the thread that found it raised it too, with its prefix)
                        raise deadlock
                    exc, tb = self._failed.exception
                    raise exc.with_traceback(tb)
                if len(self._ended) == len(self._threads):
                    return
                if self._waiting and self._waiting + len(self._ended) == len(self._threads):
                    waiting = [t for t in self._threads if t.syncthreads_blocked]
                    for t, after in zip(waiting, waiting[1:] + [None]):
                        t.syncthreads_blocked = False
                        t.pnex_next = after
                    self._waiting = 0
                    waiting[0].syncthreads_event.set()
                    continue
                self._condition.wait(_POLL_SECONDS)


class ClusterState:
    """One running cluster: ``dims`` (blocks along x, y, z), its blocks' origin in the
    grid, each rank's shared memory (numba's ``FakeCUDAShared``) and block manager."""

    def __init__(self, dims: tuple[int, int, int], origin: tuple[int, int, int], shared: list[Any],
                 managers: list[Any]):
        self.dims = dims
        self.origin = origin
        self.size = dims[0] * dims[1] * dims[2]
        self.shared = shared
        self.managers = managers
        self.barrier = [0, 0]  # cluster_sync: [threads arrived, generation]

    def rank_of(self, block: tuple[int, ...]) -> int:
        x, y, z = (int(b) % d for b, d in zip(tuple(block) + (0,) * (3 - len(block)), self.dims))
        return x + self.dims[0] * (y + self.dims[1] * z)

    def threads(self) -> int:
        return self.size * int(np.prod(self.managers[0]._block_dim))

    def ended(self) -> int:
        return sum(len(getattr(m, "pnex_ended_threads", ())) for m in self.managers)

    def failure(self) -> BaseException | None:
        for m in self.managers:
            failed = getattr(m, "pnex_failed_threads", {})
            if failed:
                return next(iter(failed.values()))
        return None


def _cluster_module(module_class: type) -> type:
    class ClusterModule(module_class):
        """numba's fake ``cuda`` module, with shared memory per block of the running cluster."""

        def __init__(self, grid_dim, block_dim, dynshared_size):
            super().__init__(grid_dim, block_dim, dynshared_size)
            self.per_block: dict[tuple, Any] = {}

        @property
        def shared(self):
            return self.per_block[tuple(threading.current_thread().blockIdx)]

    return ClusterModule


def _run_cluster(fn: Any, origin: tuple[int, ...], dims: tuple[int, int, int], block_dim: tuple[int, int, int],
                 module: Any, args: Sequence[Any], shared: int) -> None:
    """Run the blocks of the cluster at ``origin`` at once; raise the first failure."""
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    size = dims[0] * dims[1] * dims[2]
    # by rank: x fastest, as %cluster_ctarank counts
    points = [(origin[0] + r % dims[0], origin[1] + (r // dims[0]) % dims[1], origin[2] + r // (dims[0] * dims[1]))
              for r in range(size)]
    waits = Waits(size * int(np.prod(block_dim)), fn)  # the cluster's threads run at once
    blocks = [_Block(fn, block_dim, waits) for _ in points]
    memories = [FakeCUDAShared(shared) for _ in points]
    state = ClusterState(dims, tuple(origin), memories, blocks)
    for b, point, memory in zip(blocks, points, memories):
        b.pnex_cluster = state
        module.per_block[point] = memory
    errors: list[BaseException] = []
    lock = threading.Lock()

    def supervise(b: _Block, point: tuple[int, ...]) -> None:
        try:
            b.run(point, args)
        except BaseException as exc:  # noqa: BLE001 - raised by the launch, below
            with lock:
                errors.append(exc)
            for other in blocks:
                if other is not b:
                    other.abort()

    supervisors = [threading.Thread(target=supervise, args=(b, p), daemon=True) for b, p in zip(blocks, points)]
    for t in supervisors:
        t.start()
    for t in supervisors:
        t.join()
    module.per_block.clear()
    if errors:
        raise errors[0]


def run(fn: Any, grid: Any, block: Any, args: Sequence[Any], shared: int = 0,
        cluster: tuple[int, int, int] | None = None) -> None:
    """What ``FakeCUDAKernel(fn)[grid, block, 0, shared](*args)`` does (numba's arguments
    and fake ``cuda`` module, the blocks one after another), with :class:`_Block`'s barrier;
    ``cluster``: the blocks of each thread-block cluster of that shape at once."""
    from numba.cuda.errors import normalize_kernel_dimensions
    from numba.cuda.simulator import kernel as simulator
    from numba.cuda.simulator.args import ArgHint, InOut
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, swapped_cuda_module

    grid_dim, block_dim = normalize_kernel_dimensions(grid, block)
    module = (FakeCUDAModule if cluster is None else _cluster_module(FakeCUDAModule))(grid_dim, block_dim, shared)
    with simulator._push_kernel_context(module):
        retr: list[Any] = []

        def fake_arg(arg: Any) -> Any:
            if isinstance(arg, np.ndarray) and arg.ndim > 0:
                arg = InOut(arg).to_device(retr)
            elif isinstance(arg, ArgHint):
                arg = arg.to_device(retr)
            elif isinstance(arg, np.void):
                arg = FakeCUDAArray(arg)
            return FakeWithinKernelCUDAArray(arg) if isinstance(arg, FakeCUDAArray) else arg

        fake_args = [fake_arg(arg) for arg in args]
        with swapped_cuda_module(fn, module):
            if cluster is not None:  # (the grid is a whole number of clusters: launch_grid checked it)
                for index in np.ndindex(*(g // c for g, c in zip(grid_dim, cluster))):
                    origin = tuple(i * c for i, c in zip(index, cluster))
                    _run_cluster(fn, origin, cluster, block_dim, module, fake_args, shared)
            else:
                for grid_point in np.ndindex(*grid_dim):
                    _Block(fn, block_dim).run(grid_point, fake_args)
        for write_back in retr:
            write_back()
