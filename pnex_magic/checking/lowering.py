"""How a checked access is typed and emitted on the GPU: Numba types and LLVM IR.

The pieces :mod:`pnex_magic.checking.overloads` builds its intrinsics from:

* :func:`checked_axes`: whether an access is checked at all (an array indexed by
  integers), and on how many axes;
* :func:`index_bounds`: the compare of every index with its axis (one unsigned compare
  per axis, after Numba's wrap-around of negative indices) and the code that records a
  violation, which the caller places in a cold block;
* :func:`emit_record`: that code: the first violation of the launch wins slot 0 by a
  compare-and-swap and fills the record (:mod:`pnex_magic.checking.record`);
* :func:`element_pointer`: the element's address, from the wrapped indices.

Numba and llvmlite are imported by each function: they run only while Numba compiles
a checked kernel, and importing this module must not import them (a compile-cache
hit never does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .record import AXIS, INDEX, RANK, RULE, SHAPE, SHAPE_SLOTS, SITE_SLOT, THREAD

__all__ = ["index_types", "checked_axes", "safe_load_fits", "can_cast", "emit_record", "index_bounds",
           "element_pointer"]


# ----------------------------------------------------------------------------- typing


def index_types(idx: Any) -> tuple[Any, ...] | None:
    """The integer types of an index (one integer or a tuple of them), else ``None``."""
    from numba.cuda import types

    if isinstance(idx, types.Integer):
        return (idx,)
    if isinstance(idx, types.BaseTuple) and all(isinstance(t, types.Integer) for t in idx.types):
        return tuple(idx.types)
    return None


def checked_axes(x: Any, idx: Any) -> int | None:
    """How many axes ``x[idx]`` indexes when it is checked (``None``: not checked)."""
    from numba.cuda import types

    its = index_types(idx)
    if isinstance(x, types.Array) and its is not None and 0 < len(its) <= x.ndim:
        return len(its)
    return None


def safe_load_fits(x: Any) -> bool:
    """Whether ``x``'s elements are plain numbers, which the error record can stand in
    for in a load out of bounds (any number fits its 128 bytes)."""
    from numba.cuda import types

    return isinstance(x.dtype, (types.Number, types.Boolean))


def can_cast(value: Any, dtype: Any) -> bool:
    """Whether Numba converts ``value`` to ``dtype``, as its setitem does (else the plain
    path's ``x[idx] = value`` gives Numba's own typing error)."""
    from numba.cuda.descriptor import cuda_target

    return cuda_target.typing_context.can_convert(value, dtype) is not None


# ----------------------------------------------------------------------------- code


def emit_record(builder: Any, rec: Any, site: Any, axis: Any, index: Any, rank: Any, dims: list[Any],
                rule: Any = None) -> None:
    """The first violation wins slot 0 (compare-and-swap) and fills the record (``rule``:
    the rule slot's value, :mod:`pnex_magic.tc.rules`; ``None`` leaves it 0)."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    won = builder.cmpxchg(rec, ir.Constant(i64, 0), ir.Constant(i64, 1), "monotonic", "monotonic")
    with builder.if_then(builder.extract_value(won, 1)):

        i32 = ir.IntType(32)
        words = builder.bitcast(rec, i32.as_pointer())

        def put(slot: int, value: Any) -> None:
            builder.store(value, builder.gep(rec, [ir.Constant(i32, slot)]))

        def put_small(slot: int, value: Any) -> None:
            # A value below 2**32 as two 32-bit words, the high one zero (little-endian):
            # no register pair to fill for it.
            builder.store(value, builder.gep(words, [ir.Constant(i32, 2 * slot)]))
            builder.store(ir.Constant(i32, 0), builder.gep(words, [ir.Constant(i32, 2 * slot + 1)]))

        put_small(SITE_SLOT, builder.trunc(site, i32))
        put_small(AXIS, builder.trunc(axis, i32))
        put(INDEX, index)
        put_small(RANK, builder.trunc(rank, i32))
        for k, dim in enumerate(dims):
            put(SHAPE + k, dim)
        if rule is not None:
            put(RULE, rule)
        # The thread's and block's coordinates are read here, by volatile inline PTX:
        # NVVM hoists the llvm.nvvm.read.ptx.sreg intrinsics of every cold block into
        # the kernel's entry, where they (and their zero high words) then hold
        # registers for the whole kernel.
        for k, reg in enumerate(("tid.x", "tid.y", "tid.z", "ctaid.x", "ctaid.y", "ctaid.z")):
            asm = ir.InlineAsm(ir.FunctionType(i32, []), f"mov.u32 $0, %{reg};", "=r", side_effect=True)
            put_small(THREAD + k, builder.call(asm, []))


def index_bounds(context: Any, builder: Any, signature: Any,
                 args: Any) -> tuple[Any, list[Any], Any, list[Any], Callable[[], None]]:
    """For a helper ``(x, err, site, idx, ...)``: whether every index is in bounds (one
    i1), the indices wrapped as Numba wraps them, the array, its shape, and a function
    that emits the code recording the violation (call it where the record should go)."""
    from llvmlite import ir
    from numba.cuda import cgutils, types

    i64 = ir.IntType(64)
    xty, errty, sitety, idxty = signature.args[:4]
    xv, errv, sitev, idxv = args[:4]
    its = index_types(idxty)
    arr = context.make_array(xty)(context, builder, xv)
    shape = cgutils.unpack_tuple(builder, arr.shape, xty.ndim)
    raw = [idxv] if isinstance(idxty, types.Integer) else cgutils.unpack_tuple(builder, idxv, len(its))
    wide, wrapped, good = [], [], []
    for value, ty, n in zip(raw, its, shape):
        if value.type.width < 64:
            value = builder.sext(value, i64) if ty.signed else builder.zext(value, i64)
        wide.append(value)
        if ty.signed:  # wrapped as Numba wraps it (-n <= i < 0 counts from the end)
            negative = builder.icmp_signed("<", value, ir.Constant(i64, 0))
            value_w = builder.select(negative, builder.add(value, n), value)
        else:
            value_w = value
        wrapped.append(value_w)
        # One unsigned compare: a wrapped index still negative is huge unsigned.
        good.append(builder.icmp_unsigned("<", value_w, n))
    all_ok = good[0]
    for ok in good[1:]:
        all_ok = builder.and_(all_ok, ok)

    def record() -> None:
        # The first axis at fault, and its index.
        axis, index = ir.Constant(i64, len(good) - 1), wide[-1]
        for k in range(len(good) - 2, -1, -1):
            axis = builder.select(good[k], axis, ir.Constant(i64, k))
            index = builder.select(good[k], index, wide[k])
        rec = context.make_array(errty)(context, builder, errv).data
        dims = [shape[k] if k < xty.ndim else ir.Constant(i64, 0) for k in range(SHAPE_SLOTS)]
        site64 = context.cast(builder, sitev, sitety, types.int64)
        emit_record(builder, rec, site64, axis, index, ir.Constant(i64, xty.ndim), dims)

    return all_ok, wrapped, arr, shape, record


def element_pointer(context: Any, builder: Any, xty: Any, arr: Any, shape: list[Any], wrapped: list[Any]) -> Any:
    """The address of the element at the wrapped indices."""
    from numba.cuda import cgutils

    strides = cgutils.unpack_tuple(builder, arr.strides, xty.ndim)
    return cgutils.get_item_pointer2(context, builder, data=arr.data, shape=shape, strides=strides,
                                     layout=xty.layout, inds=wrapped, wraparound=False)
