"""The checked helpers' CUDA implementations, registered with Numba once (:func:`register`).

Each Python helper of :mod:`pnex_magic.checking.helpers` gets an overload for the CUDA
target (``numba.cuda.extending.overload``), chosen by the argument types when Numba
types the call: an array indexed by integers is checked, anything else (a tuple, a
record, an index holding a slice) is indexed as written.  The checks themselves are
``@intrinsic`` IR (:mod:`pnex_magic.checking.lowering`): a compare or two per axis, and
the recording code in a cold block.

How an access is made, measured on an H200 (``benchmarks/checked_overhead.py``):

* a load from any array but a shared or local one has no branch on its hot path: it
  always loads, from the element or, out of bounds, from the error record, and a
  select gives zero then.  Global loads so issue back to back as in the fast variant
  (the 1 GiB ``a*b+c`` went from 1.28x to 1.04x the fast variant's time);
* a load from a shared or local array (``__pnex_load_on_chip``) branches around the
  load: the branch-free form cost more registers there and was slower (the diffusion
  stencil 1.94x against 1.78x);
* a store branches once: store, or record.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from .. import warmup
from ..vector import vload, vstore
from . import tc_overloads
from .helpers import CHECK, HELPERS, LOAD, LOAD_ON_CHIP, STORE, VLOAD, VSTORE, ZERO
from .lowering import can_cast, checked_axes, element_pointer, index_bounds, index_types, safe_load_fits

__all__ = ["register"]


@functools.lru_cache(maxsize=1)
def register() -> None:
    """Register the helpers' CUDA implementations with Numba (once, on first use)."""
    warmup.wait()  # Numba's imports, never beside the background warm-up's
    found = _intrinsics()
    _register_accesses(found)
    _register_vectors(found)
    tc_overloads.register()  # the tensor-core primitives' checked forms


@dataclasses.dataclass(frozen=True)
class _Intrinsics:
    in_bounds: Any  #: (x, err, site, idx) -> whether every index is in bounds; records the first violation
    load_or_zero: Any  #: (x, err, site, idx) -> the element, or zero (recorded), without a branch
    store_checked: Any  #: (x, err, site, idx, value) -> None: stores, or records
    null: Any  #: (x) -> zero of the array's dtype
    zero_index: Any  #: (idx) -> an index of the same type, all zeros


def _valid(x: Any, err: Any, site: Any, idx: Any) -> bool:
    from numba.cuda import types

    return checked_axes(x, idx) is not None and isinstance(err, types.Array) and isinstance(site, types.Integer)


def _intrinsics() -> _Intrinsics:
    from numba.cuda import types
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import load_item, store_item

    @intrinsic
    def in_bounds(typingctx, x, err, site, idx):
        # Whether every index is in bounds; the first violation of the launch fills
        # the record (in a cold block).
        if not _valid(x, err, site, idx):
            return None

        def codegen(context, builder, signature, args):
            all_ok, _, _, _, record = index_bounds(context, builder, signature, args)
            with builder.if_then(builder.not_(all_ok), likely=False):
                record()
            return all_ok

        return types.boolean(x, err, site, idx), codegen

    @intrinsic
    def load_or_zero(typingctx, x, err, site, idx):
        # x[idx] when it is in bounds, else zero of the dtype (the violation recorded).
        # From global memory with no branch on the hot path: the load is made in any
        # case, from the element's address or, out of bounds, from the error record
        # (which every number fits), and a select picks the value; so a kernel's global
        # loads issue back to back as in the fast variant, and only the cold record
        # block branches.
        if not _valid(x, err, site, idx) or checked_axes(x, idx) != x.ndim:
            return None

        def codegen(context, builder, signature, args):
            xty, errty = signature.args[:2]
            all_ok, wrapped, arr, shape, record = index_bounds(context, builder, signature, args)
            pointer = element_pointer(context, builder, xty, arr, shape, wrapped)
            zero = context.get_constant_null(xty.dtype)
            rec = context.make_array(errty)(context, builder, args[1]).data
            safe = builder.select(all_ok, pointer, builder.bitcast(rec, pointer.type))
            result = builder.select(all_ok, load_item(context, builder, xty, safe), zero)
            with builder.if_then(builder.not_(all_ok), likely=False):
                record()
            return result

        return x.dtype(x, err, site, idx), codegen

    @intrinsic
    def store_checked(typingctx, x, err, site, idx, value):
        # x[idx] = value when it is in bounds, else the violation recorded: one branch.
        if not _valid(x, err, site, idx) or checked_axes(x, idx) != x.ndim or not x.mutable:
            return None

        def codegen(context, builder, signature, args):
            xty = signature.args[0]
            all_ok, wrapped, arr, shape, record = index_bounds(context, builder, signature, args)
            item = context.cast(builder, args[4], signature.args[4], xty.dtype)
            with builder.if_else(all_ok, likely=True) as (inside, outside):
                with inside:
                    store_item(context, builder, xty, item, element_pointer(context, builder, xty, arr, shape, wrapped))
                with outside:
                    record()
            return context.get_dummy_value()

        return types.none(x, err, site, idx, value), codegen

    @intrinsic
    def null(typingctx, x):
        if not isinstance(x, types.Array):
            return None

        def codegen(context, builder, signature, args):
            return context.get_constant_null(signature.return_type)

        return x.dtype(x), codegen

    @intrinsic
    def zero_index(typingctx, idx):
        if index_types(idx) is None:
            return None

        def codegen(context, builder, signature, args):
            return context.get_constant_null(signature.return_type)

        return idx(idx), codegen

    return _Intrinsics(in_bounds, load_or_zero, store_checked, null, zero_index)


