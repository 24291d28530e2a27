"""Cooperative launches: kernels that synchronise their whole grid.

A kernel that calls ``cuda.cg.this_grid().sync()`` waits, at each sync, until every
block of its grid has arrived, so every block must be resident on the GPU at once.
Its cubin links CUDA's device runtime (:func:`pnex_magic.linking.uses_grid_sync`),
its definition says ``cooperative`` (:class:`~pnex_magic.launch.kernel.Kernel`), and
every GPU launcher launches it with ``cuLaunchCooperativeKernel``, which refuses a
grid of more blocks than ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` (for the
block size, the kernel's registers and shared memory) times the SMs.  pnex checks that
first and says it in the user's terms (:func:`problem`); the C++ launchers say the
same (``csrc/cooperative.h``).  The autotuner skips candidates whose grid cannot be
resident (:func:`candidate_problem`, from ptxas's figures), and the CUDA simulator
runs such a kernel with all its blocks at once (:mod:`.grid_simulator`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..hardware import resident_blocks

__all__ = ["problem", "candidate_problem"]


def problem(kernel: str, grid: Sequence[int], block: Sequence[int], per_sm: int, sms: int) -> str | None:
    """Why ``grid`` blocks of ``block`` threads cannot all be resident on a GPU of
    ``sms`` SMs that holds ``per_sm`` such blocks per SM (``None``: they can)."""
    blocks = grid[0] * grid[1] * grid[2]
    threads = block[0] * block[1] * block[2]
    limit = per_sm * sms
    if blocks <= limit:
        return None
    return (
        f"kernel '{kernel}' synchronises its grid (cuda.cg.this_grid().sync()), so every block must be resident on "
        f"the GPU at once, but this launch has {blocks} blocks of {threads} threads and the GPU holds at most "
        f"{per_sm} such blocks per SM x {sms} SMs = {limit} (for this block size and the kernel's registers and "
        f"shared memory). Launch at most {limit} blocks: fewer threads (n_threads) with a grid-stride loop over the "
        f"data, or blocks that use fewer registers or less shared memory"
    )


def candidate_problem(
    kernel: str, arch: str, registers: int | None, shared_bytes: int | None, block: Sequence[int],
    n_threads: Sequence[int], sms: int, dynamic_shared: int = 0,
) -> str | None:
    """Why an autotune candidate (``block``, for a call of ``n_threads`` threads) of a
    cooperative kernel cannot be launched: its grid cannot be resident, by ptxas's
    figures (``shared_bytes``: static), the candidate's dynamic shared memory and the
    per-SM limits of ``arch`` (``None``: it can, or the figures are unknown and the
    launch will tell)."""
    if registers is None:
        return None
    per_sm = resident_blocks(arch, registers, (shared_bytes or 0) + dynamic_shared, math.prod(block))
    if per_sm is None:
        return None
    grid = [-(-int(n) // b) for n, b in zip(n_threads, block)]
    grid += [1] * (3 - len(grid))
    padded = list(block) + [1] * (3 - len(block))
    return problem(kernel, grid, padded, per_sm, sms)
