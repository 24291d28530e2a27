"""What a call's arguments tell the report (:mod:`pnex_magic.efficiency`): the bytes
its threads read (:func:`input_bytes`) and its mix of reads and writes
(:func:`read_share`, for the ceiling at that mix, :mod:`pnex_magic.ceiling`), the
size of one element of its inputs (:func:`element_bytes`), and the inputs that are
not contiguous along the axis ``cuda.grid``'s x runs over (:func:`strided_along_x`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .expressions import BinOp, Expr, MinMax, Neg, Numel, Size
from .spec import KernelSpec, TensorParam

__all__ = ["strided_along_x", "input_bytes", "element_bytes", "read_share"]


def _x_size(expr: Expr) -> Size | Numel | None:
    """The first size the x extent is made of (``out.size(1) * 2`` → ``out.size(1)``)."""
    if isinstance(expr, (Size, Numel)):
        return expr
    children: tuple[Expr, ...] = ()
    if isinstance(expr, BinOp):
        children = (expr.left, expr.right)
    elif isinstance(expr, Neg):
        children = (expr.operand,)
    elif isinstance(expr, MinMax):
        children = expr.args
    for child in children:
        found = _x_size(child)
        if found is not None:
            return found
    return None


def strided_along_x(spec: KernelSpec, args: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    """Input tensors (of the call's ``args``) that are not contiguous along the axis
    ``cuda.grid``'s x runs over, as read from ``n_threads[0]``: axis ``i`` of tensors of
    ``t``'s rank for ``t.size(i)``, the last axis for ``t.numel()``."""
    size = _x_size(spec.n_threads[0])
    if size is None:
        return ()
    ndim = spec.param(size.param).ndim
    axis = size.axis if isinstance(size, Size) else ndim - 1
    found = []
    for p, value in zip(spec.arguments, args):
        if not isinstance(p, TensorParam) or value.dim() != ndim or ndim == 0:
            continue
        if value.shape[axis] > 1 and value.stride(axis) != 1:
            found.append((p.name, int(value.stride(axis))))
    return tuple(found)


def _tensor_bytes(spec: KernelSpec, args: Sequence[Any], roles: tuple[str, ...]) -> int:
    """Bytes of the call's tensor arguments whose role is one of ``roles``."""
    return sum(int(v.numel() * v.element_size()) for p, v in zip(spec.arguments, args)
               if isinstance(p, TensorParam) and p.role in roles)


def input_bytes(spec: KernelSpec, args: Sequence[Any]) -> int:
    """Bytes of the call's input tensors (``In`` and ``InMut`` arguments): what its
    threads read, for the bytes-in-flight estimate."""
    return _tensor_bytes(spec, args, ("in", "inmut"))


def element_bytes(spec: KernelSpec, args: Sequence[Any]) -> int | None:
    """Bytes of one element of the call's smallest-element input tensor (``In`` and
    ``InMut``), for the sector reason (``None`` without input tensors)."""
    sizes = [int(value.element_size()) for p, value in zip(spec.arguments, args)
             if isinstance(p, TensorParam) and p.role in ("in", "inmut")]
    return min(sizes) if sizes else None


def read_share(spec: KernelSpec, args: Sequence[Any], bytes_moved: int) -> float:
    """Bytes a call reads over the bytes it reads and writes: ``In`` and ``InMut``
    tensors read; ``InMut`` tensors and the outputs (the rest of ``bytes_moved``, which
    counts each tensor once) written."""
    reads = input_bytes(spec, args)
    writes = max(0, bytes_moved - _tensor_bytes(spec, args, ("in",)))
    return reads / (reads + writes) if reads + writes else 0.5
