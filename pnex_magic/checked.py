"""The checked variant of a kernel: every array access tested against the array's
shape on the GPU, the first access out of bounds recorded instead of made.

``checked_kernel(fn)`` rewrites the kernel's source (its AST) so that every
subscript of a plain name becomes a call of a pnex helper, and compiles the result
as a new function with the same name, parameters, globals, closure, file name and
line numbers, plus one trailing parameter, ``__pnex_err``: a 1-D, C-contiguous
int64 array of :data:`RECORD_SIZE` entries, zeroed before the launch, that the
launcher reads after it (:func:`decode_record`, :func:`describe_violation`).

What is rewritten (``SITE`` is the access's number in :attr:`CheckedKernel.sites`)::

    x[i, j]                  ->  __pnex_load(x, __pnex_err, SITE, (i, j))
    x[i, j] = v              ->  __pnex_store(x, __pnex_err, SITE, (i, j), v)
    x[f(i)] += v             ->  __pnex_k0 = f(i)                 # the index once
                                 __pnex_store(x, __pnex_err, SITE, __pnex_k0,
                                              __pnex_load(x, __pnex_err, SITE, __pnex_k0) + v)
    cuda.atomic.add(x, i, v) ->  if __pnex_check(x, __pnex_err, SITE, i):
                                     cuda.atomic.add(x, i, v)     # as a statement;
                                 (cuda.atomic.add(x, i, v) if __pnex_check(x, __pnex_err, SITE, i)
                                  else __pnex_zero(x))            # where its result is used
    x[i][j]                  ->  __pnex_load(__pnex_load(x, __pnex_err, S1, i), __pnex_err, S2, j)

``x`` is anything the kernel names: a parameter, a ``cuda.shared.array`` or
``cuda.local.array``, a global array, a tuple.  The helpers decide by type, when
Numba types the call: an array indexed by integers (an ``int``, a tuple literal,
or a variable holding a tuple of integers, ``idx = (i, j); x[idx]``) is checked;
anything else (a tuple, a record, an index that holds a slice) is indexed as
written, unchecked.  A subscript whose brackets hold a slice, ``...`` or ``None``
is left to Numba as written (its bounds are clipped anyway, as in NumPy).
Subscripts inside ``@cuda.jit(device=True)`` functions the kernel calls are not
checked: they have no error buffer.

Semantics are Numba's: on an axis of length ``n`` an index ``i`` with
``-n <= i < 0`` counts from the end, and ``i < -n`` or ``i >= n`` is out of
bounds (an unsigned index: ``i >= n``).  An access out of bounds never touches
memory: a load gives zero of the array's dtype, a store or an atomic does
nothing (an atomic whose result is used gives zero), an index with fewer entries
than the array has axes (a view) is clamped to 0 on the axis at fault.  The first
violation of the launch wins slot 0 by an atomic compare-and-swap and fills the
record:

======  ==========================================================
slot    content
======  ==========================================================
0       flag: 1 when a violation was recorded (0: none)
1       site: the index into :attr:`CheckedKernel.sites`
2       axis at fault
3       the index on that axis, as written (before wrap-around)
4       the array's rank
5..8    the array's shape, first four axes (0 beyond the rank)
9..11   ``threadIdx`` x, y, z of the thread
12..14  ``blockIdx`` x, y, z
15      reserved (0)
======  ==========================================================

The helpers are Python functions whose CUDA implementation is registered with
``numba.cuda.extending.overload`` (the checks themselves are ``@intrinsic`` IR: a
compare or two per axis, and the recording code in a cold block): so one function
serves both the GPU compile and numba-cuda's CUDA simulator, where the same Python
helpers run with the same semantics and fill the same record (a NumPy array there).

How an access is made, measured on an H200 (``benchmarks/checked_overhead.py``):

* a load from any array but a shared or local one (``__pnex_load``) has no branch on
  its hot path: it always loads, from the element or, out of bounds, from the error
  record, and a select gives zero then.  Global loads so issue back to back as in the
  fast variant: the 1 GiB ``a*b+c`` went from 1.28x to 1.04x the fast variant's time;
* a load from a shared or local array (``__pnex_load_on_chip``, chosen by the rewrite
  from the array's definition) branches around the load: the branch-free form cost
  more registers there and was slower (the diffusion stencil 1.94x against 1.78x);
* a store branches once: store, or record;
* an access the kernel's source proves in bounds (:mod:`pnex_magic.index_ranges`: a
  shared or local array indexed within its constant shape, ``cuda.threadIdx`` bounded by
  the op's block shapes; a tensor indexed under a guard on its size, ``if i <
  a.shape[0]``) is left as written, unchecked (:attr:`CheckedKernel.proven`): the cold
  record blocks of the stencil's tile loads had kept NVVM from unrolling its loop (5
  shared loads per trip issued instead of 20).  The rewrite follows the guards in
  statement order (``_Rewriter.visit_block``) to know which facts hold where.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import textwrap
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import KernelDefinitionError, KernelIndexError
from .index_ranges import Fact, IndexRanges, bound_names, tensor_dims

__all__ = [
    "RECORD_SIZE",
    "ERR_PARAM",
    "Site",
    "CheckedKernel",
    "Violation",
    "checked_kernel",
    "checked_spec",
    "error_buffer",
    "decode_record",
    "describe_violation",
    "violation_error",
]

#: Entries (int64) of the error record a checked kernel writes.
RECORD_SIZE = 16
#: The name of the checked kernel's trailing parameter, the error record.
ERR_PARAM = "__pnex_err"

FLAG, SITE_SLOT, AXIS, INDEX, RANK, SHAPE, THREAD, BLOCK = 0, 1, 2, 3, 4, 5, 9, 12
_SHAPE_SLOTS = 4
_RESERVED = "__pnex_"
_LOAD, _STORE, _CHECK, _ZERO = "__pnex_load", "__pnex_store", "__pnex_check", "__pnex_zero"
_LOAD_ON_CHIP = "__pnex_load_on_chip"  # a shared or local array's load
_VLOAD, _VSTORE = "__pnex_vload", "__pnex_vstore"  # pnex.vload / pnex.vstore
_FACTORY = "__pnex_factory"

_ATOMICS_WITH_INDEX = frozenset(
    {"add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax", "nanmin", "cas"}
)


@dataclasses.dataclass(frozen=True)
class Site:
    """One checked access in the kernel's source."""

    index: int  #: the number the record's slot 1 holds
    variable: str  #: what is indexed, as written: ``r``, or ``x[i]`` for ``x[i][j]``
    line: int  #: the line in the kernel's file (a ``%%pnex`` cell's own line numbers)
    source_text: str  #: that line, stripped
    kind: str  #: "load", "store", "update" (``x[i] += v``) or "atomic"
    role: str = ""  #: "parameter", "shared array", "local array" or "" (anything else)


