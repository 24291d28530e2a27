"""The collector's freeze (:mod:`pnex_magic.collector`): while a block of work runs (a
first compile, a launch in the CUDA simulator), full collections walk only its own
objects; after it nothing is left uncollected, and a program whose collection is
disabled is left alone."""

from __future__ import annotations

import gc
import threading
import weakref

import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_older_objects_are_frozen_during_the_setup_only(python_frozen):
    assert gc.get_freeze_count() <= python_frozen
    old = _Node()
    gone = weakref.ref(old)
    with collector.older_objects_frozen() as frozen:
        assert frozen is True and gc.get_freeze_count() > python_frozen
        del old
        gc.collect()
        assert gone() is not None  # frozen: not examined while the block runs
        new = _Node()
        new_gone = weakref.ref(new)
        del new
        gc.collect()
        assert new_gone() is None  # the block's own garbage is collected as ever
    assert gc.get_freeze_count() <= python_frozen
    gc.collect()
    assert gone() is None  # nothing left uncollected


def test_a_program_with_collection_disabled_is_left_alone(python_frozen):
    gc.disable()
    try:
        with collector.older_objects_frozen() as frozen:
            assert frozen is False and gc.get_freeze_count() <= python_frozen
    finally:
        gc.enable()


def test_objects_frozen_before_do_not_stop_the_freeze_and_are_unfrozen_after(python_frozen):
    """Python 3.12 starts with 375 tuples of its own frozen (so did the H200 machine's
    3.12.3 on 2026-11-28, where skipping the freeze for them cost the first kernel
    0.11-0.16 s of full collections): older objects are frozen all the same, so the
    block's collections walk only its own, and unfrozen after it, nothing left out."""
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        later = _cycle()  # made after that freeze, before the block
        with collector.older_objects_frozen() as frozen:
            assert frozen is True and gc.get_freeze_count() > count
            gc.collect()
            assert later() is not None  # frozen with the older objects: not walked
            new = _cycle()
            gc.collect()
            assert new() is None  # the block's own garbage is collected as ever
        assert gc.get_freeze_count() <= python_frozen
        gc.collect()
        assert later() is None  # nothing left uncollected
    finally:
        gc.unfreeze()


def _cycle() -> weakref.ref:
    """A weak reference to garbage that only the cyclic collector frees."""
    return weakref.ref(_Node())


@pnex.jit(n_threads="x.numel()", threads_per_block=256)
def twice(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * 2.0


def test_a_simulated_launch_walks_only_its_own_objects(poisoned, python_frozen):
    """A simulated launch makes a thread object per simulated thread: every collection
    triggered while its threads run (2,048 of them) finds the older objects frozen, they
    are unfrozen after it, and the result is right."""
    from numba.cuda.simulator.kernel import BlockThread

    x = torch.rand(2048, dtype=torch.float32)
    twice(x)  # (the first call's rewrite and typing, outside the launch measured)
    assert gc.get_freeze_count() <= python_frozen and collector.holders() == 0
    seen: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start" and isinstance(threading.current_thread(), BlockThread):
            seen.append(gc.get_freeze_count())

    gc.callbacks.append(note)
    try:
        y = twice(x)
    finally:
        gc.callbacks.remove(note)
    assert seen, "no collection while the simulated threads ran: nothing measured"
    assert min(seen) > python_frozen  # older objects frozen at each
    assert gc.get_freeze_count() <= python_frozen and collector.holders() == 0
    torch.testing.assert_close(y, x * 2, rtol=0, atol=0)


def test_a_simulated_launch_leaves_a_disabled_collector_alone(python_frozen):
    x = torch.rand(512, dtype=torch.float32)
    gc.disable()
    try:
        y = twice(x)
        assert not gc.isenabled() and gc.get_freeze_count() <= python_frozen
    finally:
        gc.enable()
    torch.testing.assert_close(y, x * 2, rtol=0, atol=0)
