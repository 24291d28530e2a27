"""The helpers a checked kernel calls, as Python functions: what the CUDA simulator runs.

The rewrite (:mod:`pnex_magic.checking.rewrite`) turns each access into a call of one
of these, by name (:data:`LOAD`, ...); the rebuilt kernel finds them among its globals
(:data:`HELPERS`).  Their CUDA implementations are registered with Numba for the same
function objects (:mod:`pnex_magic.checking.overloads`), with the same semantics, so
one rewritten function serves the GPU compile and numba-cuda's CUDA simulator, which
runs these and fills the same record (a NumPy array there).

Semantics are Numba's: on an axis of length ``n`` an index ``i`` with ``-n <= i < 0``
counts from the end, and ``i < -n`` or ``i >= n`` is out of bounds.  An access out of
bounds never touches memory: a load gives zero of the array's dtype, a store or an
atomic does nothing (an atomic whose result is used gives zero), an index with fewer
entries than the array has axes (a view) is clamped to 0 on the axis at fault.
"""

from __future__ import annotations

import threading
from typing import Any

from .record import FLAG, SHAPE_SLOTS

__all__ = ["LOAD", "LOAD_ON_CHIP", "STORE", "CHECK", "ZERO", "VLOAD", "VSTORE", "HELPERS", "RESERVED", "record_fault"]

#: Names starting with this are the checked variant's: a kernel may not use them.
RESERVED = "__pnex_"
LOAD, STORE, CHECK, ZERO = "__pnex_load", "__pnex_store", "__pnex_check", "__pnex_zero"
LOAD_ON_CHIP = "__pnex_load_on_chip"  # a shared or local array's load
VLOAD, VSTORE = "__pnex_vload", "__pnex_vstore"  # pnex.vload / pnex.vstore

_RECORD_LOCK = threading.Lock()


def _py_shape(x: Any) -> tuple[int, ...] | None:
    if isinstance(x, (tuple, list, str, bytes)):
        return None
    shape = getattr(x, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape) and hasattr(x, "dtype"):
        return shape
    return None


def _py_indices(idx: Any) -> tuple[int, ...] | None:
    import numpy as np

    def one(i: Any) -> int | None:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            return None
        return int(i)

    if isinstance(idx, tuple):
        values = tuple(one(i) for i in idx)
        return None if any(v is None for v in values) else values  # type: ignore[return-value]
    value = one(idx)
    return None if value is None else (value,)


def record_fault(err: Any, site: int, axis: int, index: int, shape: tuple[int, ...], rule: int = 0) -> None:
    """Fill the record with a violation, unless one was recorded first (``rule``: the
    record's rule slot, :mod:`pnex_magic.tc.rules`)."""
    thread = threading.current_thread()
    tid = getattr(thread, "threadIdx", None)
    bid = getattr(thread, "blockIdx", None)
    with _RECORD_LOCK:
        if int(err[FLAG]) != 0:
            return
        values = [1, site, axis, index, len(shape)]
        values += [shape[k] if k < len(shape) else 0 for k in range(SHAPE_SLOTS)]
        values += [tid.x, tid.y, tid.z] if tid is not None else [0, 0, 0]
        values += [bid.x, bid.y, bid.z] if bid is not None else [0, 0, 0]
        values.append(rule)
        for slot, value in enumerate(values):
            err[slot] = value


def _py_check(x: Any, err: Any, site: int, idx: Any) -> bool:
    """Whether ``x[idx]`` is in bounds (``True`` for what is not an array indexed by
    integers); records the first violation."""
    shape = _py_shape(x)
    indices = _py_indices(idx)
    if shape is None or indices is None or len(indices) > len(shape):
        return True
    for axis, (i, n) in enumerate(zip(indices, shape)):
        if not -n <= i < n:
            record_fault(err, site, axis, i, shape)
            return False
    return True


def _py_zero(x: Any) -> Any:
    return x.dtype.type(0)


def _py_strict(x: Any, err: Any, site: int, i: int) -> bool:
    """Whether element ``i`` of the 1-D array ``x`` exists, as for a slice's bounds (no
    wrap-around, what pnex.vload and pnex.vstore take); records the first violation."""
    shape = _py_shape(x)
    if shape is None or 0 <= i < shape[0]:
        return True
    record_fault(err, site, 0, i, shape)
    return False


def __pnex_check(x, err, site, idx):  # noqa: N807 - the name the rewritten kernel calls
    return _py_check(x, err, site, idx)


def __pnex_zero(x):  # noqa: N807
    return _py_zero(x)


def __pnex_load(x, err, site, idx):  # noqa: N807
    if _py_check(x, err, site, idx):
        return x[idx]
    if len(_py_indices(idx)) == len(_py_shape(x)):
        return _py_zero(x)
    return x[(0,) * len(idx) if isinstance(idx, tuple) else 0]  # a view: clamped to 0


def __pnex_load_on_chip(x, err, site, idx):  # noqa: N807
    return __pnex_load(x, err, site, idx)


def __pnex_store(x, err, site, idx, value):  # noqa: N807
    if _py_check(x, err, site, idx):
        x[idx] = value


def __pnex_vload(x, err, site, idx, width):  # noqa: N807
    return tuple(x[idx + k] if _py_strict(x, err, site, idx + k) else _py_zero(x) for k in range(width))


def __pnex_vstore(x, err, site, idx, values):  # noqa: N807
    for k, value in enumerate(values):
        if _py_strict(x, err, site, idx + k):
            x[idx + k] = value


#: The helpers by the names the rewritten kernel calls them (its extra globals).
HELPERS = {LOAD: __pnex_load, LOAD_ON_CHIP: __pnex_load_on_chip, STORE: __pnex_store, CHECK: __pnex_check,
           ZERO: __pnex_zero, VLOAD: __pnex_vload, VSTORE: __pnex_vstore}
