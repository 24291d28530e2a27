"""Vector loads and stores for kernels: several consecutive elements in one memory
instruction.

A kernel that streams memory (``a * b + c`` over a big tensor, a copy, an
element-wise update) reaches the GPU's memory bandwidth only when its loads are
wide: XLA's and PyTorch's element-wise kernels read 16 bytes per thread per
instruction (``ld.global.v4.f32``).  Numba has no way to write that: each
``a[i]`` is its own 4-byte load, and on an H200 the 1 GiB ``a*b+c`` then runs at
83% of the DRAM peak against XLA's 92% (``benchmarks/probes.py muladd-ncu``).
Inside a kernel::

    x0, x1, x2, x3 = pnex.vload(a, i, 4)          # a[i], a[i+1], a[i+2], a[i+3]
    pnex.vstore(out, i, (x0 + 1, x1 + 1, x2 + 1, x3 + 1))

* ``array`` is a 1-D array (a parameter, or any 1-D view); ``width`` a constant
  (2, 4, 8 or 16) whose bytes (``width * itemsize``) are 4, 8 or 16;
* the elements are ``array[index]`` to ``array[index + width - 1]``, with
  ``0 <= index`` and ``index + width <= len(array)``, as for a slice (no
  wrap-around: the fast variant does not check bounds, as for ``a[i]``; the checked
  variant, ``check=True``, records any other index as out of bounds);
* the access is one vector instruction when the first element's address is a
  multiple of the vector's bytes and the array's elements are adjacent (a
  contiguous tensor, ``index`` a multiple of ``width``); otherwise the same
  elements are read or written one by one.  So any index is correct; aligned ones
  are fast.

On CPU tensors (numba-cuda's CUDA simulator) both run as the Python functions
below, with the same results.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["vload", "vstore", "register_cuda"]

_WIDTHS = (2, 4, 8, 16)
_BYTES = (4, 8, 16)


def vload(array: Any, index: int, width: int) -> tuple:
    """``(array[index], ..., array[index + width - 1])``, read by one vector load
    when aligned (see the module's documentation)."""
    return tuple(array[index + k] for k in range(width))


def vstore(array: Any, index: int, values: tuple) -> None:
    """``array[index + k] = values[k]`` for each of ``values``, written by one vector
    store when aligned (see the module's documentation)."""
    for k, value in enumerate(values):
        array[index + k] = value


def _width_error(array: Any, width: int) -> str | None:
    """Why ``width`` elements of ``array`` (a Numba array type) cannot be one vector
    access (``None``: they can)."""
    from numba.cuda import types

    if not isinstance(array, types.Array) or array.ndim != 1:
        return f"pnex.vload/vstore take a 1-D array, got {array}"
    if not isinstance(array.dtype, (types.Integer, types.Float)):
        return f"pnex.vload/vstore take an array of integers or floats, got {array.dtype}"
    if width not in _WIDTHS or width * (array.dtype.bitwidth // 8) not in _BYTES:
        return (
            f"pnex.vload/vstore: {width} elements of {array.dtype} are {width * array.dtype.bitwidth // 8} bytes; "
            f"a vector access is 4, 8 or 16 bytes of 2, 4, 8 or 16 elements"
        )
    return None


@functools.lru_cache(maxsize=1)
def register_cuda() -> None:
    """Register the CUDA implementations with Numba (once; the compile stage calls it
    before it compiles a kernel)."""
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.core.errors import TypingError
    from numba.cuda.extending import intrinsic, overload

    def literal_width(width: Any) -> int | None:
        return width.literal_value if isinstance(width, types.IntegerLiteral) else None

    def pointers(context: Any, builder: Any, aryty: Any, ary: Any, index: Any, width: int
                 ) -> tuple[Any, Any, list[Any], int]:
        """Whether the vector access can be made, the vector pointer, each element's
        pointer, and the vector's bytes (its alignment)."""
        data_ty = context.get_data_type(aryty.dtype)
        nbytes = width * context.get_abi_sizeof(data_ty)
        arr = context.make_array(aryty)(context, builder, ary)
        [stride] = cgutils.unpack_tuple(builder, arr.strides, 1)
        i64 = ir.IntType(64)
        index = builder.sext(index, i64) if index.type.width < 64 else index
        raw = builder.bitcast(arr.data, ir.IntType(8).as_pointer())
        elements = [
            builder.bitcast(builder.gep(raw, [builder.mul(builder.add(index, ir.Constant(i64, k)), stride)]),
                            data_ty.as_pointer())
            for k in range(width)
        ]
        first = builder.ptrtoint(elements[0], i64)
        aligned = builder.icmp_unsigned("==", builder.and_(first, ir.Constant(i64, nbytes - 1)), ir.Constant(i64, 0))
        adjacent = builder.icmp_signed("==", stride, ir.Constant(i64, nbytes // width))
        vector = builder.bitcast(elements[0], ir.VectorType(data_ty, width).as_pointer())
        return builder.and_(aligned, adjacent), vector, elements, nbytes

    @intrinsic
    def _vload(typingctx, array, index, width):
        w = literal_width(width)
        if w is None or not isinstance(index, types.Integer):
            return None
        problem = _width_error(array, w)
        if problem is not None:
            raise TypingError(problem)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ok, vector, elements, nbytes = pointers(context, builder, aryty, args[0], args[1], w)
            with builder.if_else(ok, likely=True) as (fast, slow):
                with fast:
                    loaded = builder.load(vector, align=nbytes)
                    wide = [builder.extract_element(loaded, ir.Constant(ir.IntType(32), k)) for k in range(w)]
                    fast_block = builder.basic_block
                with slow:
                    narrow = [builder.load(p, align=nbytes // w) for p in elements]
                    slow_block = builder.basic_block
            values = []
            for a, b in zip(wide, narrow):
                phi = builder.phi(a.type)
                phi.add_incoming(a, fast_block)
                phi.add_incoming(b, slow_block)
                values.append(phi)
            return context.make_tuple(builder, signature.return_type, values)

        return types.UniTuple(array.dtype, w)(array, index, width), codegen

    @intrinsic
    def _vstore(typingctx, array, index, values):
        if not isinstance(values, types.BaseTuple) or not isinstance(index, types.Integer):
            return None
        w = len(values)
        problem = _width_error(array, w)
        if problem is not None:
            raise TypingError(problem)
        if not array.mutable:
            raise TypingError(f"pnex.vstore: the array is read-only ({array}): an In parameter cannot be written")

        def codegen(context, builder, signature, args):
            aryty, _, tupty = signature.args
            items = cgutils.unpack_tuple(builder, args[2], w)
            items = [context.cast(builder, v, t, aryty.dtype) for v, t in zip(items, tupty.types)]
            ok, vector, elements, nbytes = pointers(context, builder, aryty, args[0], args[1], w)
            data_ty = context.get_data_type(aryty.dtype)
            with builder.if_else(ok, likely=True) as (fast, slow):
                with fast:
                    packed = ir.Constant(ir.VectorType(data_ty, w), ir.Undefined)
                    for k, v in enumerate(items):
                        packed = builder.insert_element(packed, v, ir.Constant(ir.IntType(32), k))
                    builder.store(packed, vector, align=nbytes)
                with slow:
                    for v, p in zip(items, elements):
                        builder.store(v, p, align=nbytes // w)
            return context.get_dummy_value()

        return types.none(array, index, values), codegen

    @overload(vload, target="cuda", prefer_literal=True)
    def _vload_impl(array, index, width):
        if literal_width(width) is None:
            raise TypingError("pnex.vload: the width must be a constant (2, 4, 8 or 16), not a variable")
        return lambda array, index, width: _vload(array, index, width)

    @overload(vstore, target="cuda")
    def _vstore_impl(array, index, values):
        if not isinstance(values, types.BaseTuple):
            raise TypingError(f"pnex.vstore: the values must be a tuple, got {values}")
        return lambda array, index, values: _vstore(array, index, values)
