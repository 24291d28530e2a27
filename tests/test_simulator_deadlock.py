"""Kernels whose threads can never all meet hang on the GPU; in the CPU simulator each is
one ``KernelLaunchError`` that names where each group of threads waits, with the
kernel's line (:mod:`pnex_magic.launch.waits`).  Returning early before a barrier that
the others reach is legal (PTX's ``exit`` releases a CTA-wide or cluster-wide barrier
held up only by exited threads) and computes the right result.

Every test runs under a guard (pytest-timeout is not a dependency): a launch that hangs
for :data:`GUARD_S` seconds (a regression) has its simulated threads aborted, so the test
fails and the next one runs; one that still hangs after twice that dumps every thread's
stack and ends the process (``faulthandler``), so CI fails instead of hanging."""

from __future__ import annotations

import faulthandler
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from numba import cuda, uint64

import pnex_magic as pnex
from pnex_magic import tc
from simulator_guard import abort_simulated_threads

GUARD_S = 120  # far above the ~0.5 s each launch takes on 2 busy cores


@pytest.fixture(autouse=True)
def hang_guard():
    fired = []

    def unhang() -> None:
        fired.append(True)
        abort_simulated_threads()

    timer = threading.Timer(GUARD_S, unhang)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(2 * GUARD_S, exit=True)
    yield
    timer.cancel()
    faulthandler.cancel_dump_traceback_later()
    assert not fired, f"the launch hung for {GUARD_S} s: the guard aborted its threads"


def line(marker: str) -> int:
    """The line of this file that ends with ``# <marker>``."""
    found = [n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
             if text.rstrip().endswith(f"# <{marker}>")]
    assert len(found) == 1, marker
    return found[0]


def deadlock(call, *waits: str) -> str:
    """The message of the launch's error, which must name each of ``waits`` (regexes)."""
    with pytest.raises(pnex.KernelLaunchError, match="cannot finish in the CUDA simulator") as info:
        call()
    message = str(info.value)
    for wait in waits:
        assert re.search(wait, message), (wait, message)
    assert "can never all meet" in message and "would hang" in message
    assert "abort flag" not in message and "tid=" not in message  # one error, not a thread's echo of it
    return message


@pnex.jit(n_threads=64, threads_per_block=64)
def sync_against_mbarrier(y: pnex.Out("f32", (64,))):
    bars = cuda.shared.array(1, uint64)
    t = cuda.threadIdx.x
    if t == 0:
        tc.mbarrier_init(bars, 0, 1)
    cuda.syncthreads()  # (else warp 1 may wait on a barrier not yet initialised)
    if t < 32:
        cuda.syncthreads()  # <sync>
        if t == 0:
            tc.mbarrier_arrive(bars, 0)  # (after a barrier that waits for warp 1)
    else:
        tc.mbarrier_wait(bars, 0, 0)  # <mbar>
    y[t] = 1.0


def test_threads_at_syncthreads_while_others_wait_on_an_mbarrier():
    deadlock(sync_against_mbarrier,
             rf"threads 0-31 of block \(0, 0, 0\) wait at cuda\.syncthreads\(\) on line {line('sync')}",
             rf"threads 32-63 of block \(0, 0, 0\) wait at pnex\.tc\.mbarrier_wait \(barrier 0, phase parity 0: "
             rf"1 of 1 arrival and 0 bytes still to come\) on line {line('mbar')}")


@pnex.jit(n_threads=64, threads_per_block=64)
def phase_never_completes(y: pnex.Out("f32", (64,))):
    bars = cuda.shared.array(1, uint64)
    t = cuda.threadIdx.x
    if t == 0:
        tc.mbarrier_init(bars, 0, 2)
    cuda.syncthreads()
    if t >= 32:
        return
    if t == 0:
        tc.mbarrier_arrive(bars, 0)  # one of the two arrivals
    tc.mbarrier_wait(bars, 0, 0)  # <never>
    y[t] = 1.0


def test_an_mbarrier_phase_that_no_thread_will_complete():
    deadlock(phase_never_completes,
             rf"threads 0-31 of block \(0, 0, 0\) wait at pnex\.tc\.mbarrier_wait \(barrier 0, phase parity 0: "
             rf"1 of 2 arrivals and 0 bytes still to come\) on line {line('never')}",
             r"threads 32-63 of block \(0, 0, 0\) have returned")


