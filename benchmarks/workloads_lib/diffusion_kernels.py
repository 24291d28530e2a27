"""The diffusion workload's kernels and references: the one-step stencil
:func:`diffusion_step` (a 32 x 32 shared-memory tile with a halo), the temporal-blocking
:func:`diffusion_blocked` (several steps per launch, its tile a ``pnex.Tune`` choice), the
field, the eager and float64 references, and the loops that run the kernels for a number of
steps.  :mod:`workloads_lib.diffusion_bench` times them."""

# No `from __future__ import annotations`: kernel annotations such as pnex.In("f32", ...)
# are evaluated where they are written, as in the other kernel modules.
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from numba import cuda, float32, int32

import pnex_magic as pnex
from workloads_lib.provenance import named_in_workloads

__all__ = [
    "TX", "TY", "ROWS_PER_THREAD", "TILE_ROWS", "HALO_SHAPE", "diffusion_step", "initial_field", "laplacian",
    "torch_diffusion_step", "reference_diffusion", "eager_step_into", "eager_steps_into", "laplacian_weight",
    "run_diffusion", "run_diffusion_eager", "MAX_STEPS_PER_LAUNCH", "diffusion_blocked", "run_diffusion_blocked",
]


# The thread block is 32 x 8 threads; each thread updates 4 points of its column, 8 rows
# apart, so a block updates a 32 x 32 tile.  Several independent loads per thread are
# what it takes to keep the GPU's memory busy.  Shared-memory sizes must be
# compile-time constants, hence the module-level names.
TX, TY = 32, 8  # threads per block (X along a row, so a warp reads 32 consecutive floats)
ROWS_PER_THREAD = 4  # also in n_threads below: (u.size(0) + 3) // 4 threads down a column
TILE_ROWS = TY * ROWS_PER_THREAD
HALO_SHAPE = (TILE_ROWS + 2, TX + 2)  # the tile and a one-point halo around it


@pnex.jit(n_threads=("u.size(1)", "(u.size(0) + 3) // 4"), threads_per_block=(TX, TY))
@named_in_workloads
def diffusion_step(
    u: pnex.In("f32", (None, None)),
    u_new: pnex.InMut("f32", "u"),
    coeff: pnex.Scalar("f32"),
):
    rows, cols = u.shape
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TX + tx  # this thread's column
    top = cuda.blockIdx.y * TILE_ROWS  # the tile's first row
    zero = float32(0.0)

    # 1. Read this thread's points into registers (0 outside the grid), all loads at once.
    mine = cuda.local.array(ROWS_PER_THREAD, float32)
    for k in range(ROWS_PER_THREAD):
        row = top + ty + k * TY
        mine[k] = u[row, col] if row < rows and col < cols else zero
    # The halo (the rows above and below the tile, the columns left and right of it):
    # one point each for the block's first 2 * (TX + TILE_ROWS) threads.
    h = ty * TX + tx
    if h < 2 * TX:
        hr = 0 if h < TX else TILE_ROWS + 1
        hc = h % TX + 1
    else:
        hr = (h - 2 * TX) % TILE_ROWS + 1
        hc = 0 if h < 2 * TX + TILE_ROWS else TX + 1
    halo_row = top + hr - 1
    halo_col = cuda.blockIdx.x * TX + hc - 1
    has_halo = h < 2 * (TX + TILE_ROWS)
    inside = has_halo and 0 <= halo_row < rows and 0 <= halo_col < cols
    halo = u[halo_row, halo_col] if inside else zero

    # 2. Share them through shared memory, and wait for the whole block.
    tile = cuda.shared.array(shape=HALO_SHAPE, dtype=float32)
    for k in range(ROWS_PER_THREAD):
        tile[ty + k * TY + 1, tx + 1] = mine[k]
    if has_halo:
        tile[hr, hc] = halo
    cuda.syncthreads()

    # 3. Each point moves by coeff times its 5-point Laplacian.
    for k in range(ROWS_PER_THREAD):
        r = ty + k * TY + 1
        row = top + r - 1
        if row < rows and col < cols:
            c = tile[r, tx + 1]
            laplacian = tile[r - 1, tx + 1] + tile[r + 1, tx + 1] + tile[r, tx] + tile[r, tx + 2] - (c + c + c + c)
            u_new[row, col] = c + coeff * laplacian