@dataclasses.dataclass(frozen=True)
class CheckedKernel:
    """A kernel's checked variant: compile :attr:`function` in place of the kernel
    (for the GPU, and in the CUDA simulator) with one more argument, the error
    record (:func:`error_buffer`)."""

    function: types.FunctionType
    sites: tuple[Site, ...]
    #: Accesses left unchecked because the source proves them in bounds
    #: (:mod:`pnex_magic.index_ranges`): on-chip arrays indexed within their constant
    #: shape, tensors indexed under a guard on their size.
    proven: tuple[Site, ...] = ()

    def describe(self, record: Sequence[int]) -> str | None:
        """:func:`describe_violation` for this kernel (``None``: no violation)."""
        if not int(record[FLAG]):
            return None
        return describe_violation(self.function.__name__, record, self.sites)


@dataclasses.dataclass(frozen=True)
class Violation:
    """A decoded error record."""

    site: int
    axis: int
    index: int
    rank: int
    shape: tuple[int, ...]  #: the first four axes (all of them up to rank 4)
    thread: tuple[int, int, int]
    block: tuple[int, int, int]


# ----------------------------------------------------------------------------- records


def decode_record(record: Sequence[int]) -> Violation | None:
    """The violation a record holds (``None`` when its flag is 0).  ``record`` is any
    sequence of :data:`RECORD_SIZE` integers: a NumPy array, ``tensor.tolist()``."""
    values = [int(v) for v in (record.tolist() if hasattr(record, "tolist") else record)]
    if len(values) != RECORD_SIZE:
        raise ValueError(f"an error record has {RECORD_SIZE} entries, got {len(values)}")
    if not values[FLAG]:
        return None
    rank = values[RANK]
    return Violation(
        site=values[SITE_SLOT],
        axis=values[AXIS],
        index=values[INDEX],
        rank=rank,
        shape=tuple(values[SHAPE : SHAPE + min(rank, _SHAPE_SLOTS)]),
        thread=tuple(values[THREAD : THREAD + 3]),
        block=tuple(values[BLOCK : BLOCK + 3]),
    )


def _shape_text(v: Violation) -> str:
    dims = [str(n) for n in v.shape] + (["..."] if v.rank > _SHAPE_SLOTS else [])
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def describe_violation(kernel_name: str, record: Sequence[int], sites: Sequence[Site]) -> str:
    """One sentence about the violation ``record`` holds, e.g. ``copy(): index 1024 is
    out of bounds for axis 0 of parameter 'r' (shape (1024,)), at line 6: `r[i + 1] =
    a[i]`, thread (0, 0, 0) of block (4, 0, 0)``.  The line is the kernel's file's (a
    ``%%pnex`` cell's pseudo-file numbers lines from the cell's first)."""
    v = decode_record(record)
    if v is None:
        return f"{kernel_name}(): no access out of bounds"
    site = sites[v.site] if 0 <= v.site < len(sites) else None
    if site is None:
        what, where = "an array", f" (unknown access site {v.site})"
    else:
        what = f"{site.role} '{site.variable}'" if site.role else f"'{site.variable}'"
        where = f", at line {site.line}: `{site.source_text}`"
    thread = ", ".join(map(str, v.thread))
    block = ", ".join(map(str, v.block))
    return (
        f"{kernel_name}(): index {v.index} is out of bounds for axis {v.axis} of {what} "
        f"(shape {_shape_text(v)}){where}, thread ({thread}) of block ({block})"
    )


