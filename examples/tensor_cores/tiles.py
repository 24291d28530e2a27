"""Tile sizes that must divide the problem's: a tensor-core op that says so before it
launches.

A tiled kernel computes whole tiles: with M = 130 and 128-row blocks its grid covers
128 rows and the last two rows of the output are never written (``Out`` tensors are
not zeroed), and a K that is not a multiple of the k-tile drops its tail from every
dot product.  Each example states its tile rules with ``jit(requires=...)``
(:func:`tile_rule` words them): every launcher (eager, the C++ launcher,
``torch.compile``, JAX, a saved artifact) refuses a call that breaks one with
:class:`pnex_magic.ArgumentValueError`, naming the size, its value and the tile.

:func:`grouped_tile` is the GEMM kernels' block order; :func:`init_buffers` and
:func:`release` set up their buffers' barriers and free a buffer (device functions they
share).
"""

from __future__ import annotations

from numba import cuda

from pnex_magic import tc

__all__ = ["tile_rule", "grouped_tile", "init_buffers", "release"]


@cuda.jit(device=True, inline=True)
def grouped_tile(pid, m_tiles, n_tiles, group):
    """(row block, column block) of C that block ``pid`` computes, of ``m_tiles`` x
    ``n_tiles``: consecutive blocks walk down ``group`` row blocks, then step one column
    block right (the last group may have fewer rows), so that the blocks resident at once
    read a few row blocks of A and column blocks of W from L2 again and again.  With
    ``group`` and ``m_tiles`` even, blocks 2c and 2c + 1 compute adjacent row blocks of
    one column block (a 2-block cluster that shares W's tile)."""
    in_group = group * n_tiles
    first_m = (pid // in_group) * group
    rows = min(m_tiles - first_m, group)
    return first_m + (pid % in_group) % rows, (pid % in_group) // rows


@cuda.jit(device=True, inline=True)
def init_buffers(bars, stages, readers, cluster):
    """The barriers of ``stages`` buffers, made by thread 0: "full" ``bars[s]`` (the
    producer's arrival and the bytes of its copies) and "empty" ``bars[stages + s]``
    (``readers`` arrivals: the warps that read the buffer, in every block that fills
    it); then every thread waits until they exist, across the cluster where ``cluster``
    blocks share buffers (another block's copies and arrivals reach them)."""
    if cuda.threadIdx.x == 0:
        for s in range(stages):
            tc.mbarrier_init(bars, s, 1)
            tc.mbarrier_init(bars, stages + s, readers)
    if cluster > 1:
        tc.cluster_sync()
    else:
        cuda.syncthreads()


@cuda.jit(device=True, inline=True)
def release(bars, i, cluster):
    """A consumer warp's arrival on the "empty" barrier ``bars[i]`` of a buffer: of every
    block of its cluster (``cluster`` blocks, a constant) where their producers all
    write the buffer (TMA multicast), else of its own block."""
    if cluster > 1:
        for r in range(cluster):
            tc.mbarrier_arrive_cluster(bars, i, r)
    else:
        tc.mbarrier_arrive(bars, i)


def tile_rule(size: str, multiple: int, name: str, tile: str, minimum: int = 0) -> dict[str, str]:
    """The ``jit(requires=...)`` entry that says ``size`` (an expression over the op's
    arguments, ``"a.size(0)"``) is a multiple of ``multiple`` (and at least ``minimum``);
    ``name``: what the size is called (``"M"``), ``tile``: what the multiple is (``"the
    block tile BM"``).  Merge several with ``{**a, **b}``."""
    condition = f"{size} % {multiple} == 0" + (f" and {size} >= {minimum}" if minimum else "")
    least = f" and at least {minimum}" if minimum else ""
    return {condition: f"{name} must be a multiple of {tile} = {multiple}{least}; the kernel computes whole tiles "
                       f"only: pad the tensor, or build the op with a tile that divides {name}"}