def initial_field(n: int, seed: int = 3966789) -> torch.Tensor:
    """The Numba documentation's "jagged image": filtered noise, thresholded (float32)."""
    from numpy import fft

    r = np.random.default_rng(seed)
    field = r.random(size=(n, n), dtype=np.float32)
    field = fft.fftshift(fft.fft2(field))
    radius = 1 + np.sqrt((np.arange(n).reshape(-1, 1) - n // 2) ** 2 + (np.arange(n).reshape(1, -1) - n // 2) ** 2)
    field = field * (radius**-1.7)
    field = fft.ifft2(fft.ifftshift(field)) * (radius < 0.45 * n)
    field = field.real * (field.real > np.percentile(field.real, 70))
    return torch.from_numpy(np.ascontiguousarray(field, dtype=np.float32))


_LAPLACIAN = ((0.0, -1.0, 0.0), (-1.0, 4.0, -1.0), (0.0, -1.0, 0.0))


def laplacian(u: torch.Tensor) -> torch.Tensor:
    """The documentation's ``lapl``: 4 u minus its four neighbours (0 outside), by conv2d."""
    weight = torch.tensor(_LAPLACIAN, dtype=u.dtype, device=u.device).view(1, 1, 3, 3)
    return F.conv2d(u[None, None], weight, padding=1)[0, 0]


def torch_diffusion_step(u: torch.Tensor, weight: torch.Tensor, coeff: float) -> torch.Tensor:
    """One eager step on ``u`` of shape (1, 1, n, n): ``u - coeff * lapl``, the 5-point
    Laplacian as a conv2d with zero padding (the same boundary as the kernels)."""
    return u - coeff * F.conv2d(u, weight, padding=1)


def reference_diffusion(u0: torch.Tensor, steps: int, coeff: float = 0.25) -> torch.Tensor:
    """``steps`` steps in float64 by shifted slices (no conv2d, no TF32): the reference
    every variant's field is checked against."""
    u = u0.double()
    for _ in range(steps):
        p = F.pad(u, (1, 1, 1, 1))
        u = u + coeff * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u)
    return u


def eager_step_into(u: torch.Tensor, u_new: torch.Tensor, coeff: float) -> None:
    """The pnex op's contract in eager PyTorch: write one step from ``u`` into ``u_new``
    (the reference the ``%%pnex`` cell checks the kernel against)."""
    u_new.copy_(u - coeff * laplacian(u))


def eager_steps_into(u: torch.Tensor, u_new: torch.Tensor, coeff: float, steps: int) -> None:
    """The blocked op's contract in eager PyTorch: write ``steps`` steps from ``u`` into
    ``u_new`` (the reference the ``%%pnex`` cell checks :func:`diffusion_blocked` against)."""
    u_new.copy_(run_diffusion_eager(u, steps, coeff))


def laplacian_weight(device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(_LAPLACIAN, dtype=dtype, device=device).view(1, 1, 3, 3)


def run_diffusion(step_op: Any, u0: torch.Tensor, steps: int, coeff: float = 0.25) -> torch.Tensor:
    """``steps`` steps of the pnex op from ``u0`` (unchanged), ping-ponging between two
    buffers: no allocation per step.  Returns the final field."""
    a = u0.clone()
    b = torch.empty_like(a)
    for _ in range(steps // 2):
        step_op(a, b, coeff)
        step_op(b, a, coeff)
    if steps % 2:
        step_op(a, b, coeff)
        return b
    return a


def run_diffusion_eager(u0: torch.Tensor, steps: int, coeff: float = 0.25, step=torch_diffusion_step) -> torch.Tensor:
    weight = laplacian_weight(u0.device, u0.dtype)
    u = u0[None, None].clone()
    for _ in range(steps):
        u = step(u, weight, coeff)
    return u[0, 0]


# Temporal blocking: several steps per launch.  A block loads a tile of the field, halo
# included, into registers, then takes `steps` steps on it, exchanging neighbours through
# shared memory, and writes the tile's interior once.  A one-step kernel reads and writes the
# whole field every step; this one does so once per `steps` steps (plus the halo, read by two
# blocks), so its DRAM traffic per step is about 1/steps of the one-step kernel's.  The price
# is work on the halo: a tile of H x W updates (H - 2 steps) x (W - 2 steps) points.
#
# The halo is `steps` wide: the tile's edge points have neighbours outside the tile, so they
# are not updated (they go stale), and the stale band grows by one point a step.  After
# `steps` steps the points at least `steps` from the edge are exact: those are written.
#
# The block is 32 x 8 threads.  Each thread holds ROWS consecutive rows of COLS columns
# (32 apart, so a warp reads and writes 32 neighbours of a row) in registers; above/below
# neighbours come from its own registers, except at the ends of its column, and left/right
# neighbours from shared memory.  ROWS and COLS (the tile's shape, 8 ROWS x 32 COLS) are
# pnex.Tune parameters: the autotuner times every choice and keeps the fastest.  The results
# do not depend on them (every point is computed the same way), so every choice is exact.
MAX_STEPS_PER_LAUNCH = 15  # the smallest tile (32 x 32) must keep an interior: 32 - 2 * steps > 0


@pnex.jit(
    n_threads=("(u.size(1) + 32 * COLS - 2 * steps - 1) // (32 * COLS - 2 * steps) * 32",
               "(u.size(0) + 8 * ROWS - 2 * steps - 1) // (8 * ROWS - 2 * steps) * 8"),
    threads_per_block=(32, 8),  # pinned: the tile is sized for it
    shared_bytes="2 * (8 * ROWS + 2) * (32 * COLS) * 4",  # two tiles and a row above and below each
    autotune_key=("u.size(0)", "u.size(1)", "steps"),
    # Other steps compute wrong values without a fault (a negative halo; no interior left): refused.
    requires=f"0 <= steps <= {MAX_STEPS_PER_LAUNCH}",
)
@named_in_workloads
def diffusion_blocked(
    u: pnex.In("f32", (None, None)),
    u_new: pnex.InMut("f32", "u"),
    coeff: pnex.Scalar("f32"),
    steps: pnex.Scalar("i32"),
    ROWS: pnex.Tune(4, 8),
    COLS: pnex.Tune(1, 2, 4),
):
    rows, cols = u.shape
    tx = cuda.threadIdx.x & 31  # the block is 32 x 8; the masks tell the compiler these are >= 0,
    ty = cuda.threadIdx.y & 7  # so that no shared-memory index below is tested for wrap-around
    H = 8 * ROWS  # the tile, halo included
    W = 32 * COLS
    r0 = ty * ROWS  # this thread's first row in the tile
    top = cuda.blockIdx.y * (H - 2 * steps) - steps  # the tile's first row and column in the field
    left = cuda.blockIdx.x * (W - 2 * steps) - steps

    # 1. Load the tile into registers (0 outside the field), and note which points to update:
    #    inside the field (outside it the field is 0 at every step) and not on the tile's edge.
    v = cuda.local.array((ROWS, COLS), float32)
    row_live = cuda.local.array(ROWS, int32)
    col_live = cuda.local.array(COLS, int32)
    for i in range(ROWS):
        row = top + r0 + i
        row_live[i] = 0 < r0 + i < H - 1 and 0 <= row < rows
        for j in range(COLS):
            col = left + tx + 32 * j
            v[i, j] = u[row, col] if 0 <= row < rows and 0 <= col < cols else float32(0.0)
    for j in range(COLS):
        col = left + tx + 32 * j
        col_live[j] = 0 < tx + 32 * j < W - 1 and 0 <= col < cols

    # 2. The steps.  Shared memory holds two tiles (even and odd steps), each with a spare row
    #    above and below; tile row r is shared row r + 1.  One barrier a step: a thread writes
    #    tile s % 2 only after every thread has read it at step s - 2.
    tile = cuda.shared.array(0, float32)
    for s in range(steps):
        at = (s & 1) * ((H + 2) * W) + r0 * W + tx  # the shared row above this thread's first
        for i in range(ROWS):
            for j in range(COLS):
                tile[at + (i + 1) * W + 32 * j] = v[i, j]
        cuda.syncthreads()
        for j in range(COLS):
            above = tile[at + 32 * j]
            for i in range(ROWS):
                here = v[i, j]
                k = at + (i + 1) * W + 32 * j
                below = v[i + 1, j] if i < ROWS - 1 else tile[k + W]
                new = here + coeff * (above + below + tile[k - 1] + tile[k + 1] - float32(4.0) * here)
                v[i, j] = new if row_live[i] and col_live[j] else here
                above = here

    # 3. Write the points at least `steps` from the tile's edge: those are exact.
    for i in range(ROWS):
        row = top + r0 + i
        for j in range(COLS):
            col = left + tx + 32 * j
            if steps <= r0 + i < H - steps and steps <= tx + 32 * j < W - steps and row < rows and col < cols:
                u_new[row, col] = v[i, j]


def run_diffusion_blocked(
    op: Any, u0: torch.Tensor, steps: int, coeff: float = 0.25, per_launch: int = 4
) -> torch.Tensor:
    """``steps`` steps of :func:`diffusion_blocked` from ``u0`` (unchanged), ``per_launch``
    steps per launch and the remainder in one last launch, ping-ponging between two
    buffers.  Returns the final field."""
    if not 1 <= per_launch <= MAX_STEPS_PER_LAUNCH:
        raise ValueError(f"per_launch must be from 1 to {MAX_STEPS_PER_LAUNCH} (the halo is per_launch points wide "
                         f"and the smallest tile 32 x 32), got {per_launch}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    a = u0.clone()
    b = torch.empty_like(a)
    done = 0
    while done < steps:
        n = min(per_launch, steps - done)
        op(a, b, coeff, n)
        a, b = b, a
        done += n
    return a