def violation_error(kernel_name: str, record: Sequence[int], sites: Sequence[Site]) -> KernelIndexError | None:
    """The exception a launcher raises after a checked launch whose record holds a
    violation (``None`` when it holds none).  It is an ``IndexError``; its
    ``violation`` and ``site`` attributes hold the decoded record and the site."""
    v = decode_record(record)
    if v is None:
        return None
    site = sites[v.site] if 0 <= v.site < len(sites) else None
    return KernelIndexError(describe_violation(kernel_name, record, sites), violation=v, site=site)


def error_buffer(device: Any = "cpu") -> Any:
    """A zeroed error record (a torch int64 tensor of :data:`RECORD_SIZE`) on ``device``."""
    import torch

    return torch.zeros(RECORD_SIZE, dtype=torch.int64, device=device)


def checked_spec(spec: Any) -> Any:
    """``spec`` with the error record appended as a trailing ``InMut`` int64 1-D
    parameter named :data:`ERR_PARAM`: what the compile stage
    (:func:`pnex_magic.compiler.compile_kernel`) and the launchers take for the checked
    variant (Numba's ABI: 7 eight-byte slots, meminfo, parent, nitems, itemsize, data,
    shape, stride)."""
    from .dtypes import resolve_dtype
    from .spec import TensorParam

    err = TensorParam(name=ERR_PARAM, role="inmut", dtype=resolve_dtype("int64"), shape=(None,))
    return dataclasses.replace(spec, params=(*spec.params, err))


# ----------------------------------------------------------------------------- helpers
# Python functions: what the CUDA simulator runs.  Their CUDA implementations are
# registered by _register_cuda() (Numba's overloads), with the same semantics.

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


def _py_record(err: Any, site: int, axis: int, index: int, shape: tuple[int, ...]) -> None:
    thread = threading.current_thread()
    tid = getattr(thread, "threadIdx", None)
    bid = getattr(thread, "blockIdx", None)
    with _RECORD_LOCK:
        if int(err[FLAG]) != 0:
            return
        values = [1, site, axis, index, len(shape)]
        values += [shape[k] if k < len(shape) else 0 for k in range(_SHAPE_SLOTS)]
        values += [tid.x, tid.y, tid.z] if tid is not None else [0, 0, 0]
        values += [bid.x, bid.y, bid.z] if bid is not None else [0, 0, 0]
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
            _py_record(err, site, axis, i, shape)
            return False
    return True


def _py_zero(x: Any) -> Any:
    return x.dtype.type(0)


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


def _py_strict(x: Any, err: Any, site: int, i: int) -> bool:
    """Whether element ``i`` of the 1-D array ``x`` exists, as for a slice's bounds (no
    wrap-around, what pnex.vload and pnex.vstore take); records the first violation."""
    shape = _py_shape(x)
    if shape is None or 0 <= i < shape[0]:
        return True
    _py_record(err, site, 0, i, shape)
    return False


def __pnex_vload(x, err, site, idx, width):  # noqa: N807
    return tuple(x[idx + k] if _py_strict(x, err, site, idx + k) else _py_zero(x) for k in range(width))


def __pnex_vstore(x, err, site, idx, values):  # noqa: N807
    for k, value in enumerate(values):
        if _py_strict(x, err, site, idx + k):
            x[idx + k] = value


_HELPERS = {_LOAD: __pnex_load, _LOAD_ON_CHIP: __pnex_load_on_chip, _STORE: __pnex_store, _CHECK: __pnex_check,
            _ZERO: __pnex_zero, _VLOAD: __pnex_vload, _VSTORE: __pnex_vstore}


def _emit_record(builder: Any, rec: Any, site: Any, axis: Any, index: Any, rank: Any, dims: list[Any]) -> None:
    """The first violation wins slot 0 (compare-and-swap) and fills the record."""
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
        # The thread's and block's coordinates are read here, by volatile inline PTX:
        # NVVM hoists the llvm.nvvm.read.ptx.sreg intrinsics of every cold block into
        # the kernel's entry, where they (and their zero high words) then hold
        # registers for the whole kernel.
        for k, reg in enumerate(("tid.x", "tid.y", "tid.z", "ctaid.x", "ctaid.y", "ctaid.z")):
            asm = ir.InlineAsm(ir.FunctionType(i32, []), f"mov.u32 $0, %{reg};", "=r", side_effect=True)
            put_small(THREAD + k, builder.call(asm, []))