def _register_accesses(found: _Intrinsics) -> None:
    """Loads, stores, the atomics' check and zero: one overload per helper."""
    from numba.cuda.extending import overload

    in_bounds, load_or_zero, store_checked, null, zero_index = (
        found.in_bounds, found.load_or_zero, found.store_checked, found.null, found.zero_index)

    @overload(HELPERS[CHECK], target="cuda")
    def _check_impl(x, err, site, idx):
        if checked_axes(x, idx) is None:
            return lambda x, err, site, idx: True
        return lambda x, err, site, idx: in_bounds(x, err, site, idx)

    @overload(HELPERS[ZERO], target="cuda")
    def _zero_impl(x):
        from numba.cuda import types

        if isinstance(x, types.Array):
            return lambda x: null(x)
        return None

    def branching_load(x, err, site, idx):
        # One branch around the load: the element, or zero with the violation recorded.
        if in_bounds(x, err, site, idx):
            return x[idx]
        return null(x)

    @overload(HELPERS[LOAD], target="cuda", inline="always")  # a view cannot be returned from a call; and
    # a call is inlined by NVVM only when it calls nothing external (a bfloat16 conversion does)
    def _load_impl(x, err, site, idx):
        k = checked_axes(x, idx)
        if k is None:
            return lambda x, err, site, idx: x[idx]
        if k == x.ndim:
            if safe_load_fits(x):
                return lambda x, err, site, idx: load_or_zero(x, err, site, idx)
            return branching_load

        def view(x, err, site, idx):
            if in_bounds(x, err, site, idx):
                return x[idx]
            return x[zero_index(idx)]

        return view

    @overload(HELPERS[LOAD_ON_CHIP], target="cuda", inline="always")
    def _load_on_chip_impl(x, err, site, idx):
        # A shared or local array: on-chip memory, whose loads are cheap to wait for;
        # a branch around the load (what the global loads avoid) costs fewer registers.
        if checked_axes(x, idx) != getattr(x, "ndim", None):
            return _load_impl(x, err, site, idx)
        return branching_load

    @overload(HELPERS[STORE], target="cuda", inline="always")
    def _store_impl(x, err, site, idx, value):
        k = checked_axes(x, idx)
        if k is None:

            def plain(x, err, site, idx, value):
                x[idx] = value

            return plain

        if k == x.ndim and x.mutable and safe_load_fits(x) and can_cast(value, x.dtype):
            # (a read-only array, an In parameter, takes the path below: Numba refuses the
            # write when it types it, as in the fast variant)
            return lambda x, err, site, idx, value: store_checked(x, err, site, idx, value)

        def store(x, err, site, idx, value):
            if in_bounds(x, err, site, idx):
                x[idx] = value

        return store


def _register_vectors(found: _Intrinsics) -> None:
    """pnex.vload / pnex.vstore: the vector access when every element exists (0 <= idx,
    idx + width <= len), else each element checked as for a slice (no wrap-around: the
    index is tested as unsigned, so a negative one is out of bounds, and the record
    shows it as written)."""
    from numba.cuda import types
    from numba.cuda.core.errors import TypingError
    from numba.cuda.extending import overload

    def strict(k: int) -> str:
        return f"_in_bounds(x, err, site, uint64(idx + {k}))"

    def generated(code: str) -> Any:
        namespace = {"_in_bounds": found.in_bounds, "_null": found.null, "uint64": types.uint64, "vload": vload,
                     "vstore": vstore}
        exec(code, namespace)  # noqa: S102 - the source below, for one width
        return namespace["impl"]

    @overload(HELPERS[VLOAD], target="cuda", prefer_literal=True)
    def _vload_checked(x, err, site, idx, width):
        if not isinstance(width, types.IntegerLiteral):
            raise TypingError("pnex.vload: the width must be a constant (2, 4, 8 or 16), not a variable")
        w = width.literal_value
        items = ", ".join(f"(x[uint64(idx + {k})] if {strict(k)} else _null(x))" for k in range(w))
        return generated(
            "def impl(x, err, site, idx, width):\n"
            f"    if idx >= 0 and idx + {w} <= x.shape[0]:\n"
            f"        return vload(x, idx, {w})\n"
            f"    return ({items},)\n"
        )

    @overload(HELPERS[VSTORE], target="cuda")
    def _vstore_checked(x, err, site, idx, values):
        if not isinstance(values, types.BaseTuple):
            raise TypingError(f"pnex.vstore: the values must be a tuple, got {values}")
        w = len(values)
        body = "".join(f"        if {strict(k)}:\n            x[uint64(idx + {k})] = values[{k}]\n" for k in range(w))
        return generated(
            "def impl(x, err, site, idx, values):\n"
            f"    if idx >= 0 and idx + {w} <= x.shape[0]:\n"
            "        vstore(x, idx, values)\n"
            "    else:\n" + body
        )
