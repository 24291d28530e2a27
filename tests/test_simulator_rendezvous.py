"""The CPU simulator's meeting points: a block's barrier (``cuda.syncthreads()``,
:mod:`pnex_magic.launch.block_simulator`) and a warp's rendezvous (shuffles, votes and the
tensor-core primitives, :mod:`pnex_magic.tc.rendezvous`), which wake their threads one
after another instead of polling.  Results against NumPy, over several blocks and warps;
the errors of lanes that part ways; no hang and no stray thread after a failed launch."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import tc


@pnex.jit(n_threads="x.size(0)", threads_per_block=128)
def shuffles(x: pnex.In("f32", (None,)), sums: pnex.Out("f32", "x"), ups: pnex.Out("f32", "x"),
             ballots: pnex.Out("u32", "x"), rounds: int):
    i = cuda.grid(1)
    lane = cuda.threadIdx.x % 32
    v = x[i]
    s = v
    for _ in range(rounds):  # many meetings in a row: lanes woken out of order would mix rounds up
        s = v + cuda.shfl_xor_sync(0xFFFFFFFF, s, 1)
    sums[i] = tc.warp_sum(s)
    up = cuda.shfl_up_sync(0xFFFFFFFF, v, 3)
    ups[i] = up if lane >= 3 else -v
    ballots[i] = cuda.ballot_sync(0xFFFFFFFF, v > 0)


def _shuffles_reference(x: np.ndarray, rounds: int):
    warps = x.astype(np.float32).reshape(-1, 32)
    s = warps.copy()
    for _ in range(rounds):
        s = (warps + s[:, np.arange(32) ^ 1]).astype(np.float32)
    ups = np.where(np.arange(32) >= 3, np.roll(warps, 3, axis=1), -warps)
    bits = (warps > 0).astype(np.uint64) << np.arange(32, dtype=np.uint64)
    ballots = np.repeat(bits.sum(axis=1, dtype=np.uint64).astype(np.uint32)[:, None], 32, axis=1)
    return s, ups.reshape(-1), ballots.reshape(-1)


def test_shuffles_and_votes_of_many_warps_and_blocks_match_numpy():
    x = torch.randn(3 * 128)  # 3 blocks of 4 warps
    rounds = 7
    sums, ups, ballots = shuffles(x, rounds)
    s, want_ups, want_ballots = _shuffles_reference(x.numpy(), rounds)
    # warp_sum adds in the GPU's butterfly order; float32 sums of 32 values agree to rounding
    np.testing.assert_allclose(sums.numpy().reshape(-1, 32), np.repeat(s.sum(axis=1, keepdims=True), 32, axis=1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ups.numpy(), want_ups)
    np.testing.assert_array_equal(ballots.numpy().view(np.uint32), want_ballots)


@pnex.jit(n_threads="x.size(0)", threads_per_block=96)
def barrier_with_leavers(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x"), leavers: int):
    tile = cuda.shared.array(96, np.float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = x[i]
    y[i] = 0.0
    cuda.syncthreads()
    if t < leavers:  # they return: the barriers after this count the threads still running
        return
    for step in range(3):
        mine = tile[(t + 1) % 96]
        cuda.syncthreads()
        tile[t] = mine + step
        cuda.syncthreads()
    y[i] = tile[t]


def test_a_barrier_waits_for_the_threads_still_running_only():
    x = torch.randn(2 * 96)
    leavers = 10
    y = barrier_with_leavers(x, leavers).numpy().reshape(2, 96)
    for block, values in enumerate(x.numpy().reshape(2, 96)):
        tile = values.astype(np.float32).copy()
        for step in range(3):
            mine = tile[(np.arange(96) + 1) % 96].copy()
            tile[leavers:] = mine[leavers:] + np.float32(step)
        want = np.where(np.arange(96) < leavers, 0.0, tile).astype(np.float32)
        np.testing.assert_array_equal(y[block], want)


@pnex.jit(n_threads=64, threads_per_block=64)
def parted_lanes(x: pnex.In("f32", (64,)), y: pnex.Out("f32", (64,)), split: int):
    i = cuda.threadIdx.x
    if i % 32 < split:
        y[i] = tc.warp_sum(x[i])
    else:
        y[i] = tc.warp_max(x[i])


def test_lanes_that_meet_at_different_warp_operations_fail_with_both_named():
    x = torch.randn(64)
    with pytest.raises(pnex.KernelLaunchError, match=r"lanes of warp \d \(block \(0, 0, 0\)\) met at different "
                                                      r"warp-level operations \(warp_max, warp_sum\)"):
        parted_lanes(x, 5)
    y = parted_lanes(x, 32)  # every lane at warp_sum: fine
    torch.testing.assert_close(y, x.reshape(2, 32).sum(dim=1).repeat_interleave(32), rtol=1e-5, atol=1e-5)


@pnex.jit(n_threads=128, threads_per_block=128)
def one_lane_fails(x: pnex.In("f32", (128,)), y: pnex.Out("f32", (128,)), bad: int):
    i = cuda.threadIdx.x
    v = x[i]
    for _ in range(4):
        v = tc.warp_sum(v) * 0.01
        cuda.syncthreads()
    if i == bad:
        v = x[i + 128]  # an IndexError in that thread, while the others wait for it
    y[i] = tc.warp_sum(v)
    cuda.syncthreads()


def test_a_thread_that_fails_while_the_others_wait_ends_the_launch_at_once_and_leaves_no_thread_behind():
    x = torch.randn(128)
    before = threading.active_count()
    start = time.perf_counter()
    with pytest.raises(pnex.KernelLaunchError, match=r"IndexError"):
        one_lane_fails(x, 37)
    assert time.perf_counter() - start < 60
    deadline = time.perf_counter() + 10  # the aborted threads see the abort within a poll (0.05 s) and end
    while threading.active_count() > before and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before
    y = one_lane_fails(x, 1000)  # the next launch runs as if nothing happened
    assert torch.isfinite(y).all()
