"""The simulator's arrays as the tensor-core primitives see them: the NumPy array behind
numba-cuda's wrappers, the size of its elements, and where an element sits in memory.

Byte-level primitives (``cp.async``, ``ldmatrix``, ``wgmma``'s descriptors) care about
addresses.  On the GPU a shared array starts at an address aligned as declared
(``cuda.shared.array(..., alignment=N)``; Numba's default is the element size: a
float16 tile may start 2 bytes past a 16-byte boundary), and a tensor at its data
pointer.  The simulator records each shared array's declared alignment
(:func:`declare`) and answers with what the GPU guarantees (:func:`alignment`): a
shared tile declared with ``alignment=2`` is not known to be 16-byte aligned, even
where NumPy happened to place it well.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["Bf16Shadow", "unwrap", "itemsize", "declare", "alignment"]


class Bf16Shadow(np.ndarray):
    """A float32 array that stands for bfloat16 data (NumPy has no bfloat16): the
    simulator's copy of a bfloat16 tensor or shared tile.  Byte-level primitives
    (``ldmatrix``, ``cp_async``) see 2-byte elements."""


def unwrap(array: Any) -> np.ndarray:
    """The NumPy array behind the simulator's wrappers of a kernel's array."""
    inner = getattr(array, "_item", None)  # FakeWithinKernelCUDAArray
    if inner is not None:
        array = inner
    inner = getattr(array, "_ary", None)  # FakeCUDAArray
    if inner is not None:
        array = inner
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected an array, got {type(array).__name__}")
    return array


def itemsize(array: np.ndarray) -> int:
    """The bytes of one element as the GPU stores it (2 for a :class:`Bf16Shadow`)."""
    return 2 if isinstance(array, Bf16Shadow) else array.itemsize


# Shared arrays by id() of the NumPy array that owns their memory: (a weak reference to
# it, the alignment declared).  An entry goes with its array.
_DECLARED: dict[int, tuple[Any, int]] = {}
_LOCK = threading.Lock()


def declare(array: np.ndarray, declared: int) -> np.ndarray:
    """Record that the shared array ``array`` (a new allocation) was declared with
    ``alignment=declared`` bytes; returns it."""
    key = id(array)

    def forget(_: Any, key: int = key) -> None:
        with _LOCK:
            _DECLARED.pop(key, None)

    with _LOCK:
        _DECLARED[key] = (weakref.ref(array, forget), int(declared))
    return array


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns ``array``'s memory (NumPy's views point at it)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _declared(root: np.ndarray) -> int | None:
    with _LOCK:
        found = _DECLARED.get(id(root))
    if found is None or found[0]() is not root:
        return None
    return found[1]


def alignment(array: np.ndarray, index: tuple[int, ...]) -> tuple[int, int, int | None]:
    """Where element ``index`` of ``array`` sits: ``(offset, address, declared)``.

    ``offset``: its byte offset from ``array``'s first element; ``address``: its byte
    address as far as the GPU guarantees it (from the start of its shared allocation,
    whose own alignment is ``declared``; for any other array, its real address: a
    tensor's data pointer is where the GPU's would be, modulo 16 bytes and more);
    ``declared``: a shared array's declared alignment, ``None`` for other arrays.
    Byte counts are the GPU's (2-byte elements for a :class:`Bf16Shadow`)."""
    scale = itemsize(array) / array.itemsize  # a Bf16Shadow's float32 bytes stand for half as many
    offset = int(round(sum(i * s for i, s in zip(index, array.strides)) * scale))
    base, declared = _place(array, scale)
    return offset, base + offset, declared


# Where arrays start, by id() of the array: (a weak reference to it, its first element's
# address as alignment() counts it, the declared alignment).  A primitive asks once per
# lane and call, mostly about the same few tiles; an entry goes with its array.
_PLACES: dict[int, tuple[Any, int, int | None]] = {}


def _place(array: np.ndarray, scale: float) -> tuple[int, int | None]:
    """(the address of ``array``'s first element as :func:`alignment` counts it, its
    declared alignment or ``None``)."""
    key = id(array)
    found = _PLACES.get(key)
    if found is not None and found[0]() is array:
        return found[1], found[2]
    root = _root(array)
    declared = _declared(root)
    start = array.__array_interface__["data"][0]
    if declared is not None or isinstance(array, Bf16Shadow):
        # a shared allocation: from its start; a float32 copy: where the tensor's data was is not known
        start = int(round((start - root.__array_interface__["data"][0]) * scale))
    try:
        ref = weakref.ref(array, lambda _, key=key: _PLACES.pop(key, None))
    except TypeError:  # (an array that takes no weak reference: not kept)
        return start, declared
    _PLACES[key] = (ref, start, declared)
    return start, declared
