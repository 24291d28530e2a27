"""Tile sizes that must divide the problem's: a tensor-core op that says so before it
launches.

A tiled kernel computes whole tiles: with M = 130 and 128-row blocks its grid covers
128 rows and the last two rows of the output are never written (``Out`` tensors are
not zeroed), and a K that is not a multiple of the k-tile drops its tail from every
dot product.  pnex's shape expressions say how sizes relate to each other, not that a
size is a multiple of a constant, so each example wraps its op in a :class:`TiledOp`,
which checks every rule on the arguments' sizes first and raises
:class:`pnex_magic.ArgumentShapeError` naming the argument, the axis and the tile.

It is an ordinary Python call in front of the op: ``torch.compile(fullgraph=True)``
traces through it (a size check on a symbolic size becomes a guard), and everything
else (``pnex.inspect``, the report, ``.definition``) reaches the op itself, also as
``tiled.op``.

:func:`grouped_tile` is the GEMM kernels' block order (a device function they share).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from numba import cuda

import pnex_magic as pnex

__all__ = ["Rule", "TiledOp", "grouped_tile"]


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


@dataclasses.dataclass(frozen=True)
class Rule:
    """``argument``'s size on ``axis`` must be a multiple of ``multiple`` (and at least
    ``minimum``); ``size``: what the size is called (``"K"``), ``tile``: what the
    multiple is (``"the k-tile BK"``)."""

    argument: str
    axis: int
    multiple: int
    size: str
    tile: str
    minimum: int = 0


class TiledOp:
    """A pnex op (``op``) whose calls first check :class:`Rule`\\s on their tensors' sizes."""

    def __init__(self, op: Any, rules: list[Rule]):
        self.op = op
        self.rules = tuple(rules)
        spec = op.definition.spec
        self._name = spec.name
        self._positions = {p.name: i for i, p in enumerate(spec.arguments)}
        for rule in self.rules:
            if rule.argument not in self._positions:
                raise ValueError(f"{self._name}: no argument {rule.argument!r} for the tile rule {rule}")

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Raise :class:`pnex_magic.ArgumentShapeError` for the first rule the arguments break."""
        for rule in self.rules:
            value = kwargs.get(rule.argument)
            if value is None:
                position = self._positions[rule.argument]
                if position >= len(args):
                    continue  # the op's own checks name a missing argument
                value = args[position]
            shape = getattr(value, "shape", None)
            if shape is None or len(shape) <= rule.axis:
                continue  # the op's own checks name a wrong type or rank
            n = shape[rule.axis]
            if n % rule.multiple or n < rule.minimum:
                least = f" and at least {rule.minimum}" if rule.minimum else ""
                raise pnex.ArgumentShapeError(
                    f"{self._name}(): {rule.size} = {rule.argument}.shape[{rule.axis}] = {n} must be a multiple of "
                    f"{rule.tile} = {rule.multiple}{least} (got shape {tuple(shape)}); the kernel computes whole "
                    f"tiles only: pad the tensor, or build the op with a tile that divides {rule.size}"
                )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.check(*args, **kwargs)
        return self.op(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # .definition, .register_autograd, ...: the op's
        return getattr(self.op, name)

    def __repr__(self) -> str:
        rules = ", ".join(f"{r.size} % {r.multiple}" for r in self.rules)
        return f"<TiledOp {self._name} ({rules}) of {self.op!r}>"
