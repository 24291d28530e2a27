"""A 3-D grid of random numbers with Numba's xoroshiro128+ generators: numba-cuda's
``doc_examples/test_random.py`` (``random_3d``), ported to pnex.

The kernel's body is the documentation's: a fixed grid of ``(16, 16, 16)`` blocks of
``(8, 8, 8)`` threads walks a ``701 x 900 x 719`` array with grid-stride loops, each
thread drawing from its own generator, ``xoroshiro128p_uniform_float32(rng_states,
tid)``.  The port launches that grid (``n_threads`` 128 per axis, ``threads_per_block``
``(8, 8, 8)``); the array is the docs' uninitialised ``device_array``, written in place
(``InMut``); the states are ``pnex.xoroshiro128p_states(nthreads, seed)`` where the docs
call ``create_xoroshiro128p_states(nthreads, seed=1)`` (the same streams), a ``(n, 2)``
uint64 tensor the kernel sees as Numba's array of records.  The simulator runs a small
grid (``(2, 2, 2)`` blocks of ``(2, 2, 2)``) over a ``5 x 6 x 7`` array.

The reference replays each thread's generator in NumPy (Numba's initialiser for the
states, its xoroshiro128+ step and float32 conversion), element by element in the
kernel's loop order: for every thread on CPU, for 256 threads drawn from the seed on a
GPU (2 million threads walk 450 million elements there); and the states each of those
threads leaves must be exact too.
"""

from __future__ import annotations

import numpy as np
import torch

import pnex_magic as pnex

TITLE = "a 3-D grid of random numbers with Numba's xoroshiro128p generators"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_random.py: test_ex_3d_grid, random_3d"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # the same generator, bit for bit


def define(blocks: int, threads: int):
    from numba import cuda
    from numba.cuda.random import xoroshiro128p_uniform_float32

    @pnex.jit(n_threads=(blocks * threads,) * 3, threads_per_block=(threads,) * 3)
    def random_3d(arr: pnex.InMut("f32", (None, None, None)), rng_states: pnex.InMut("xoroshiro128p", (None,))):
        # Per-dimension thread indices and strides
        startx, starty, startz = cuda.grid(3)
        stridex, stridey, stridez = cuda.gridsize(3)

        # Linearized thread index
        tid = (startz * stridey * stridex) + (starty * stridex) + startx

        # Use strided loops over the array to assign a random value to each entry
        for i in range(startz, arr.shape[0], stridez):
            for j in range(starty, arr.shape[1], stridey):
                for k in range(startx, arr.shape[2], stridex):
                    arr[i, j, k] = xoroshiro128p_uniform_float32(
                        rng_states, tid
                    )

    return random_3d


def _config(device: str) -> tuple[tuple[int, int, int], int, int]:
    """Array dimensions, blocks and threads per block on each axis."""
    return ((701, 900, 719), 16, 8) if device != "cpu" else ((5, 6, 7), 2, 2)


def reference(states: np.ndarray, shape: tuple[int, int, int], stride: int, tids: np.ndarray):
    """For each of ``tids``: the positions it writes and the values, in its loop order, and
    its state afterwards (``states``: the initial (n, 2) uint64 words)."""
    positions, values, after = [], [], []
    for tid in tids.tolist():
        x, y, z = tid % stride, (tid // stride) % stride, tid // (stride * stride)
        s0, s1 = (int(w) for w in states[tid])
        for i in range(z, shape[0], stride):
            for j in range(y, shape[1], stride):
                for k in range(x, shape[2], stride):
                    result = (s0 + s1) & 0xFFFFFFFFFFFFFFFF
                    s1 ^= s0
                    s0 = (((s0 << 55) | (s0 >> 9)) ^ s1 ^ (s1 << 14)) & 0xFFFFFFFFFFFFFFFF
                    s1 = ((s1 << 36) | (s1 >> 28)) & 0xFFFFFFFFFFFFFFFF
                    positions.append((i, j, k))
                    values.append(np.float32((result >> 11) * 2.0**-53))
        after.append((s0, s1))
    return np.array(positions, np.int64).reshape(-1, 3), np.array(values, np.float32), np.array(after, np.uint64)


def _halves(words: torch.Tensor) -> torch.Tensor:
    """64-bit words as their 32-bit halves: exact in the float64 the harness compares in."""
    return torch.stack([words & 0xFFFFFFFF, (words >> 32) & 0xFFFFFFFF], -1)


def run(device: str, seed: int) -> tuple[dict, dict]:
    shape, blocks, threads = _config(device)
    random_3d = define(blocks, threads)
    stride = blocks * threads
    nthreads = stride**3
    rng_states = pnex.xoroshiro128p_states(nthreads, seed=seed, device=device)
    initial = rng_states.cpu().numpy().copy()
    arr = torch.empty(shape, dtype=torch.float32, device=device)
    random_3d(arr, rng_states)
    sampled = np.random.default_rng(seed).choice(nthreads, 256, replace=False) if device != "cpu" else np.arange(nthreads)
    positions, values, after = reference(initial, shape, stride, sampled)
    index = torch.from_numpy(positions).to(device)
    got = arr[index[:, 0], index[:, 1], index[:, 2]]
    states = rng_states.view(torch.int64)[torch.from_numpy(sampled).to(device)]
    results = {"values": got, "states": _halves(states)}
    references = {"values": torch.from_numpy(values), "states": _halves(torch.from_numpy(after.view(np.int64)))}
    if device == "cpu":  # every element was written
        results["array"], references["array"] = arr, torch.from_numpy(_full(shape, positions, values))
    return results, references


def _full(shape: tuple[int, int, int], positions: np.ndarray, values: np.ndarray) -> np.ndarray:
    full = np.full(shape, np.nan, np.float32)
    full[positions[:, 0], positions[:, 1], positions[:, 2]] = values
    return full


def timed(device: str):
    shape, blocks, threads = _config(device)
    random_3d = define(blocks, threads)
    rng_states = pnex.xoroshiro128p_states((blocks * threads) ** 3, seed=1, device=device)
    arr = torch.empty(shape, dtype=torch.float32, device=device)
    return (lambda: random_3d(arr, rng_states)), (lambda: torch.rand(shape, device=device))