@functools.lru_cache(maxsize=1)
def _register_cuda() -> None:
    """Register the helpers' CUDA implementations with Numba (once, on first use)."""
    from . import warmup

    warmup.wait()  # Numba's imports, never beside the background warm-up's
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic, overload

    from numba.cuda.np.arrayobj import load_item, store_item

    i64 = ir.IntType(64)

    def _safe_load_fits(x: Any) -> bool:
        # A plain number (the error record holds any of them).
        return isinstance(x.dtype, (types.Number, types.Boolean))

    def can_cast(value: Any, dtype: Any) -> bool:
        # As Numba's setitem: a value it converts to the dtype (else the plain path's
        # x[idx] = value gives Numba's own typing error).
        from numba.cuda.descriptor import cuda_target

        return cuda_target.typing_context.can_convert(value, dtype) is not None

    def index_types(idx: Any) -> tuple[Any, ...] | None:
        if isinstance(idx, types.Integer):
            return (idx,)
        if isinstance(idx, types.BaseTuple) and all(isinstance(t, types.Integer) for t in idx.types):
            return tuple(idx.types)
        return None

    def checked(x: Any, idx: Any) -> int | None:
        """How many axes ``x[idx]`` indexes when it is checked (``None``: not checked)."""
        its = index_types(idx)
        if isinstance(x, types.Array) and its is not None and 0 < len(its) <= x.ndim:
            return len(its)
        return None

    def bounds(context: Any, builder: Any, signature: Any, args: Any) -> tuple[Any, list[Any], Any, list[Any], Any]:
        """Whether every index is in bounds (one i1), the indices wrapped as Numba wraps
        them, the array, its shape, and a function that emits the cold block recording
        the violation (call it where the record should go)."""
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
            dims = [shape[k] if k < xty.ndim else ir.Constant(i64, 0) for k in range(_SHAPE_SLOTS)]
            site64 = context.cast(builder, sitev, sitety, types.int64)
            _emit_record(builder, rec, site64, axis, index, ir.Constant(i64, xty.ndim), dims)

        return all_ok, wrapped, arr, shape, record

    def valid(x: Any, err: Any, site: Any, idx: Any) -> bool:
        return checked(x, idx) is not None and isinstance(err, types.Array) and isinstance(site, types.Integer)

    @intrinsic
    def _in_bounds(typingctx, x, err, site, idx):
        # Whether every index is in bounds; the first violation of the launch fills
        # the record (in a cold block).
        if not valid(x, err, site, idx):
            return None

        def codegen(context, builder, signature, args):
            all_ok, _, _, _, record = bounds(context, builder, signature, args)
            with builder.if_then(builder.not_(all_ok), likely=False):
                record()
            return all_ok

        return types.boolean(x, err, site, idx), codegen

    def element_pointer(context: Any, builder: Any, xty: Any, arr: Any, shape: list[Any], wrapped: list[Any]) -> Any:
        strides = cgutils.unpack_tuple(builder, arr.strides, xty.ndim)
        return cgutils.get_item_pointer2(context, builder, data=arr.data, shape=shape, strides=strides,
                                         layout=xty.layout, inds=wrapped, wraparound=False)

    @intrinsic
    def _load_or_zero(typingctx, x, err, site, idx):
        # x[idx] when it is in bounds, else zero of the dtype (the violation recorded).
        # From global memory with no branch on the hot path: the load is made in any
        # case, from the element's address or, out of bounds, from the error record
        # (which every number fits), and a select picks the value; so a kernel's global
        # loads issue back to back as in the fast variant, and only the cold record
        # block branches.
        if not valid(x, err, site, idx) or checked(x, idx) != x.ndim:
            return None

        def codegen(context, builder, signature, args):
            xty, errty = signature.args[:2]
            all_ok, wrapped, arr, shape, record = bounds(context, builder, signature, args)
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
    def _store_checked(typingctx, x, err, site, idx, value):
        # x[idx] = value when it is in bounds, else the violation recorded: one branch.
        if not valid(x, err, site, idx) or checked(x, idx) != x.ndim or not x.mutable:
            return None

        def codegen(context, builder, signature, args):
            xty = signature.args[0]
            all_ok, wrapped, arr, shape, record = bounds(context, builder, signature, args)
            item = context.cast(builder, args[4], signature.args[4], xty.dtype)
            with builder.if_else(all_ok, likely=True) as (inside, outside):
                with inside:
                    store_item(context, builder, xty, item, element_pointer(context, builder, xty, arr, shape, wrapped))
                with outside:
                    record()
            return context.get_dummy_value()

        return types.none(x, err, site, idx, value), codegen

    @intrinsic
    def _null(typingctx, x):
        # Zero of the array's dtype.
        if not isinstance(x, types.Array):
            return None

        def codegen(context, builder, signature, args):
            return context.get_constant_null(signature.return_type)

        return x.dtype(x), codegen

    @intrinsic
    def _zero_index(typingctx, idx):
        # An index of the same type as ``idx``, all zeros.
        if index_types(idx) is None:
            return None

        def codegen(context, builder, signature, args):
            return context.get_constant_null(signature.return_type)

        return idx(idx), codegen

    @overload(__pnex_check, target="cuda")
    def _check_impl(x, err, site, idx):
        if checked(x, idx) is None:
            return lambda x, err, site, idx: True
        return lambda x, err, site, idx: _in_bounds(x, err, site, idx)

    @overload(__pnex_zero, target="cuda")
    def _zero_impl(x):
        if isinstance(x, types.Array):
            return lambda x: _null(x)
        return None

    def branching_load(x, err, site, idx):
        # One branch around the load: the element, or zero with the violation recorded.
        if _in_bounds(x, err, site, idx):
            return x[idx]
        return _null(x)

    @overload(__pnex_load, target="cuda", inline="always")  # a view cannot be returned from a call; and
    # a call is inlined by NVVM only when it calls nothing external (a bfloat16 conversion does)
    def _load_impl(x, err, site, idx):
        k = checked(x, idx)
        if k is None:
            return lambda x, err, site, idx: x[idx]
        if k == x.ndim:
            if _safe_load_fits(x):
                return lambda x, err, site, idx: _load_or_zero(x, err, site, idx)
            return branching_load

        def view(x, err, site, idx):
            if _in_bounds(x, err, site, idx):
                return x[idx]
            return x[_zero_index(idx)]

        return view

    @overload(__pnex_load_on_chip, target="cuda", inline="always")
    def _load_on_chip_impl(x, err, site, idx):
        # A shared or local array: on-chip memory, whose loads are cheap to wait for;
        # a branch around the load (what the global loads avoid) costs fewer registers.
        if checked(x, idx) != getattr(x, "ndim", None):
            return _load_impl(x, err, site, idx)
        return branching_load

    @overload(__pnex_store, target="cuda", inline="always")
    def _store_impl(x, err, site, idx, value):
        if checked(x, idx) is None:

            def plain(x, err, site, idx, value):
                x[idx] = value

            return plain

        if checked(x, idx) == x.ndim and x.mutable and _safe_load_fits(x) and can_cast(value, x.dtype):
            # (a read-only array, an In parameter, takes the path below: Numba refuses the
            # write when it types it, as in the fast variant)
            return lambda x, err, site, idx, value: _store_checked(x, err, site, idx, value)

        def store(x, err, site, idx, value):
            if _in_bounds(x, err, site, idx):
                x[idx] = value

        return store

    # pnex.vload / pnex.vstore: the vector access when every element exists (0 <= idx,
    # idx + width <= len), else each element checked as for a slice (no wrap-around:
    # the index is tested as unsigned, so a negative one is out of bounds, and the
    # record shows it as written).
    from numba.cuda.core.errors import TypingError

    from .vector import vload, vstore

    def strict(k: int) -> str:
        return f"_in_bounds(x, err, site, uint64(idx + {k}))"

    def generated(code: str) -> Any:
        namespace = {"_in_bounds": _in_bounds, "_null": _null, "uint64": types.uint64, "vload": vload, "vstore": vstore}
        exec(code, namespace)  # noqa: S102 - the source above, for one width
        return namespace["impl"]

    @overload(__pnex_vload, target="cuda", prefer_literal=True)
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

    @overload(__pnex_vstore, target="cuda")
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


