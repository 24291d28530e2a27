"""Where the CPU simulator's threads wait, and the deadlock that no thread can end.

On the GPU a kernel whose threads can never all meet hangs: threads at
``cuda.syncthreads()`` while others wait at an mbarrier, a ``pnex.tc.cluster_sync()``
that some blocks of the cluster never reach, a warp-level operation that part of the
warp skips.  In the simulator every CUDA thread is a Python thread, and each wait of
the simulator (the block's barrier, :mod:`pnex_magic.launch.block_simulator`; a warp's
rendezvous, :mod:`pnex_magic.tc.rendezvous`; an mbarrier, a named barrier and the
cluster's barrier, :mod:`pnex_magic.tc.simulate_bulk` and
:mod:`pnex_magic.tc.simulate_cluster`) tells the :class:`Waits` of the threads that run
at once (a block, or the blocks of a cluster) that a thread waits there
(:meth:`Waits.park`, with a test of whether that wait has ended or will be ended by the
block's manager) and when it goes on (:meth:`Waits.unpark`); the block's manager tells
it when a thread ends (:meth:`Waits.ended`).  The block's barrier and a warp's
rendezvous, met tens of thousands of times in a tensor-core kernel, park a thread only
once it has waited :data:`PARK_AFTER_S` (the waits of an mbarrier, a named barrier and
the cluster's barrier, which poll anyway, park it at once).

The condition is exact, with no time bound: a thread that is not parked is running, or
waits at a wait that has not yet lasted long enough to park (a thread unparks itself
after its wait ends, and parks only after its arrival), and
every event that ends a wait comes from a running thread (an arrival, a copy, which the
simulator completes at once in the thread that issues it) or from the block's manager
(which releases ``cuda.syncthreads()`` once every thread of the block that has not
returned is there).  So when every thread of the group has parked or ended, and no
parked thread's wait has ended or can be released by its manager, nothing can ever
move: the thread that completes that state raises :class:`Deadlock` (or, if it ended,
its manager does), naming each group of threads, where it waits and the kernel's line.

A thread that returns counts as arrived at ``cuda.syncthreads()`` and at
``cluster_sync`` (PTX's ``exit``: barriers waiting on all threads of the CTA, or of the
cluster, are released once the exiting threads are the only ones missing), so
returning early before a barrier that the others reach is legal and runs; it does not
count for a warp-level operation, an mbarrier's arrivals or a named barrier's count.
A thread that spins on memory (``while flag[0] == 0: pass``) is running, never parked:
such a hang is not detected here.
"""

from __future__ import annotations

import linecache
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Deadlock", "Waits", "ranges", "PARK_AFTER_S"]

#: How long a thread waits at a barrier or a warp's rendezvous before it parks (is noted
#: here): a thread not yet parked counts as running, so a deadlock is found at most this
#: late, and the many short waits of a normal kernel cost nothing.
PARK_AFTER_S = 0.05


class Deadlock(RuntimeError):
    """Every thread of a block (or cluster) that has not returned waits, and none of the
    waits can end: on the GPU the kernel would hang."""


#: Short hints, by the kind of wait (the first word of its description).
_HINTS = {
    "cuda.syncthreads()": "cuda.syncthreads() waits for every thread of its block that has not returned",
    "pnex.tc.cluster_sync()": "pnex.tc.cluster_sync() waits for every thread of the cluster that has not returned",
    "cuda.cg.this_grid().sync()": "a grid sync waits for every thread of the grid that has not returned",
    "the warp-level": "a warp-level operation waits for all 32 lanes of the warp (a lane that returned never "
                      "comes)",
    "the warpgroup-level": "a warpgroup-level operation waits for all 128 threads of the warpgroup",
    "pnex.tc.mbarrier_wait": "an mbarrier's phase completes once it has had its count of arrivals and its "
                             "expected bytes",
    "pnex.tc.named_barrier": "pnex.tc.named_barrier(i, n) waits for n threads (threads that returned do not "
                             "count)",
}


