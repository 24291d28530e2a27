"""The Laplace (heat) equation with a grid-wide sync: numba-cuda's
``doc_examples/test_laplace.py``, ported to pnex.

The kernel's body is the documentation's: every thread owns one point, and the grid
synchronises (``cuda.cg.this_grid().sync()``) after each of ``timesteps`` steps, which
ping-pong between ``buf_0`` and ``buf_1``.  Both buffers are written, so both are
``InMut``; the docs launch it with ``solve_heat_equation.forall(len(data))``, one thread
per point with the block chosen for them (pnex's default block here).  pnex links CUDA's
device runtime and launches it cooperatively; on CPU tensors the simulator runs every
block at once, so the sync holds there too.  The docs start from a single hot point and
check that the total heat stays near 10000; here the initial temperatures are random
and both buffers are compared with a float64 NumPy reference.
"""

from __future__ import annotations

import numpy as np
import torch

import pnex_magic as pnex

from _common import generator

TITLE = "Laplace (heat) equation, a grid-wide sync per step (cuda.cg.this_grid().sync())"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_laplace.py: test_ex_laplace, solve_heat_equation"
GPU_ONLY = False
# float64 throughout; a contracted multiply-add per step, over up to 10,000 steps of values below 100.
TOLERANCE = dict(rtol=1e-10, atol=1e-10)


def define():
    from numba import cuda

    @pnex.jit(n_threads="len(buf_0)")
    def solve_heat_equation(buf_0: pnex.InMut("f64", (None,)), buf_1: pnex.InMut("f64", "buf_0"), timesteps: int,
                            k: float):
        i = cuda.grid(1)

        # Don't continue if our index is outside the domain
        if i >= len(buf_0):
            return

        # Prepare to do a grid-wide synchronization later
        grid = cuda.cg.this_grid()

        for step in range(timesteps):
            # Select the buffer from the previous timestep
            if (step % 2) == 0:
                data = buf_0
                next_data = buf_1
            else:
                data = buf_1
                next_data = buf_0

            # Get the current temperature associated with this point
            curr_temp = data[i]

            # Apply formula from finite difference equation
            if i == 0:
                # Left wall is held at T = 0
                next_temp = curr_temp + k * (data[i + 1] - (2 * curr_temp))
            elif i == len(data) - 1:
                # Right wall is held at T = 0
                next_temp = curr_temp + k * (data[i - 1] - (2 * curr_temp))
            else:
                # Interior points are a weighted average of their neighbors
                next_temp = curr_temp + k * (
                    data[i - 1] - (2 * curr_temp) + data[i + 1]
                )

            # Write new value to the next buffer
            next_data[i] = next_temp

            # Wait for every thread to write before moving on
            grid.sync()

    return solve_heat_equation


def reference(data: np.ndarray, timesteps: int, k: float) -> tuple[np.ndarray, np.ndarray]:
    """Both buffers after ``timesteps`` steps, in float64 NumPy (walls held at 0)."""
    buf_0, buf_1 = data.astype(np.float64).copy(), np.zeros_like(data, dtype=np.float64)
    for step in range(timesteps):
        src, dst = (buf_0, buf_1) if step % 2 == 0 else (buf_1, buf_0)
        left = np.concatenate([[0.0], src[:-1]])
        right = np.concatenate([src[1:], [0.0]])
        dst[:] = src + k * (left - 2 * src + right)
    return buf_0, buf_1


def _sizes(device: str) -> tuple[int, int]:
    # The docs' 1001 points and 10,000 steps on a GPU; the simulator runs a Python thread per
    # CUDA thread, all at once for a grid sync: 600 points (3 blocks) and 40 steps there.
    return (1001, 10_000) if device != "cpu" else (600, 40)


def run(device: str, seed: int) -> tuple[dict, dict]:
    solve_heat_equation = define()
    size, timesteps = _sizes(device)
    data = torch.rand(size, dtype=torch.float64, generator=generator(seed)) * 100
    ref_0, ref_1 = reference(data.numpy(), timesteps, 0.25)
    buf_0 = data.to(device, copy=True)
    buf_1 = torch.zeros_like(buf_0)  # the docs' device_array_like: its start is never read
    solve_heat_equation(buf_0, buf_1, timesteps, 0.25)
    return {"buf_0": buf_0, "buf_1": buf_1}, {"buf_0": torch.from_numpy(ref_0), "buf_1": torch.from_numpy(ref_1)}


def timed(device: str):
    solve_heat_equation = define()
    size, timesteps = _sizes(device)
    buf_0 = torch.rand(size, dtype=torch.float64, device=device) * 100
    buf_1 = torch.zeros_like(buf_0)

    def torch_steps():  # the same steps as torch operations, one pass per step
        a, b = buf_0.clone(), buf_1
        for step in range(timesteps):
            src, dst = (a, b) if step % 2 == 0 else (b, a)
            padded = torch.nn.functional.pad(src, (1, 1))
            torch.add(src, padded[:-2] - 2 * src + padded[2:], alpha=0.25, out=dst)
        return a, b

    return (lambda: solve_heat_equation(buf_0, buf_1, timesteps, 0.25)), torch_steps
