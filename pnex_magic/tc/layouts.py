"""The operand layouts of the tensor-core instructions, written down once, as data.

Each table says which element of a warp-level matrix a lane holds in which slot of
its fragment, exactly as the PTX ISA's figures for ``mma.m16n8k16``, ``mma.m16n8k8``
and ``ldmatrix`` draw them ("Matrix fragments for mma.m16n8k16 with floating point
type", "Warp-level matrix load instruction: ldmatrix").  The CPU simulator builds its
NumPy references from these tables, and the tests check them against the ISA's
formulas and, on a GPU, against the hardware.

In every table ``lane = 4 * g + t`` (``g = lane // 4``, the "group", ``t = lane % 4``,
the "thread in group").  A 32-bit fragment word that holds two 16-bit elements holds
the first in its low half (the element at the lower address, little-endian).
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = [
    "MMA_SHAPES",
    "mma_a_layout",
    "mma_b_layout",
    "mma_c_layout",
    "ldmatrix_layout",
    "swizzle_arithmetic",
]

#: The shapes pnex exposes: kind -> (m, n, k, A words per lane, B words per lane,
#: elements per 32-bit word of A and B).
MMA_SHAPES = {
    "f16": (16, 8, 16, 4, 2, 2),
    "bf16": (16, 8, 16, 4, 2, 2),
    "tf32": (16, 8, 8, 4, 2, 1),
}


def _lane_g_t() -> tuple[np.ndarray, np.ndarray]:
    lane = np.arange(32)
    return lane // 4, lane % 4


@functools.lru_cache(maxsize=None)
def mma_a_layout(kind: str) -> np.ndarray:
    """``(32, elements, 2)``: for each lane and each element of its A fragment (in
    word order, low half first), the (row, column) of A (m x k, row-major) it holds."""
    g, t = _lane_g_t()
    if kind in ("f16", "bf16"):  # 4 words of 2 halves: a0..a7
        i = np.arange(8)
        row = g[:, None] + 8 * ((i[None, :] // 2) % 2)
        col = 2 * t[:, None] + (i[None, :] % 2) + 8 * (i[None, :] // 4)
    elif kind == "tf32":  # 4 words of one element
        i = np.arange(4)
        row = g[:, None] + 8 * (i[None, :] % 2)
        col = t[:, None] + 4 * (i[None, :] // 2)
    else:
        raise ValueError(f"no mma kind {kind!r}")
    return np.stack(np.broadcast_arrays(row, col), axis=-1)


@functools.lru_cache(maxsize=None)
def mma_b_layout(kind: str) -> np.ndarray:
    """``(32, elements, 2)``: the (row, column) of B (k x n, "col": each column's k
    elements adjacent) that each element of a lane's B fragment holds."""
    g, t = _lane_g_t()
    if kind in ("f16", "bf16"):  # 2 words of 2 halves: b0..b3
        i = np.arange(4)
        row = 2 * t[:, None] + (i[None, :] % 2) + 8 * (i[None, :] // 2)
    elif kind == "tf32":
        i = np.arange(2)
        row = t[:, None] + 4 * i[None, :]
    else:
        raise ValueError(f"no mma kind {kind!r}")
    col = np.broadcast_to(g[:, None], row.shape)
    return np.stack(np.broadcast_arrays(row, col), axis=-1)


@functools.lru_cache(maxsize=None)
def mma_c_layout() -> np.ndarray:
    """``(32, 4, 2)``: the (row, column) of the 16 x 8 accumulator (float32) that each
    of a lane's four accumulator elements holds (the same for every kind)."""
    g, t = _lane_g_t()
    i = np.arange(4)
    row = g[:, None] + 8 * (i[None, :] // 2)
    col = 2 * t[:, None] + (i[None, :] % 2)
    return np.stack(np.broadcast_arrays(row, col), axis=-1)


@functools.lru_cache(maxsize=None)
def ldmatrix_layout(trans: bool) -> np.ndarray:
    """``(32, 2, 2)``: for one 8 x 8 matrix of 16-bit elements whose rows lanes point
    at, the (row, column) of the matrix that the low and the high half of each lane's
    word hold.  Without ``.trans`` lane ``l`` gets row ``l // 4``, columns ``2 (l % 4)``
    and ``2 (l % 4) + 1``; with it, column ``l // 4`` of rows ``2 (l % 4)`` and
    ``2 (l % 4) + 1``."""
    g, t = _lane_g_t()
    half = np.arange(2)
    if trans:
        row, col = 2 * t[:, None] + half[None, :], g[:, None] + 0 * half[None, :]
    else:
        row, col = g[:, None] + 0 * half[None, :], 2 * t[:, None] + half[None, :]
    return np.stack([row, col], axis=-1)


def swizzle_arithmetic(row, col, row_elems):  # no annotations: Numba compiles it as swizzle's overload
    """The stored column of element (row, col) of a tile of 16-bit elements, ``row_elems``
    a row: 16-byte chunks XOR the row's place in its 8-line group of 128 bytes
    (CUTLASS's ``Swizzle<3,4,3>`` for rows of 128 bytes or more)."""
    chunk = col >> 3
    if row_elems >= 64:
        chunk = chunk ^ (row & 7)
    elif row_elems == 32:
        chunk = chunk ^ ((row >> 1) & 3)
    elif row_elems == 16:
        chunk = chunk ^ ((row >> 2) & 1)
    return (chunk << 3) | (col & 7)
