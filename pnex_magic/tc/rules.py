"""What the tensor-core primitives require of the memory they touch, written once.

Each primitive reads or writes a span of an array from an index: ``cp_async`` 16 bytes
of its destination and its source, ``ldmatrix`` 8 elements (16 bytes) of a row,
``store_pair`` 2 elements (4 bytes), ``wgmma`` a 64 x 16 or n x 16 block of a K-major
tile of 64-element rows; and it takes fragments of fixed lengths.  A span must lie in
its array (every index in bounds, no wrap-around), along the last axis, which must be
contiguous, and start at an address aligned to its size (``wgmma``'s row block at 1024
bytes: the 128-byte swizzle is a function of the address).

The rules are checked in three places, which agree because they share these codes and
messages: the CPU simulator raises (:mod:`.simulate`), a checked launch in the
simulator records the first violation (:mod:`pnex_magic.checking.tc_helpers`) and so
does a checked launch on the GPU (:mod:`pnex_magic.checking.tc_overloads`), where the
record becomes :class:`~pnex_magic.errors.KernelIndexError`.

A violation is a :class:`Fault`: a code, the axis and the index at fault, the array's
shape and up to three numbers the message needs, packed into the record's rule slot
by :meth:`Fault.word` (:func:`unpack` reads it back).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any

import numpy as np

from .arrays import alignment, itemsize

__all__ = [
    "BOUNDS", "RANGE", "ALIGN", "DECLARED", "CONTIGUOUS", "FRAGMENT", "MULTIPLE", "ROWS", "WHOLE",
    "Fault", "unpack", "describe", "span", "fragment", "wgmma_tile", "whole", "same_element_size",
    "fragment_dtype",
]

#: Codes of the rules (the low byte of the record's rule slot; 0: a plain access out of bounds).
BOUNDS, RANGE, ALIGN, DECLARED, CONTIGUOUS, FRAGMENT, MULTIPLE, ROWS, WHOLE = range(9)


@dataclasses.dataclass(frozen=True)
class Fault:
    """One violated rule.  ``axis``/``index``: where (for :data:`CONTIGUOUS` the index
    is the stride in bytes, for :data:`FRAGMENT` the fragment's length, for
    :data:`WHOLE` the block's threads); ``param``: the span's elements
    (:data:`RANGE`), the alignment in bytes (:data:`ALIGN`, :data:`DECLARED`), the
    element size (:data:`CONTIGUOUS`), the length wanted (:data:`FRAGMENT`), the
    multiple (:data:`MULTIPLE`), the row length (:data:`ROWS`) or the group's threads
    (:data:`WHOLE`); ``a``, ``b``: :data:`ALIGN`'s address and offset modulo the
    alignment, :data:`DECLARED`'s declared alignment, :data:`FRAGMENT`'s 1 for an
    exact length, :data:`ROWS`' strides."""

    code: int
    axis: int
    index: int
    shape: tuple[int, ...]
    param: int = 0
    a: int = 0
    b: int = 0

    def word(self) -> int:
        """The record's rule slot: code, param, a and b in 8 + 16 + 16 + 16 bits."""
        return self.code | _clip(self.param) << 8 | _clip(self.a) << 24 | _clip(self.b) << 40

    def exception(self, primitive: str, operand: str) -> Exception:
        """The exception the (unchecked) simulator raises: ``primitive`` names the call
        (``"pnex.tc.cp_async"``), ``operand`` the array (``"the source"``)."""
        text = f"{primitive}: {describe(self.code, self.param, self.a, self.b, self.axis, self.index, self.shape, operand)}"
        return IndexError(text) if self.code in (BOUNDS, RANGE) else ValueError(text)


def _clip(value: int) -> int:
    return min(max(int(value), 0), 0xFFFF)


def unpack(word: int) -> tuple[int, int, int, int]:
    """(code, param, a, b) of a rule slot."""
    word = int(word)
    return word & 0xFF, (word >> 8) & 0xFFFF, (word >> 24) & 0xFFFF, (word >> 40) & 0xFFFF


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def describe(code: int, param: int, a: int, b: int, axis: int, index: int, shape: tuple[int, ...], what: str) -> str:
    """The sentence for a violation of rule ``code`` by ``what`` (``"parameter 'x'"``,
    ``"shared array 'sa'"``) of shape ``shape``."""
    of = f"{what} (shape {_shape(shape)})"
    if code == BOUNDS:
        return f"index {index} is out of bounds for axis {axis} of {of}"
    if code == RANGE:
        unit = "elements" if axis == len(shape) - 1 else "rows"
        end = shape[axis] if 0 <= axis < len(shape) else "?"
        return f"the {param} {unit} from index {index} on axis {axis} of {of} run past the axis's end ({end})"
    if code == ALIGN:
        if b:
            return (f"the span at index {index} on axis {axis} of {of} starts {b} bytes past a {param}-byte boundary "
                    f"of the array: its byte offset must be a multiple of {param}")
        if what.startswith("shared array"):
            fix = f"declare it with cuda.shared.array(..., alignment={max(param, 128)})"
        elif what.startswith(("parameter", "global")):
            fix = f"pass a tensor whose data starts {param}-byte aligned (a view with a storage offset may not)"
        else:
            fix = (f"declare a shared tile with cuda.shared.array(..., alignment={max(param, 128)}); pass a tensor "
                   f"whose data starts {param}-byte aligned (a view with a storage offset may not)")
        return f"{of} itself starts {a} bytes past a {param}-byte boundary: {fix}"
    if code == DECLARED:
        return (f"{of} was declared with alignment={a} (Numba's default is the element size), so the GPU may place "
                f"it off a {param}-byte boundary: declare it with cuda.shared.array(..., alignment={max(param, 128)})")
    if code == CONTIGUOUS:
        return (f"the last axis of {of} is not contiguous (a stride of {index} bytes, not {param}): the span is read "
                f"as consecutive bytes")
    if code == FRAGMENT:
        wanted = f"exactly {param}" if a else f"at least {param}"
        return f"{of} has {index} elements; the fragment must have {wanted}"
    if code == MULTIPLE:
        return (f"index {index} on axis {axis} of {of} must be a multiple of {param} (a wgmma operand starts at a "
                f"row that is a multiple of 8 and a column that is a multiple of 16)")
    if code == ROWS:
        return (f"{of} must have contiguous rows of {param} 16-bit elements (128 bytes, the 128-byte swizzle's "
                f"row), got rows of {shape[-1] if shape else 0} with strides of {a} and {b} bytes")
    if code == WHOLE:
        unit = "warp" if param == 32 else "warpgroup (4 consecutive warps)"
        return (f"every thread of a {unit} must take part, but the block's {index} threads leave the last "
                f"{unit} short of {param}")
    return f"rule {code} was violated at index {index} on axis {axis} of {of}"


# --------------------------------------------------------------------------------------- the simulator's checks


def _index(index: Any) -> tuple[int, ...]:
    return tuple(map(int, index)) if isinstance(index, tuple) else (int(index),)


def _rank(array: np.ndarray, idx: tuple[int, ...], what: str) -> None:
    if len(idx) != array.ndim:
        raise IndexError(f"{what}: index {idx} has {len(idx)} subscripts for a {array.ndim}-D array")


def _bounds(array: np.ndarray, idx: tuple[int, ...]) -> Fault | None:
    for axis, (i, n) in enumerate(zip(idx, array.shape)):
        if not 0 <= i < n:  # no wrap-around: the instruction takes the address
            return Fault(BOUNDS, axis, i, array.shape)
    return None


def _aligned(array: np.ndarray, idx: tuple[int, ...], axis: int, need: int, start: tuple[int, ...] | None = None
             ) -> Fault | None:
    """The span at ``idx`` (its address taken at ``start``, by default ``idx``) starts
    ``need``-byte aligned, as far as the GPU guarantees."""
    offset, address, declared = alignment(array, start if start is not None else idx)
    if declared is not None and declared < need:
        return Fault(DECLARED, axis, idx[axis], array.shape, need, declared)
    if address % need:
        return Fault(ALIGN, axis, idx[axis], array.shape, need, address % need, offset % need)
    return None


def span(array: np.ndarray, index: Any, count: int, need: int, what: str) -> Fault | None:
    """The first rule ``count`` elements of ``array`` from ``index`` along the last axis,
    ``need``-byte aligned, break (``None``: none)."""
    idx = _index(index)
    _rank(array, idx, what)
    last = array.ndim - 1
    found = _bounds(array, idx)
    if found is None and idx[-1] + count > array.shape[-1]:
        found = Fault(RANGE, last, idx[-1], array.shape, count)
    size = itemsize(array)
    if found is None and count > 1 and array.strides[-1] * size // array.itemsize != size:
        found = Fault(CONTIGUOUS, last, array.strides[-1] * size // array.itemsize, array.shape, size)
    return found or _aligned(array, idx, last, need)


def fragment(array: np.ndarray, length: int, exact: bool, what: str) -> Fault | None:
    """A 1-D fragment of ``length`` elements (``exact``), or at least that many."""
    if array.ndim != 1:
        raise TypeError(f"{what} must be a 1-D array view (e.g. acc[i, j] of a cuda.local.array), got shape "
                        f"{array.shape}")
    n = array.shape[0]
    if n < length or (exact and n != length):
        return Fault(FRAGMENT, 0, n, array.shape, length, int(exact))
    return None


def wgmma_tile(array: np.ndarray, index: Any, rows: int, what: str) -> Fault | None:
    """``rows`` x 16 elements of a K-major tile of 64 16-bit elements a row from
    ``index`` (its last two entries: a row that is a multiple of 8, a column that is a
    multiple of 16), whose rows from that one start 1024-byte aligned."""
    idx = _index(index)
    _rank(array, idx, what)
    if array.ndim < 2:
        raise IndexError(f"{what}: a wgmma operand tile has at least 2 axes (rows, 64 columns), got {array.ndim}")
    size = itemsize(array)
    strides = tuple(s * size // array.itemsize for s in array.strides)
    found = _bounds(array, idx)
    if found is None and (array.shape[-1] != 64 or strides[-1] != 2 or strides[-2] != 128):
        found = Fault(ROWS, array.ndim - 1, array.shape[-1], array.shape, 64, strides[-1], strides[-2])
    for axis, multiple in ((array.ndim - 2, 8), (array.ndim - 1, 16)):
        if found is None and idx[axis] % multiple:
            found = Fault(MULTIPLE, axis, idx[axis], array.shape, multiple)
    if found is None and idx[-2] + rows > array.shape[-2]:
        found = Fault(RANGE, array.ndim - 2, idx[-2], array.shape, rows)
    return found or _aligned(array, idx, array.ndim - 2, 1024, idx[:-1] + (0,))


def whole(group: int) -> Fault | None:
    """Every thread of the calling thread's warp (``group`` 32) or warpgroup (128) exists."""
    thread = threading.current_thread()
    dims = thread._manager._block_dim
    threads = int(dims[0] * dims[1] * dims[2])
    first = thread.thread_id // group * group
    if first + group > threads:
        return Fault(WHOLE, 0, threads, (), group)
    return None


def same_element_size(dst: np.ndarray, src: np.ndarray, what: str) -> None:
    """``cp_async`` copies bytes: both arrays must hold elements of one size, which
    divides 16 (what the GPU's typing refuses at definition, in the same words)."""
    size, src_size = itemsize(dst), itemsize(src)
    if size != src_size or 16 % size:
        names = ["bfloat16" if itemsize(a) != a.itemsize else a.dtype.name for a in (dst, src)]
        raise TypeError(
            f"{what}: the destination holds {size}-byte elements ({names[0]}) and the source {src_size}-byte ones "
            f"({names[1]}); cp.async copies 16 bytes, so both must hold elements of one size that divides 16"
        )


@functools.lru_cache(maxsize=None)
def _native_dtypes(names: tuple[str, ...]) -> frozenset[np.dtype]:
    """The dtypes named ``names`` in native byte order (each has its name)."""
    return frozenset(np.dtype(name) for name in names)


def fragment_dtype(array: np.ndarray, dtypes: tuple[str, ...], what: str) -> None:
    """A fragment of one of ``dtypes`` (the GPU's typing refuses any other at definition)."""
    if array.dtype in _native_dtypes(dtypes):  # (``dtype.name`` is Python code in NumPy: slow per lane)
        return
    if array.dtype.name not in dtypes:
        raise TypeError(f"{what} must hold {' or '.join(dtypes)}, got {array.dtype.name}")