# ----------------------------------------------------------------------------- rewrite


def _name(id_: str) -> ast.Name:
    return ast.Name(id=id_, ctx=ast.Load())


def _bad_index(node: ast.AST) -> bool:
    """A slice, ``...``, ``None`` or ``*x`` among a subscript's indices."""
    parts = node.elts if isinstance(node, ast.Tuple) else [node]
    for p in parts:
        if isinstance(p, (ast.Slice, ast.Starred)):
            return True
        if isinstance(p, ast.Constant) and (p.value is Ellipsis or p.value is None):
            return True
    return False


def _simple(node: ast.AST) -> bool:
    """An expression that is cheap and pure to evaluate twice (no calls, no subscripts)."""
    allowed = (
        ast.Name, ast.Constant, ast.Attribute, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.Load,
        ast.operator, ast.unaryop,
    )
    return all(isinstance(n, allowed) for n in ast.walk(node))


def _array_roles(fdef: ast.FunctionDef) -> dict[str, str]:
    """Locals bound to ``cuda.shared.array(...)`` / ``cuda.local.array(...)``."""
    roles: dict[str, str] = {}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "array":
                owner = func.value
                kind = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if kind in ("shared", "local"):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            roles[target.id] = f"{kind} array"
    return roles


class _Rewriter(ast.NodeTransformer):
    def __init__(self, lines: dict[int, str], params: set[str], roles: dict[str, str], ranges: IndexRanges):
        self.lines = lines
        self.params = params
        self.roles = roles
        self.ranges = ranges
        self.sites: list[Site] = []
        self.proven: list[Site] = []
        self._proven_ids: dict[int, bool] = {}
        self.temps = 0
        self.facts: list[Fact] = []  # what the enclosing guards establish where the visit is

    # -- guards: the facts (i < x.shape[0], i >= 0) that hold in a region of the body
    def _holding(self, facts: list[Fact], region: list[ast.AST]) -> list[Fact]:
        """The facts still true throughout ``region``: none about a name it rebinds."""
        rebound = bound_names(region)
        return [f for f in facts if f.name not in rebound]

    @contextlib.contextmanager
    def _assuming(self, facts: list[Fact]) -> Iterator[None]:
        """``facts`` hold for what is visited inside; the facts added inside go at the end."""
        depth = len(self.facts)
        self.facts += facts
        try:
            yield
        finally:
            del self.facts[depth:]

    def visit_block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """Rewrite a list of statements; after ``if test: return`` (or ``continue``,
        ``break``, ``raise``), what ``test`` being false establishes holds for the rest."""
        out: list[ast.stmt] = []
        with self._assuming([]):
            for k, stmt in enumerate(stmts):
                after: list[Fact] = []
                if (isinstance(stmt, ast.If) and not stmt.orelse and stmt.body
                        and isinstance(stmt.body[-1], (ast.Return, ast.Continue, ast.Break, ast.Raise))):
                    # from the test as written (the visit below rewrites it)
                    after = self._holding(self.ranges.exit_facts(stmt.test), [stmt.test, *stmts[k + 1:]])
                new = self.visit(stmt)
                out.extend(new if isinstance(new, list) else [new] if new is not None else [])
                self.facts += after
        return out

    def visit_If(self, node: ast.If) -> ast.If:
        facts = self._holding(self.ranges.facts(node.test), [node.test, *node.body])  # from the test as written
        node.test = self.visit(node.test)
        with self._assuming(facts):
            node.body = self.visit_block(node.body)
        node.orelse = self.visit_block(node.orelse)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.IfExp:
        facts = self._holding(self.ranges.facts(node.test), [node.test, node.body])
        node.test = self.visit(node.test)
        with self._assuming(facts):
            node.body = self.visit(node.body)
        node.orelse = self.visit(node.orelse)
        return node

    def visit_For(self, node: ast.For) -> ast.For:
        facts = self._holding(self.ranges.loop_facts(node), list(node.body))
        node.target = self.visit(node.target)
        node.iter = self.visit(node.iter)
        with self._assuming(facts):
            node.body = self.visit_block(node.body)
        node.orelse = self.visit_block(node.orelse)
        return node

    def visit_While(self, node: ast.While) -> ast.While:
        node.test = self.visit(node.test)
        node.body = self.visit_block(node.body)
        node.orelse = self.visit_block(node.orelse)
        return node

    # -- bookkeeping
    def _describe(self, node: ast.Subscript | ast.Call, variable: ast.expr, kind: str, index: int) -> Site:
        if isinstance(variable, ast.Name):
            role = "parameter" if variable.id in self.params else self.roles.get(variable.id, "")
        else:
            role = ""
        line = node.lineno
        return Site(index, ast.unparse(variable), line, self.lines.get(line, "").strip(), kind, role)

    def _site(self, node: ast.Subscript | ast.Call, variable: ast.expr, kind: str) -> ast.Constant:
        self.sites.append(self._describe(node, variable, kind, len(self.sites)))
        return ast.Constant(len(self.sites) - 1)

    def _proven(self, node: ast.Subscript, call: ast.Call | None = None) -> bool:
        """Whether the source proves this access (``call``: an atomic's, on ``node``'s array
        and index) in bounds; it is then left as written."""
        key = id(call if call is not None else node)
        found = self._proven_ids.get(key)
        if found is None:
            found = self._proven_ids[key] = self.ranges.in_bounds(node, self.facts)
            if found:
                kind = "atomic" if call is not None else "store" if isinstance(node.ctx, ast.Store) else "load"
                self.proven.append(self._describe(call or node, node.value, kind, len(self.proven)))
        return found

    def _proven_atomic(self, call: ast.Call, array: ast.expr, index: ast.expr | None) -> bool:
        if index is None:
            return False
        access = ast.copy_location(ast.Subscript(value=array, slice=index, ctx=ast.Load()), call)
        return self._proven(access, call)

    def _load_helper(self, variable: ast.expr) -> str:
        """The load helper for an array: on-chip (a shared or local array) or not."""
        on_chip = isinstance(variable, ast.Name) and self.roles.get(variable.id, "").startswith(("shared", "local"))
        return _LOAD_ON_CHIP if on_chip and variable.id not in self.params else _LOAD

    def _temp(self) -> str:
        self.temps += 1
        return f"{_RESERVED}k{self.temps - 1}"

    def _checkable(self, node: ast.AST) -> bool:
        """A subscript of a plain name (or of a subscript of one) without slices."""
        if not isinstance(node, ast.Subscript) or _bad_index(node.slice) or self._proven(node):
            return False
        value = node.value
        while isinstance(value, ast.Subscript):  # x[i][j], x[0:2][k]: the view is checked too
            value = value.value
        return isinstance(value, ast.Name)

    def _call(self, helper: str, *args: ast.expr) -> ast.Call:
        return ast.Call(func=_name(helper), args=list(args), keywords=[])

    # -- loads
    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if not isinstance(node.ctx, ast.Load) or not self._checkable(node):
            return self.generic_visit(node)
        site = self._site(node, node.value, "load")
        value = self.visit(node.value)
        index = self.visit(node.slice)
        return ast.copy_location(self._call(self._load_helper(node.value), value, _name(ERR_PARAM), site, index), node)

    # -- stores
    def _store(self, target: ast.Subscript, value: ast.expr, kind: str = "store") -> ast.stmt:
        site = self._site(target, target.value, kind)
        call = self._call(_STORE, self.visit(target.value), _name(ERR_PARAM), site, self.visit(target.slice), value)
        return ast.copy_location(ast.Expr(call), target)

    def _has_checked_target(self, target: ast.AST) -> bool:
        if isinstance(target, (ast.Tuple, ast.List)):
            return any(self._has_checked_target(t) for t in target.elts)
        return self._checkable(target)

    def _assign_to(self, target: ast.expr, value: ast.expr, where: ast.stmt) -> list[ast.stmt]:
        if self._checkable(target):
            return [self._store(target, value)]
        if isinstance(target, (ast.Tuple, ast.List)) and self._has_checked_target(target):
            later: list[tuple[ast.expr, str]] = []

            def strip(t: ast.expr) -> ast.expr:
                if self._checkable(t):
                    name = self._temp()
                    later.append((t, name))
                    return ast.Name(id=name, ctx=ast.Store())
                if isinstance(t, (ast.Tuple, ast.List)):
                    return type(t)(elts=[strip(e) for e in t.elts], ctx=ast.Store())
                return self.visit(t)

            unpack = ast.copy_location(ast.Assign(targets=[strip(target)], value=value), where)
            return [unpack, *(self._store(t, _name(name)) for t, name in later)]
        return [ast.copy_location(ast.Assign(targets=[self.visit(target)], value=value), where)]

    def visit_Assign(self, node: ast.Assign) -> Any:
        if not any(self._has_checked_target(t) for t in node.targets):
            return self.generic_visit(node)
        value = self.visit(node.value)
        out: list[ast.stmt] = []
        if len(node.targets) > 1:
            name = self._temp()
            out.append(ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value), node))
            value = _name(name)
        for target in node.targets:
            out += self._assign_to(target, value, node)
        return out

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        if node.value is not None and self._checkable(node.target):
            return [self._store(node.target, self.visit(node.value))]
        return self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        if not self._checkable(target):
            return self.generic_visit(node)
        out: list[ast.stmt] = []
        site = self._site(target, target.value, "update")
        array = self.visit(target.value)
        index = self.visit(target.slice)
        for expr_name, expr in (("array", array), ("index", index)):
            if not _simple(expr):
                name = self._temp()
                out.append(ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=expr), node))
                if expr_name == "array":
                    array = _name(name)
                else:
                    index = _name(name)
        old = self._call(_LOAD, array, _name(ERR_PARAM), site, index)
        new = ast.BinOp(left=old, op=node.op, right=self.visit(node.value))
        out.append(ast.copy_location(ast.Expr(self._call(_STORE, array, _name(ERR_PARAM), site, index, new)), node))
        return out

    # -- atomics
    def _atomic(self, call: ast.Call) -> tuple[ast.expr, ast.expr | None] | None:
        """(array, index) of a ``cuda.atomic.<op>(array, index, ...)`` call on a plain name."""
        func = call.func
        if not isinstance(func, ast.Attribute) or call.keywords or not call.args:
            return None
        owner = func.value
        if not ((isinstance(owner, ast.Attribute) and owner.attr == "atomic") or
                (isinstance(owner, ast.Name) and owner.id == "atomic")):
            return None
        if not isinstance(call.args[0], ast.Name):
            return None
        if func.attr == "compare_and_swap" and len(call.args) == 3:
            return call.args[0], None
        if func.attr in _ATOMICS_WITH_INDEX and len(call.args) >= 3 and not _bad_index(call.args[1]):
            return call.args[0], call.args[1]
        return None

    def _guarded_atomic(self, call: ast.Call) -> tuple[list[ast.stmt], ast.Call, ast.Call] | None:
        found = self._atomic(call)
        if found is None or self._proven_atomic(call, *found):
            return None
        array, index = found
        site = self._site(call, array, "atomic")
        args = [self.visit(a) for a in call.args]
        pre: list[ast.stmt] = []
        if index is None:
            check_index: ast.expr = ast.Constant(0)
        else:
            check_index = args[1]
            if not _simple(check_index):
                name = self._temp()
                pre.append(ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=check_index), call))
                check_index = _name(name)
                args[1] = _name(name)
        atomic = ast.copy_location(ast.Call(func=call.func, args=args, keywords=[]), call)
        check = ast.copy_location(self._call(_CHECK, array, _name(ERR_PARAM), site, check_index), call)
        return pre, atomic, check

    def visit_Expr(self, node: ast.Expr) -> Any:
        if isinstance(node.value, ast.Call):
            guarded = self._guarded_atomic(node.value)
            if guarded is not None:
                pre, atomic, check = guarded
                body = [ast.copy_location(ast.Expr(atomic), node)]
                return [*pre, ast.copy_location(ast.If(test=check, body=body, orelse=[]), node)]
        return self.generic_visit(node)

    def _vector(self, call: ast.Call) -> str | None:
        """The checked helper for a ``pnex.vload(x, i, w)`` / ``pnex.vstore(x, i, v)``
        call (by name, as ``vload(...)`` too) on a plain name, else ``None``."""
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in ("vload", "vstore") or call.keywords or len(call.args) != 3:
            return None
        if not isinstance(call.args[0], ast.Name):
            return None
        return _VLOAD if name == "vload" else _VSTORE

    def visit_Call(self, node: ast.Call) -> ast.AST:
        helper = self._vector(node)
        if helper is not None:
            array, index, last = node.args
            site = self._site(node, array, "load" if helper == _VLOAD else "store")
            args = [self.visit(array), _name(ERR_PARAM), site, self.visit(index), self.visit(last)]
            return ast.copy_location(self._call(helper, *args), node)
        # An atomic whose result is used: (atomic(x, i, v) if check(x, err, S, i) else zero(x)).
        # Its index is evaluated twice (Numba 0.30 cannot type a walrus there): an index
        # whose evaluation has side effects would see them twice.
        found = self._atomic(node)
        if found is None or self._proven_atomic(node, *found):
            return self.generic_visit(node)
        array, index = found
        site = self._site(node, array, "atomic")
        args = [self.visit(a) for a in node.args]
        check_index = ast.Constant(0) if index is None else self.visit(index)
        check = self._call(_CHECK, array, _name(ERR_PARAM), site, check_index)
        atomic = ast.Call(func=node.func, args=args, keywords=[])
        zero = self._call(_ZERO, array)
        return ast.copy_location(ast.IfExp(test=check, body=atomic, orelse=zero), node)


