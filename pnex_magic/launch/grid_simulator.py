"""The CUDA simulator for kernels that synchronise their whole grid.

numba-cuda's simulator runs a kernel's blocks one after another, each block's
threads as Python threads, and its ``cuda.cg.this_grid().sync()`` is the block's
``syncthreads()``: a grid of several blocks would silently skip the synchronisation
between blocks (``max_cooperative_grid_blocks`` is 1 there).  pnex runs such a
kernel with every thread of the grid at once instead (:func:`run`), so a grid sync
waits for every block, as on the GPU, and ``cuda.syncthreads()`` still waits for
the thread's own block only.  Each block has its own shared memory, static and dynamic.

What counts as arrived, as on the GPU: a thread that has returned no longer takes
part in ``syncthreads()`` (its block's barrier waits for the others) nor in a grid
sync, except that CUDA's grid sync counts blocks by their first thread: the other
blocks wait for each block's thread (0, 0, 0) to arrive.  A grid sync that waits for
a block whose thread (0, 0, 0) has returned would never end on the GPU; here it is a
:class:`~pnex_magic.errors.KernelLaunchError` saying so, as is a wait that can never
end because threads wait at different barriers (one block's threads at
``syncthreads()`` and at a grid sync, a warp-level operation that part of a warp skips,
an mbarrier: :mod:`.waits`, with one ``Waits`` for the whole grid).

Every thread is a Python thread, so the grid is limited to :data:`MAX_THREADS`
threads (a clear error beyond).  Which kernels run this way: those whose code, or a
device function's, names ``this_grid`` (:func:`uses_grid_sync`); they run the same
whatever their block count.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import KernelLaunchError
from ..snapshot import code_names
from .waits import PARK_AFTER_S, Waits

__all__ = ["MAX_THREADS", "uses_grid_sync", "run"]

#: The most threads (blocks x threads per block) a grid-synchronising kernel may run
#: with in the simulator: each is a Python thread, all alive at once.
MAX_THREADS = 4096

_POLL_SECONDS = 0.05  # the manager's wait between looks, when no thread says anything


def uses_grid_sync(fn: Any, _seen: set[int] | None = None) -> bool:
    """Whether ``fn`` (a kernel's simulated function) or a device function it calls names
    ``this_grid`` (``cuda.cg.this_grid()``, or ``this_grid`` imported from ``numba.cuda.cg``)."""
    seen = _seen if _seen is not None else set()
    fn = getattr(fn, "fn", None) or getattr(fn, "py_func", None) or fn  # a simulated or Numba device function
    code = getattr(fn, "__code__", None)
    if code is None or id(fn) in seen:
        return False
    seen.add(id(fn))
    names = code_names(code, free=True)
    if "this_grid" in names:
        return True
    values = [fn.__globals__.get(name) for name in names]
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return any(uses_grid_sync(value, seen) for value in values
               if hasattr(value, "py_func") or type(value).__name__ == "FakeCUDAKernel")


class _GridGroup:
    """``cuda.cg.this_grid()`` of the running grid."""

    def sync(self) -> None:
        threading.current_thread().grid_sync()


class _Cg:
    def this_grid(self) -> _GridGroup:
        return _GridGroup()


class _Block:
    """What numba's thread class reads of its block (``_block_dim``, ``block_state``), its
    threads and the grid's :class:`~.waits.Waits` (``pnex_waits``)."""

    def __init__(self, block_dim: tuple[int, int, int], waits: Waits):
        self._block_dim = block_dim
        self.block_state = np.zeros(block_dim, dtype=np.bool_)
        self._threads: list[Any] = []
        self.pnex_waits = waits
        waits.blocks.append(self)

    def at_barrier(self, thread: Any) -> bool:
        """Whether ``thread``'s wait at ``cuda.syncthreads()`` has ended or the manager will
        end it (every thread of the block that has not ended waits there)."""
        return not thread.syncthreads_blocked or all(t.syncthreads_blocked or t.pnex_ended for t in self._threads)


def _module_class() -> type:
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, FakeCUDAShared

    class GridModule(FakeCUDAModule):
        """numba's fake ``cuda`` module, with a real grid sync and shared memory per block."""

        def __init__(self, grid_dim, block_dim, dynshared_size):
            super().__init__(grid_dim, block_dim, dynshared_size)
            self._cg = _Cg()
            self._per_block = {b: FakeCUDAShared(dynshared_size) for b in np.ndindex(*grid_dim)}

        @property
        def shared(self):
            return self._per_block[tuple(threading.current_thread().blockIdx)]

    return GridModule


def _thread_class() -> type:
    from numba.cuda.simulator.kernel import BlockThread

    class GridThread(BlockThread):
        """numba's simulated CUDA thread, which also waits at grid syncs, and tells the
        manager whenever it blocks or ends."""

        def __init__(self, f, block, block_index, thread_index, manager):
            super().__init__(f, block, block_index, thread_index, False)
            self.grid_blocked = False
            self.grid_event = threading.Event()
            self.manager = manager
            self.pnex_ended = False

        def run(self):
            try:
                super().run()
            finally:
                self.pnex_ended = True
                self._manager.pnex_waits.ended(self, bool(self.exception))
                self.manager.changed()

        def _wait(self, barrier: str, flag: str, event: threading.Event, done: Any) -> None:
            """Say this thread waits at ``barrier`` (setting ``flag``), then wait until the
            manager releases it (or aborts the grid); ``done()``: whether that wait has
            ended or the manager will end it."""
            if self.abort:
                raise RuntimeError(f"abort flag set on {barrier}")
            setattr(self, flag, True)
            self.manager.changed()
            if not event.wait(PARK_AFTER_S):  # a long wait: noted for the deadlock detection
                waits = self._manager.pnex_waits
                try:
                    waits.park(self, barrier, done)
                    event.wait()
                finally:
                    waits.unpark(self)
            event.clear()
            if self.abort:
                raise RuntimeError(f"abort flag set on {barrier}")

        def syncthreads(self):
            self._wait("cuda.syncthreads()", "syncthreads_blocked", self.syncthreads_event,
                       lambda: self._manager.at_barrier(self))

        def grid_sync(self):
            self._wait("cuda.cg.this_grid().sync()", "grid_blocked", self.grid_event,
                       lambda: not self.grid_blocked or self.manager.at_grid_sync())

    return GridThread


class _Manager:
    """Starts every thread of the grid and releases the barriers they wait at."""

    def __init__(self, kernel: str, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int]):
        self.kernel = kernel
        self.fn = fn
        self.grid = grid
        self.block = block
        self._condition = threading.Condition()
        self._news = False
        self.waits = Waits(int(np.prod(grid)) * int(np.prod(block)), fn, "grid")
        self._threads: list[Any] = []

    def at_grid_sync(self) -> bool:
        """Whether every thread of the grid that has not ended waits at a grid sync (the
        manager then releases it, or says why the GPU would hang)."""
        return all(t.grid_blocked or t.pnex_ended for t in self._threads)

    def changed(self) -> None:
        with self._condition:
            self._news = True
            self._condition.notify()

    def run(self, *args: Any) -> None:
        thread_class = _thread_class()
        threads = self._threads
        for block_index in np.ndindex(*self.grid):
            block = _Block(self.block, self.waits)
            for thread_index in np.ndindex(*self.block):
                threads.append(thread_class(lambda: self.fn(*args), block, block_index, thread_index, self))
                block._threads.append(threads[-1])
        firsts = {tuple(t.blockIdx): t for t in threads if tuple(t.threadIdx) == (0, 0, 0)}
        for t in threads:
            t.start()
        self._supervise(threads, firsts)  # (after an abort, threads end on their own: daemons, as numba's)

    def _abort(self, threads: Sequence[Any]) -> None:
        for t in threads:
            t.abort = True
            t.syncthreads_blocked = t.grid_blocked = False
            t.syncthreads_event.set()
            t.grid_event.set()

    def _supervise(self, threads: list[Any], firsts: dict[tuple, Any]) -> None:
        live = list(threads)
        several_blocks = len(firsts) > 1
        while live:
            with self._condition:
                if not self._news:
                    self._condition.wait(_POLL_SECONDS)
                self._news = False
            if self.waits.deadlock is not None:  # (its threads' waits, named with their lines)
                self._abort(threads)
                raise self.waits.deadlock
            for t in live:
                if t.exception:
                    self._abort(threads)
                    raise t.exception[0].with_traceback(t.exception[1])
            live = [t for t in live if t.is_alive()]
            by_block: dict[tuple, list[Any]] = {}
            for t in live:
                by_block.setdefault(tuple(t.blockIdx), []).append(t)
            for members in by_block.values():  # a block whose live threads all wait at syncthreads()
                if all(t.syncthreads_blocked for t in members):
                    for t in members:
                        t.syncthreads_blocked = False
                        t.syncthreads_event.set()
            if live and all(t.grid_blocked for t in live):  # every live thread at a grid sync
                gone = [block for block, first in firsts.items() if not first.is_alive()]
                if several_blocks and gone:
                    self._abort(threads)
                    raise KernelLaunchError(self._exited_first_threads(gone))
                for t in live:
                    t.grid_blocked = False
                    t.grid_event.set()
        for t in threads:  # an exception set as a thread ended
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    def _exited_first_threads(self, gone: list[tuple]) -> str:
        blocks = ", ".join(str(b) for b in gone[:4]) + (f" and {len(gone) - 4} more" if len(gone) > 4 else "")
        return (
            f"kernel {self.kernel!r} waits at a grid sync (grid.sync()) for block(s) {blocks}, whose thread (0, 0, 0) "
            f"has returned: CUDA's grid sync counts each block by its first thread, so on the GPU the other blocks "
            f"would wait forever (the kernel would hang). Keep thread 0 of every block running to each grid.sync() "
            f"(return after the loop, or guard the work with `if i < n:` instead of returning early)"
        )


def run(kernel: str, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[Any],
        shared: int = 0) -> None:
    """Run ``fn`` (a kernel's simulated function) on ``args`` (scalars and numba's
    ``FakeCUDAArray`` views) with every thread of ``grid`` x ``block`` at once, each
    block with ``shared`` bytes of dynamic shared memory of its own."""
    from numba.cuda.simulator import kernel as simulator
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray
    from numba.cuda.simulator.kernelapi import swapped_cuda_module

    threads = int(np.prod(grid)) * int(np.prod(block))
    if threads > MAX_THREADS:
        raise KernelLaunchError(
            f"kernel {kernel!r} synchronises its grid (cuda.cg.this_grid().sync()), so the CUDA simulator runs all of "
            f"its threads at once, each a Python thread: this launch has {threads} (grid {grid} x block {block}), "
            f"more than the {MAX_THREADS} it runs. Pass smaller tensors on CPU, or run it on a GPU"
        )
    module = _module_class()(grid, block, shared)
    fake = [FakeWithinKernelCUDAArray(a) if isinstance(a, FakeCUDAArray) else a for a in args]
    with simulator._push_kernel_context(module), swapped_cuda_module(fn, module):
        _Manager(kernel, fn, grid, block).run(*fake)
