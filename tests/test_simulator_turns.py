"""The simulator begins a block's threads one after another on one Python thread, each
run to its end before the next begins, until one waits: then the rest start at once, each
on a Python thread of its own (:mod:`pnex_magic.launch.block_simulator`).  Both orders are
ones the GPU may take, so the results must not depend on which one a launch took; what the
first saves is a Python thread per simulated thread (about 0.2 ms of CPython's time each).

Each launch here runs under a guard: a launch that does not end in :data:`GUARD_S`
seconds (a thread run in turn that waits for a later one, never started) fails the test
instead of hanging it."""

from __future__ import annotations

import threading

import torch
from numba import cuda, float32

import pnex_magic as pnex
from simulator_guard import abort_simulated_threads

GUARD_S = 120


def guarded(op, *args):
    """``op(*args)`` on a thread of its own; fail if it has not returned in GUARD_S seconds."""
    box: dict = {}

    def call() -> None:
        try:
            box["out"] = op(*args)
        except BaseException as exc:  # noqa: BLE001 - raised below
            box["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(GUARD_S)
    if caller.is_alive():
        abort_simulated_threads()  # so the next test runs
        raise AssertionError(f"the launch did not end in {GUARD_S} s")
    if "error" in box:
        raise box["error"]
    return box["out"]


@pnex.jit(n_threads="x.numel()", threads_per_block=64)
def scale(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * float32(3.0)


def test_a_block_that_never_waits_takes_one_python_thread(monkeypatch, poisoned):
    """256 threads in 4 blocks without a barrier: 4 Python threads started (the runners), not
    256, and every result right (poisoned output: each element written)."""
    started = []
    original = threading.Thread.start

    def counting_start(self):
        started.append(type(self).__name__)
        return original(self)

    x = torch.randn(256)
    guarded(scale, x)  # compiled (typed) and run once before counting
    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", counting_start)
        y = guarded(scale, x)
    assert torch.equal(y, x * 3)
    assert started.count("CountedThread") == 0, started
    assert len(started) <= 4 + 1, started  # one runner a block, and the guard's caller


@pnex.jit(n_threads=128, threads_per_block=128)
def reverse(x: pnex.In("f32", (128,)), y: pnex.Out("f32", (128,))):
    s = cuda.shared.array(128, float32)
    t = cuda.threadIdx.x
    s[t] = x[t]
    cuda.syncthreads()  # thread 0 waits here before thread 1 has begun: the rest must start
    y[t] = s[127 - t]


def test_a_thread_that_waits_at_the_barrier_starts_the_others():
    x = torch.randn(128)
    assert torch.equal(guarded(reverse, x), x.flip(0))


@pnex.jit(n_threads=64, threads_per_block=64)
def spin(flag: pnex.InMut("i32", (1,)), out: pnex.Out("i32", (64,))):
    t = cuda.threadIdx.x
    if t == 0:
        while cuda.atomic.add(flag, 0, 0) == 0:  # waits for the last thread, with no barrier
            pass
        out[0] = 1
    else:
        out[t] = t
        if t == 63:
            cuda.atomic.exch(flag, 0, 1)


def test_a_thread_that_spins_on_memory_starts_the_others():
    """Thread 0 waits for thread 63 by spinning on memory: nothing the simulator is told
    about.  Run in turn, thread 63 would never begin; after a while without news the rest
    start, and the spin ends."""
    flag = torch.zeros(1, dtype=torch.int32)
    out = guarded(spin, flag)
    assert out.tolist() == [1] + list(range(1, 64))


@pnex.jit(n_threads=96, threads_per_block=96)
def warp_sums(x: pnex.In("i32", (96,)), y: pnex.Out("i32", (96,))):
    t = cuda.threadIdx.x
    v = x[t]
    for d in (16, 8, 4, 2, 1):
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, d)
    y[t] = v


def test_a_warp_rendezvous_starts_the_others():
    """A shuffle waits for the warp's other lanes (a rendezvous, not the barrier): the
    lanes not begun start after a while, and each warp gets its own sum."""
    x = torch.randint(-100, 100, (96,), dtype=torch.int32)
    want = x.view(3, 32).sum(1, dtype=torch.int32).repeat_interleave(32)
    assert torch.equal(guarded(warp_sums, x), want)


@pnex.jit(n_threads=64, threads_per_block=64)
def fails_late(x: pnex.In("i32", (64,)), y: pnex.Out("i32", (64,))):
    t = cuda.threadIdx.x
    y[t + 64 * (1 - x[t])] = t  # out of bounds where x is 0


def test_an_error_in_a_thread_run_in_turn_is_the_launch_error():
    import pytest

    x = torch.ones(64, dtype=torch.int32)
    x[40] = 0
    with pytest.raises(pnex.KernelLaunchError, match=r"tid=\[40, 0, 0\] ctaid=\[0, 0, 0\]: index 104 is out of bounds"):
        guarded(fails_late, x)