def _source(fn: types.FunctionType) -> tuple[ast.FunctionDef, list[str], int]:
    """The kernel's ``def`` (lines numbered as in its file), its source lines, and the
    number of its first line."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise KernelDefinitionError(
            f"kernel {name!r}: a checked variant (check=True, %%pnex --check, PNEX_CHECK=1) is built from the "
            f"kernel's Python source, and there is none here ({exc}). Define the kernel in a file or a notebook "
            f"cell, not with exec() of a string"
        ) from None
    text = "".join(lines)
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        tree = ast.parse("if 1:\n" + text)  # an indented def whose strings break dedent
        tree.body = tree.body[0].body  # type: ignore[attr-defined]
        ast.increment_lineno(tree, -1)
    fdef = tree.body[0] if tree.body else None
    if not isinstance(fdef, ast.FunctionDef) or fdef.name != fn.__name__:
        raise KernelDefinitionError(
            f"kernel {name!r}: a checked variant needs the kernel's source as a plain 'def {name}(...)' "
            f"statement; inspect found {type(fdef).__name__ if fdef is not None else 'nothing'}"
        )
    ast.increment_lineno(fdef, first - 1)
    return fdef, lines, first


def _build(code: types.CodeType, namespace: dict[str, Any], fn: types.FunctionType) -> types.FunctionType:
    """The one ``exec`` of this module: it runs the factory's ``def`` (the rewritten
    kernel nested in a function of its free variables) in a copy of the kernel's
    globals, so the new function reads the same globals and closure values."""
    exec(code, namespace)  # noqa: S102 - code built above from the kernel's own AST
    factory = namespace.pop(_FACTORY)
    cells = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            raise KernelDefinitionError(
                f"kernel {fn.__name__!r}: its free variable {name!r} has no value yet; a checked variant "
                f"is built from the closure's values"
            ) from None
    new = factory(*cells)
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    return new


def checked_kernel(fn: Callable, spec: Any = None) -> CheckedKernel:
    """The checked variant of kernel ``fn`` (see the module's docstring).

    ``spec``: the op's :class:`~pnex_magic.spec.KernelSpec`, which tells what accesses
    can be proven in bounds (:mod:`pnex_magic.index_ranges`): its block candidates
    bound ``cuda.threadIdx``, its shape declarations say which tensor axes have the same
    size.  ``None``: no such knowledge (any block, every tensor axis its own size).

    Raises
    ------
    KernelDefinitionError
        ``fn`` has no Python source here, has ``*args``/``**kwargs``/keyword-only
        parameters, or uses a name starting with ``__pnex_`` (reserved).
    """
    fn = getattr(fn, "py_func", fn)
    if not isinstance(fn, types.FunctionType):
        raise KernelDefinitionError(f"a checked variant is built from a Python function, got {fn!r}")
    fdef, lines, first = _source(fn)
    args = fdef.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        raise KernelDefinitionError(
            f"kernel {fn.__name__!r}: a kernel takes positional parameters only (no *args, **kwargs or keyword-only)"
        )
    used = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name)} | {a.arg for a in args.posonlyargs + args.args}
    reserved = sorted(n for n in used if n.startswith(_RESERVED))
    if reserved:
        raise KernelDefinitionError(
            f"kernel {fn.__name__!r}: names starting with {_RESERVED!r} are reserved for the checked variant: "
            f"{', '.join(reserved)}"
        )
    params = {a.arg for a in args.posonlyargs + args.args}
    numbered = {first + k: line.rstrip("\n") for k, line in enumerate(lines)}
    blocks = spec.block_candidates if spec is not None else None
    values = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        with contextlib.suppress(ValueError):  # an empty cell: _build says so below
            values[name] = cell.cell_contents
    ranges = IndexRanges(fdef, values, blocks, tensor_dims(spec) if spec is not None else None)
    rewriter = _Rewriter(numbered, params, _array_roles(fdef), ranges)
    flat = rewriter.visit_block(fdef.body)
    # Same name and parameters, no decorators, annotations or defaults (the launch
    # passes every argument), plus the error record.
    for a in args.posonlyargs + args.args:
        a.annotation = None
    args.defaults = []
    args.args.append(ast.arg(arg=ERR_PARAM))
    fdef.body = flat
    fdef.decorator_list = []
    fdef.returns = None
    fdef.type_comment = None
    freevars = list(fn.__code__.co_freevars)
    ret = ast.Return(value=_name(fdef.name))
    factory = ast.FunctionDef(
        name=_FACTORY,
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=v) for v in freevars], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=[fdef, ret],
        decorator_list=[],
        returns=None,
    )
    if "type_params" in ast.FunctionDef._fields:  # Python 3.12+
        factory.type_params = []
    ast.copy_location(factory, fdef)
    ast.copy_location(ret, fdef)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, fn.__code__.co_filename, "exec", dont_inherit=True)
    namespace = dict(fn.__globals__)
    namespace.update(_HELPERS)
    _register_cuda()
    function = _build(code, namespace, fn)
    return CheckedKernel(function=function, sites=tuple(rewriter.sites), proven=tuple(rewriter.proven))
