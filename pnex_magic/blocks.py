"""Launch-configuration options of a kernel: ``n_threads``, ``threads_per_block``
(one block shape, ``"auto"`` or a list of autotune candidates) and
``autotune_key``, checked into plain tuples for :class:`~pnex_magic.spec.KernelSpec`.

``threads_per_block`` takes

* ``None``: the default block, 256, (16, 16) or (8, 8, 4) by launch dimensionality;
* one block shape: an ``int`` (1-D) or a tuple with one size per launch axis;
* ``"auto"``: the candidates of :data:`AUTO_CANDIDATES` for the dimensionality;
* a list of candidates, each an ``int`` (1-D launches) or a tuple matching the
  launch's dimensionality: ``[128, 256, 512]``, ``[(32, 8), (16, 16)]``.

With several candidates the op is *autotuned*: on the first GPU call for a key it
times every candidate that fits the kernel's limits and keeps the fastest (see
:mod:`pnex_magic.launch.autotune`).  The first candidate is the default: what the
CPU simulator and calls that may not benchmark (CUDA-graph capture,
``torch.compile``'d code, ``PNEX_AUTOTUNE=0``) use.  Autotune only varies what the
user allows: a kernel whose results depend on its block shape (a
``cuda.shared.array`` sized for one block, indexing that assumes ``cuda.blockDim``)
must pin ``threads_per_block``.

``autotune_key`` names integer expressions over the op's arguments (the
expression language of shapes: ``"a.size(0)"``, ``"n"``); calls whose key values
are equal share a choice.  Without it the key is every input tensor's size on
every axis, rounded up to a power of two (:func:`bucket`), as
``triton.autotune(key=...)`` buckets sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import KernelDefinitionError, ShapeExpressionError
from .expressions import Expr, NameInfo, parse_expression

__all__ = [
    "DEFAULT_BLOCK",
    "AUTO_CANDIDATES",
    "MAX_CANDIDATES",
    "bucket",
    "parse_n_threads",
    "parse_threads_per_block",
    "parse_autotune_key",
]

#: The default block shape by launch dimensionality (also the first ``"auto"`` candidate).
DEFAULT_BLOCK = {1: (256,), 2: (16, 16), 3: (8, 8, 4)}

#: ``threads_per_block="auto"``: the candidates by launch dimensionality, default first.
#: 2-D and 3-D lists hold wide blocks (a warp along X, for rows of contiguous memory),
#: square ones and narrow ones (for tall-skinny extents along X).
AUTO_CANDIDATES: dict[int, tuple[tuple[int, ...], ...]] = {
    1: ((256,), (128,), (512,), (1024,), (64,)),
    2: ((16, 16), (32, 8), (32, 4), (64, 4), (128, 2), (256, 1), (8, 32), (4, 64), (32, 32)),
    3: ((8, 8, 4), (32, 4, 2), (32, 8, 1), (16, 16, 1), (64, 2, 2), (4, 8, 8)),
}

#: At most this many candidates (each one is benchmarked per key).
MAX_CANDIDATES = 32


def bucket(n: int) -> int:
    """The power-of-two bucket of a size: the smallest power of two at least ``n``
    (0 stays 0).  The C++ launcher computes the same."""
    n = int(n)
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def as_tuple(value: Any) -> tuple | None:
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return None


def parse_n_threads(kernel: str, n_threads: Any) -> tuple[Any, ...]:
    """``n_threads`` as a tuple of 1 to 3 entries (X, Y, Z order)."""
    nt = as_tuple(n_threads)
    if nt is None:
        nt = (n_threads,)
    if not 1 <= len(nt) <= 3:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: n_threads must be one expression or a tuple of 2 or 3 "
            f"(X, Y, Z order); got {len(nt)} entries: {n_threads!r}"
        )
    for entry in nt:
        if isinstance(entry, int) and not isinstance(entry, bool) and entry <= 0:
            raise KernelDefinitionError(f"kernel {kernel!r}: n_threads entries must be positive, got {n_threads!r}")
    return nt


def _check_block(kernel: str, block: tuple[Any, ...], ndim: int, what: str) -> tuple[int, ...]:
    if len(block) != ndim:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: threads_per_block {what} has {len(block)} dimension(s) but n_threads has "
            f"{ndim}; give one block size per launch axis"
        )
    for size in block:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise KernelDefinitionError(
                f"kernel {kernel!r}: threads_per_block entries must be positive ints, got {what}"
            )
    total = 1
    for size in block:
        total *= size
    if total > 1024:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: threads_per_block {what} makes {total} threads per block; CUDA allows at most 1024"
        )
    if len(block) == 3 and block[2] > 64:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: threads_per_block {what}: Z size {block[2]} exceeds CUDA's limit of 64"
        )
    return tuple(block)


def parse_threads_per_block(kernel: str, threads_per_block: Any, ndim: int) -> tuple[tuple[int, ...], ...]:
    """The block candidates, default first: one entry for a fixed block shape."""
    if threads_per_block is None:
        return (DEFAULT_BLOCK[ndim],)
    if isinstance(threads_per_block, str):
        if threads_per_block.strip().lower() == "auto":
            return AUTO_CANDIDATES[ndim]
        raise KernelDefinitionError(
            f"kernel {kernel!r}: threads_per_block={threads_per_block!r}; expected an int, a tuple (one size per "
            f"launch axis), 'auto' (autotune over pnex's candidates) or a list of candidates"
        )
    if not isinstance(threads_per_block, list):
        block = as_tuple(threads_per_block) or (threads_per_block,)
        return (_check_block(kernel, block, ndim, repr(threads_per_block)),)
    if not threads_per_block:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: threads_per_block=[] lists no candidates; give at least one block shape, or 'auto'"
        )
    if len(threads_per_block) > MAX_CANDIDATES:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: threads_per_block lists {len(threads_per_block)} candidates; at most "
            f"{MAX_CANDIDATES} (each is benchmarked on the first call of every autotune key)"
        )
    candidates: list[tuple[int, ...]] = []
    for i, entry in enumerate(threads_per_block):
        what = f"candidate {i} ({entry!r})"
        block = as_tuple(entry)
        if block is None:
            if ndim > 1 and isinstance(entry, int) and not isinstance(entry, bool):
                example = tuple([32] + [8] * (ndim - 1))
                raise KernelDefinitionError(
                    f"kernel {kernel!r}: threads_per_block {what} is an int but the launch has {ndim} axes; a "
                    f"list gives autotune candidates, each a tuple of {ndim} sizes such as {example}. For one "
                    f"block shape pass a tuple, not a list"
                )
            block = (entry,)
        block = _check_block(kernel, block, ndim, what)
        if block not in candidates:  # a repeated candidate would only be timed twice
            candidates.append(block)
    return tuple(candidates)


def parse_autotune_key(
    kernel: str, autotune_key: Any, arguments: Mapping[str, NameInfo], autotuned: bool
) -> tuple[Expr, ...] | None:
    """The key expressions (over the op's arguments), or ``None`` for the default key."""
    if autotune_key is None:
        return None
    if not autotuned:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: autotune_key={autotune_key!r} is given but there is nothing to tune; pass "
            f"threads_per_block='auto' or a list of candidates"
        )
    entries = (autotune_key,) if isinstance(autotune_key, (str, int)) else as_tuple(autotune_key)
    if entries is None:
        raise KernelDefinitionError(
            f"kernel {kernel!r}: autotune_key must be an expression or a tuple of them, such as "
            f"('a.size(0)',), got {autotune_key!r}"
        )
    try:
        return tuple(
            parse_expression(e, arguments, where=f"kernel {kernel!r}, autotune_key[{i}] (over the op's arguments)")
            for i, e in enumerate(entries)
        )
    except ShapeExpressionError as exc:  # a mistake in an option, like any other option's
        raise KernelDefinitionError(str(exc)) from None
