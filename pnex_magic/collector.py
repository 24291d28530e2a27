"""Python's cyclic garbage collector, kept off the objects that were there before a
block of work (:func:`older_objects_frozen`).

A full collection walks every object the collector tracks: in a process with torch
and Numba-CUDA loaded, a few hundred thousand, 0.1-0.2 s on two cores.  Work that
makes many short-lived objects triggers such collections while it runs: the first
compile (:mod:`pnex_magic.numbasetup`) and a launch in the CUDA simulator, which
makes a thread object per simulated thread (a 4,096-thread launch triggered about
130 young and one full collection each time, 0.2 s of its 0.35 s on two cores;
``benchmarks/simulator_turns.py``).  During the block the older objects are frozen
(:func:`gc.freeze`): collections walk the block's own objects only, and the block's
garbage is collected as ever.  When the block ends everything is unfrozen
(:func:`gc.unfreeze`): nothing is left uncollected (garbage among the older objects
is collected at the next full collection).

* A program whose collection is disabled when a block starts is left alone.
* Objects frozen before a block are frozen still during it, and unfrozen with the
  rest after it (:func:`gc.unfreeze` unfreezes all): Python 3.12 starts with 375
  tuples of its own frozen, and a freeze skipped for them cost the first kernel
  0.11-0.16 s of full collections on an H200 (2026-11-28).  A program that froze
  objects of its own finds them unfrozen after its first kernel or simulated launch.
* Blocks that overlap (the warm-up's set-up and a foreground compile, on two
  threads; a compile inside a definition) share one freeze, taken by the first in and
  released by the last out, under one lock.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["older_objects_frozen", "holders"]

_lock = threading.Lock()
_holders = 0  # blocks inside older_objects_frozen, on every thread
_owned = False  # whether the first of them froze (then the last one out unfreezes)


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[bool]:
    """Objects made before the block frozen while it (and any overlapping block, on any
    thread) runs, unfrozen when the last one ends; yields whether they are frozen."""
    global _holders, _owned
    with _lock:
        if _holders == 0:
            _owned = gc.isenabled()
            if _owned:
                gc.freeze()
        _holders += 1
        frozen = _owned
    try:
        yield frozen
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _owned:
                _owned = False
                gc.unfreeze()


def holders() -> int:
    """How many blocks are inside :func:`older_objects_frozen` now, on every thread."""
    return _holders
