"""Thread-block clusters (Hopper, sm_90): the blocks of a cluster run at once on
neighbouring SMs, may read and write each other's shared memory and arrive on each
other's barriers (:mod:`pnex_magic.tc`'s ``cluster_*`` primitives), and a TMA copy
may land in several of them at once (``tma_load_multicast``).

A kernel asks for them with ``jit(cluster_dims=(x, y, z))``, CUDA's compile-time
``__cluster_dims__``: its code carries the PTX directives ``.explicitcluster`` and
``.reqnctapercluster x, y, z`` (through the NVVM annotations ``cluster_dim_{x,y,z}``,
added where Numba writes the launch bounds, :func:`annotations`), so that a plain
``cuLaunchKernel`` launches clusters: no launcher changes, only a check that the grid
is a whole number of clusters (:func:`grid_problem`, which every launcher applies;
the driver refuses such a launch with a bare ``CUDA_ERROR_INVALID_CLUSTER_SIZE``).

This module is the option's checks and its compile-time hook; it needs no GPU.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import KernelDefinitionError

__all__ = ["MAX_PORTABLE", "MIN_CC", "parse_cluster_dims", "arch_problem", "grid_problem", "ptx_cluster_dims",
           "annotations", "describe"]

#: The most blocks a cluster may have without the driver's non-portable opt-in (8 on H100).
MAX_PORTABLE = 8
#: Clusters came with Hopper.
MIN_CC = (9, 0)

_AXES = "xyz"


def parse_cluster_dims(kernel: str, value: Any, n_axes: int) -> tuple[int, int, int] | None:
    """The ``cluster_dims`` option checked: an int or a tuple of 1 to 3 positive ints,
    at most :data:`MAX_PORTABLE` blocks in all, none on an axis the launch does not
    have (``n_axes``: the length of ``n_threads``); padded to 3 axes.  ``None``: no
    clusters (``(1, 1, 1)`` is clusters of one block: the cluster primitives work, alone)."""
    where = f"kernel {kernel!r}, cluster_dims"
    if value is None:
        return None
    dims = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= 3 or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims
    ):
        raise KernelDefinitionError(
            f"{where} = {value!r}: expected blocks per cluster along x (and y, z) as 1 to 3 positive ints, "
            f"e.g. cluster_dims=(2, 1, 1)"
        )
    dims = tuple(dims) + (1,) * (3 - len(dims))
    blocks = dims[0] * dims[1] * dims[2]
    if blocks > MAX_PORTABLE:
        raise KernelDefinitionError(
            f"{where} = {value!r} asks for {blocks} blocks a cluster; at most {MAX_PORTABLE} are portable "
            f"(an H100 runs up to 16 only with the driver's non-portable opt-in, which pnex does not make)"
        )
    for axis in range(n_axes, 3):
        if dims[axis] != 1:
            raise KernelDefinitionError(
                f"{where} = {value!r} groups blocks along {_AXES[axis]}, but the launch has {n_axes} "
                f"ax{'is' if n_axes == 1 else 'es'} (n_threads): give {_AXES[axis]} 1 cluster block"
            )
    return dims  # type: ignore[return-value]


def describe(dims: Sequence[int]) -> str:
    return " x ".join(str(d) for d in dims)


def arch_problem(kernel: str, dims: Sequence[int] | None, cc: tuple[int, int]) -> str | None:
    """Why a kernel of ``dims`` clusters cannot be compiled for ``cc`` (``None``: it can)."""
    if dims is None or cc >= MIN_CC:
        return None
    return (f"kernel {kernel!r} asks for thread-block clusters (cluster_dims={tuple(dims)}), which need sm_90 or "
            f"newer (Hopper: H100, H200); it cannot be compiled for sm_{cc[0]}{cc[1]}")


def grid_problem(kernel: str, grid: Sequence[int], dims: Sequence[int] | None) -> str | None:
    """Why a launch of ``grid`` blocks cannot be cut into clusters of ``dims`` (``None``:
    it can, or the kernel has no clusters)."""
    if dims is None:
        return None
    bad = [_AXES[a] for a in range(3) if grid[a] % dims[a]]
    if not bad:
        return None
    axes = ", ".join(f"{a}: {grid[_AXES.index(a)]} blocks, not a multiple of {dims[_AXES.index(a)]}" for a in bad)
    return (
        f"{kernel}(): the grid ({describe(grid)} blocks) is not a whole number of clusters of "
        f"cluster_dims={tuple(dims)} ({axes}); the GPU launches clusters only whole. Give n_threads a multiple of "
        f"cluster_dims x threads_per_block on each axis (or pad the problem)"
    )


_DIRECTIVE_RE = re.compile(r"^\s*\.reqnctapercluster\s+(\d+)\s*(?:,\s*(\d+))?\s*(?:,\s*(\d+))?", re.MULTILINE)


def ptx_cluster_dims(ptx: str) -> tuple[int, int, int] | None:
    """The cluster shape a kernel's PTX requires (``.reqnctapercluster``), or ``None``."""
    m = _DIRECTIVE_RE.search(ptx or "")
    if m is None:
        return None
    return tuple(int(g) if g else 1 for g in m.groups())  # type: ignore[return-value]


@contextlib.contextmanager
def annotations(dims: Sequence[int] | None) -> Iterator[None]:
    """While active, the kernels Numba compiles carry ``dims`` as NVVM's ``cluster_dim_x``,
    ``_y``, ``_z`` annotations (NVVM writes ``.explicitcluster`` and ``.reqnctapercluster``):
    added where Numba adds the launch bounds (``nvvm.set_launch_bounds``), which it calls
    for every kernel, PTX and LTO-IR alike.  Used inside pnex's compile lock
    (:func:`pnex_magic.numbadriver.target_device`), so no other compile sees it."""
    if dims is None:
        yield
        return
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.cudadrv import nvvm

    original = nvvm.set_launch_bounds

    def set_launch_bounds(kernel: Any, launch_bounds: Any) -> None:
        original(kernel, launch_bounds)
        module = kernel.module
        found = cgutils.get_or_insert_named_metadata(module, "nvvm.annotations")
        for axis, size in zip(_AXES, dims):
            found.add(module.add_metadata(
                (kernel, ir.MetaDataString(module, f"cluster_dim_{axis}"), ir.Constant(ir.IntType(32), int(size)))))

    nvvm.set_launch_bounds = set_launch_bounds
    try:
        yield
    finally:
        nvvm.set_launch_bounds = original