def ranges(numbers: list[int]) -> str:
    """``"0-15, 32, 40-47"`` for sorted ``numbers``."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _library_paths() -> tuple[str, ...]:
    """Files whose frames are the simulator's, not the kernel's."""
    import numba.cuda.simulator as simulator

    here = Path(__file__).parents[1]  # the package, as its frames name it (and resolved)
    return (str(Path(simulator.__file__).parent), str(here), str(here.resolve()), threading.__file__)


class Waits:
    """The threads of one block, or of the blocks of one cluster, that run at once:
    ``total`` of them, in ``blocks`` (each with ``_threads``, numba's simulated threads),
    running the kernel whose code object is ``kernel``."""

    ranges = staticmethod(ranges)  # (for the waits of pnex_magic.tc, which do not import this module)

    def __init__(self, total: int, kernel: Any = None, scope: str = ""):
        self.total = total
        self.scope = scope  # "block", "cluster" or "grid": what runs at once (by default, from the blocks)
        self.blocks: list[Any] = []
        self.deadlock: Deadlock | None = None
        self._kernel = getattr(kernel, "__code__", None)
        self._lock = threading.Lock()
        self._parked: dict[Any, tuple[str | Callable[[], str], Callable[[], bool]]] = {}
        self._ended = 0
        self._over = False  # a thread failed, or the deadlock was found: nothing more to look for

    def park(self, thread: Any, what: str | Callable[[], str], done: Callable[[], bool]) -> None:
        """``thread`` waits at ``what`` (its description, or a function giving it) until
        ``done()`` (which says, without a lock, whether that wait has ended or its
        block's manager will end it).  Raises :class:`Deadlock` if this was the last
        thread that could move."""
        with self._lock:
            self._parked[thread] = (what, done)
            if self._over or len(self._parked) + self._ended < self.total:
                return
            found = self._stuck()
        if found is not None:
            raise found

    def unpark(self, thread: Any) -> None:
        with self._lock:
            self._parked.pop(thread, None)

    def ended(self, thread: Any, failed: bool) -> Deadlock | None:
        """``thread`` has ended (``failed``: with an exception, which is then the launch's
        error); the deadlock its end completes, if it does."""
        with self._lock:
            self._ended += 1
            self._parked.pop(thread, None)
            if failed:
                self._over = True
            if self._over or not self._parked or len(self._parked) + self._ended < self.total:
                return None
            return self._stuck()

    def _stuck(self) -> Deadlock | None:
        """With every thread parked or ended (the lock held): the deadlock, unless some
        wait has ended or will be ended."""
        for _, done in self._parked.values():
            if done():
                return None
        self._over = True
        self.deadlock = Deadlock(self._report())
        return self.deadlock

    # --- the report ---------------------------------------------------------------------------------------

    def _report(self) -> str:
        frames = sys._current_frames()
        library = _library_paths()
        lines, kinds = [], []
        for block in self.blocks:
            threads = list(block._threads)
            if not threads:
                continue
            groups: dict[str, list[int]] = {}
            for t in threads:
                entry = self._parked.get(t)
                if entry is None:
                    key = "have returned"
                else:
                    what = entry[0] if isinstance(entry[0], str) else entry[0]()
                    kinds.append(what)
                    key = f"wait at {what}{self._line(frames.get(t.ident), library)}"
                groups.setdefault(key, []).append(t.thread_id)
            index = tuple(threads[0].blockIdx)
            if list(groups) == ["have returned"]:
                lines.append(f"  every thread of block {index} has returned")
                continue
            for key, ids in sorted(groups.items(), key=lambda kv: min(kv[1])):
                ids.sort()
                who = f"thread {ids[0]}" if len(ids) == 1 else f"threads {ranges(ids)}"
                if key == "have returned" and len(ids) == 1:
                    key = "has returned"
                elif len(ids) == 1:
                    key = key.replace("wait at ", "waits at ", 1)
                lines.append(f"  {who} of block {index} {key}")
        shape = tuple(self.blocks[0]._block_dim) if self.blocks else (1, 1, 1)
        numbering = (" (a thread's number is threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * "
                     "threadIdx.z))") if shape[1] * shape[2] > 1 else ""
        hints = [hint for start, hint in _HINTS.items() if any(k.startswith(start) for k in kinds)]
        where = f"of its {self.scope or ('block' if len(self.blocks) == 1 else 'cluster')}"
        return (f"every thread {where} that has not returned is waiting, and no thread is left running to end a "
                f"wait: they can never all meet (on the GPU the kernel would hang){numbering}:\n"
                + "\n".join(lines) + ("\n" + "; ".join(hints) + "." if hints else ""))

    def _line(self, frame: Any, library: tuple[str, ...]) -> str:
        """``" on line N: `text`"``: the kernel's line a thread waits at (the innermost
        frame outside the simulator, and the kernel's own line if that is in a function
        it calls)."""
        inner = kernel = None
        while frame is not None:
            code = frame.f_code
            if code is self._kernel:
                kernel = frame
                inner = inner or frame
                break
            if inner is None and not code.co_filename.startswith(library):
                inner = frame
            frame = frame.f_back
        if inner is None:
            return ""
        text = linecache.getline(inner.f_code.co_filename, inner.f_lineno).strip()
        found = f" on line {inner.f_lineno}" + (f": `{text}`" if text else "")
        if kernel is not None and kernel is not inner:
            found += f" (in {inner.f_code.co_name}, called from line {kernel.f_lineno} of the kernel)"
        return found