@pnex.jit(n_threads=64, threads_per_block=32, cluster_dims=2)
def half_a_cluster_syncs(y: pnex.Out("f32", (64,))):
    bars = cuda.shared.array(1, uint64)
    if cuda.threadIdx.x == 0:
        tc.mbarrier_init(bars, 0, 1)
    cuda.syncthreads()  # (else block 1's other threads may wait on a barrier not yet initialised)
    if tc.cluster_ctarank() == 0:
        tc.cluster_sync()  # <cluster>
        if cuda.threadIdx.x == 0:
            tc.mbarrier_arrive_cluster(bars, 0, 1)
    else:
        tc.mbarrier_wait(bars, 0, 0)  # <remote>
    y[cuda.grid(1)] = 1.0


def test_cluster_sync_reached_by_one_block_of_the_cluster_only():
    deadlock(half_a_cluster_syncs,
             r"every thread of its cluster",
             rf"threads 0-31 of block \(0, 0, 0\) wait at pnex\.tc\.cluster_sync\(\) on line {line('cluster')}",
             rf"threads 0-31 of block \(1, 0, 0\) wait at pnex\.tc\.mbarrier_wait .* on line {line('remote')}")


@pnex.jit(n_threads=64, threads_per_block=64)
def half_a_warp_sums(x: pnex.In("f32", (64,)), y: pnex.Out("f32", (64,))):
    t = cuda.threadIdx.x
    v = x[t]
    if t % 32 < 16:
        v = tc.warp_sum(v)  # <warp>
    cuda.syncthreads()  # <after>
    y[t] = v


def test_a_warp_collective_reached_by_part_of_the_warp():
    deadlock(lambda: half_a_warp_sums(torch.randn(64)),
             rf"threads 0-15 of block \(0, 0, 0\) wait at the warp-level warp_sum of warp 0 \(lanes 16-31 of the "
             rf"warp have not come\) on line {line('warp')}",
             rf"threads 32-47 of block \(0, 0, 0\) wait at the warp-level warp_sum of warp 1 .* on line {line('warp')}",
             rf"threads 16-31, 48-63 of block \(0, 0, 0\) wait at cuda\.syncthreads\(\) on line {line('after')}")


@pnex.jit(n_threads=64, threads_per_block=64)
def named_barrier_short(y: pnex.Out("f32", (64,))):
    t = cuda.threadIdx.x
    if t < 32:
        tc.named_barrier(1, 64)  # <named>
    y[t] = 1.0


def test_a_named_barrier_that_counts_threads_which_returned():
    deadlock(named_barrier_short,
             rf"threads 0-31 of block \(0, 0, 0\) wait at pnex\.tc\.named_barrier\(1, 64\) \(32 of its 64 threads have "
             rf"come\) on line {line('named')}",
             r"threads 32-63 of block \(0, 0, 0\) have returned")


@pnex.jit(n_threads="x.size(0)", threads_per_block=128)
def guarded_block_sum(x: pnex.In("f32", (None,)), sums: pnex.Out("f32", (4,), init=0), n: pnex.Scalar("int32")):
    """Threads past ``n`` return at once; the others sum their block's elements through
    shared memory (a tree of cuda.syncthreads(), which waits for the threads still running)."""
    tile = cuda.shared.array(128, np.float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    if i >= n:
        return
    tile[t] = x[i]
    live = min(128, n - cuda.blockIdx.x * 128)
    stride = 64
    while stride > 0:
        cuda.syncthreads()
        if t < stride and t + stride < live:
            tile[t] += tile[t + stride]
        stride //= 2
    if t == 0:
        sums[cuda.blockIdx.x] = tile[0]


@pnex.jit(n_threads=64, threads_per_block=32, cluster_dims=2)
def one_block_leaves(x: pnex.In("f32", (64,)), y: pnex.Out("f32", (64,), init=0)):
    """Rank 1 returns; rank 0 meets at cluster_sync, which its exit does not hold up."""
    i = cuda.grid(1)
    if tc.cluster_ctarank() == 1:
        return
    tc.cluster_sync()
    y[i] = 2 * x[i]


def test_returning_early_before_the_barriers_the_others_reach_is_legal():
    x = torch.randn(4 * 128)
    n = 3 * 128 - 37  # the third block ends 37 threads short; the fourth block's threads all return
    sums = guarded_block_sum(x, n)
    want = [x[b * 128:min((b + 1) * 128, n)].double().sum().item() if b * 128 < n else 0.0 for b in range(4)]
    np.testing.assert_allclose(sums.numpy(), want, rtol=1e-5, atol=1e-5)
    x = torch.randn(64)
    y = one_block_leaves(x)
    assert torch.equal(y[:32], 2 * x[:32]) and torch.equal(y[32:], torch.zeros(32))
