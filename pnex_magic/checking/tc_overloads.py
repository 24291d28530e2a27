"""The checked forms of the tensor-core primitives on the GPU (:mod:`.tc_helpers` says
what they do): Numba overloads of the same Python functions, registered once
(:func:`register`), each generated for its types from the rules of
:mod:`pnex_magic.tc.rules` and then calling the primitive itself.

On the GPU an alignment is that of the address the instruction takes (the
shared-window or global address, modulo 16 or 1024 bytes), so a tile that Numba's
default alignment (the element size) happened to place well passes here, where the
simulator, which knows only what was declared, refuses it.

The checks are ordinary code in the checked variant only: a compare or two per axis,
an address's low bits, the recording in the branch of a failure.  A warp-level
primitive is run or skipped by its whole warp together (``vote.all``); ``wgmma`` by
its whole warpgroup (``bar.red.and`` on the named barrier ``1 + warpgroup``, which
the barrier ``__syncthreads`` uses, 0, never meets).  The fast variant is not
touched: it is compiled from the kernel as written.
"""

from __future__ import annotations

import functools
from typing import Any

from ..tc import api as tc
from ..tc.layouts import MMA_SHAPES
from ..tc.rules import ALIGN, CONTIGUOUS, FRAGMENT, MULTIPLE, RANGE, ROWS, WHOLE
from .lowering import emit_record, index_types
from .tc_helpers import MMA_KINDS, TC_HELPERS, helper_name

__all__ = ["register"]


@functools.lru_cache(maxsize=1)
def register() -> None:
    """Register the CUDA implementations of the checked forms (once)."""
    from numba import cuda
    from numba.cuda import types
    from numba.cuda.core.errors import TypingError
    from numba.cuda.extending import overload

    from ..tc.lowering import _literal

    found = _intrinsics()
    namespace = {"tc": tc, "cuda": cuda, "uint64": types.uint64, "int64": types.int64, **found}

    def generated(code: str) -> Any:
        scope = dict(namespace)
        exec(code, scope)  # noqa: S102 - the source below, for one primitive and its operands' types
        return scope["impl"]

    def rank(what: str, array: Any, index: Any) -> int:
        """The array's rank; the primitive's own typing words for what is not indexable."""
        name, _, operand = what.partition(": the ")
        if not isinstance(array, types.Array):
            raise TypingError(f"{name}: the {operand} must be an array, got {array}")
        its = index_types(index)
        if its is None:
            raise TypingError(f"{name}: the {operand}'s index must be an integer or a tuple of integers, got {index}")
        if len(its) != array.ndim:
            raise TypingError(f"{name}: {len(its)} subscripts for the {array.ndim}-D {operand}")
        return array.ndim

    def form(name: str):
        return TC_HELPERS[helper_name(name)]

    def mma_form(name: str):
        _, _, _, a_words, b_words, _ = MMA_SHAPES[MMA_KINDS[name]]

        def typer(err, site, acc, a, b):
            return generated(
                "def impl(err, site, acc, a, b):\n"
                + _whole(32, "acc")
                + "    ok = True\n"
                + _fragment("acc", 4, True, "site")
                + _fragment("a", a_words, True, "site + 1")
                + _fragment("b", b_words, True, "site + 2")
                + "    if cuda.all_sync(0xFFFFFFFF, ok):\n"
                + f"        tc.{name}(acc, a, b)\n"
            )

        return typer

    for name in MMA_KINDS:
        overload(form(name), target="cuda")(mma_form(name))

    @overload(form("ldmatrix"), target="cuda", prefer_literal=True)
    def _ldmatrix(err, site, frag, tile, index, count, trans):
        n = _literal(count)
        if n not in (1, 2, 4):
            raise TypingError(f"pnex.tc.ldmatrix: count must be a constant 1, 2 or 4, got {count}")
        dims = rank("pnex.tc.ldmatrix: the tile", tile, index)
        return generated(
            "def impl(err, site, frag, tile, index, count, trans):\n"
            + _whole(32, "frag")
            + "    ok = True\n"
            + _fragment("frag", n, False, "site")
            + f"    if ok and tid % 32 < {8 * n}:\n"
            + _span("tile", "index", dims, 8, 16, 2, "site + 1")
            + "    if cuda.all_sync(0xFFFFFFFF, ok):\n"
            + "        tc.ldmatrix(frag, tile, index, count, trans)\n"
        )

    @overload(form("cp_async"), target="cuda")
    def _cp_async(err, site, dst, dst_index, src, src_index, valid):
        d = rank("pnex.tc.cp_async: the destination", dst, dst_index)
        s = rank("pnex.tc.cp_async: the source", src, src_index)
        size = dst.dtype.bitwidth // 8
        if src.dtype.bitwidth // 8 != size or 16 % size:  # the primitive's typing says so
            return lambda err, site, dst, dst_index, src, src_index, valid: tc.cp_async(
                dst, dst_index, src, src_index, valid)
        return generated(
            "def impl(err, site, dst, dst_index, src, src_index, valid):\n"
            "    ok = True\n"
            "    if ok:\n"
            + _span("dst", "dst_index", d, 16 // size, 16, size, "site")
            + "    if ok and valid:\n"
            + _span("src", "src_index", s, 16 // size, 16, size, "site + 1")
            + "    if ok:\n"
            "        tc.cp_async(dst, dst_index, src, src_index, valid)\n"
        )

    @overload(form("store_pair"), target="cuda")
    def _store_pair(err, site, array, index, lo, hi):
        dims = rank("pnex.tc.store_pair: the array", array, index)
        return generated(
            "def impl(err, site, array, index, lo, hi):\n"
            "    ok = True\n"
            "    if ok:\n"
            + _span("array", "index", dims, 2, 4, array.dtype.bitwidth // 8, "site")
            + "    if ok:\n"
            "        tc.store_pair(array, index, lo, hi)\n"
        )

    def wgmma_form(name: str):
        def typer(err, site, acc, a, a_index, b, b_index, n, accumulate):
            width = _literal(n)
            if not isinstance(width, int):
                raise TypingError(f"pnex.tc.{name}: n (the tile's columns) must be a constant or a Tune parameter")
            ra = rank(f"pnex.tc.{name}: the A tile", a, a_index)
            rb = rank(f"pnex.tc.{name}: the B tile", b, b_index)
            if ra < 2 or rb < 2:
                raise TypingError(f"pnex.tc.{name}: a wgmma operand tile has at least 2 axes (rows, 64 columns)")
            return generated(
                "def impl(err, site, acc, a, a_index, b, b_index, n, accumulate):\n"
                + _whole(128, "acc")
                + "    ok = True\n"
                + _fragment("acc", width // 2, False, "site")
                + "    if ok:\n"
                + _tile("a", "a_index", ra, 64, "site + 1")
                + "    if ok:\n"
                + _tile("b", "b_index", rb, width, "site + 2")
                + "    if _agree_warpgroup(ok, tid // 128):\n"
                + f"        tc.{name}(acc, a, a_index, b, b_index, n, accumulate)\n"
            )

        return typer

    for name in ("wgmma", "wgmma_bf16"):
        overload(form(name), target="cuda", prefer_literal=True)(wgmma_form(name))


# ----------------------------------------------------------------------------------------------- code


def _items(index: str, dims: int) -> list[str]:
    return [index] if dims == 1 else [f"{index}[{k}]" for k in range(dims)]


def _whole(group: int, operand: str) -> str:
    """The calling thread's warp (``group`` 32) or warpgroup (128) is whole; else record
    and return (every thread of a short group does, together).  Defines ``tid``."""
    return (
        "    threads = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z\n"
        "    tid = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)\n"
        f"    if tid // {group} * {group} + {group} > threads:\n"
        f"        _record(err, site, {operand}, 0, threads, {WHOLE | group << 8})\n"
        "        return\n"
    )


def _fragment(x: str, length: int, exact: bool, site: str) -> str:
    test = f"{x}.shape[0] != {length}" if exact else f"{x}.shape[0] < {length}"
    return (
        f"    if ok and {test}:\n"
        f"        _record(err, {site}, {x}, 0, {x}.shape[0], {FRAGMENT | length << 8 | int(exact) << 24})\n"
        "        ok = False\n"
    )


def _chain(x: str, site: str, cases: list[tuple[str, str, str, str]]) -> str:
    """``if``/``elif`` over (test, axis, index, rule) cases, at the indent of an ``if ok:``
    body: the first that holds is recorded, by one call after the chain (one copy of
    the recording code per operand keeps the checked variant small enough to unroll)."""
    out = ["        axis_ = 0\n        at_ = int64(0)\n        rule_ = int64(0)\n"]
    for k, (test, axis, index, rule) in enumerate(cases):
        out.append(f"        {'if' if k == 0 else 'elif'} {test}:\n"
                   f"            ok = False\n            axis_ = {axis}\n            at_ = int64({index})\n"
                   f"            rule_ = int64({rule})\n")
    out.append(f"        if not ok:\n            _record(err, {site}, {x}, axis_, at_, rule_)\n")
    return "".join(out)


def _bounds(items: list[str], x: str) -> list[tuple[str, str, str, str]]:
    # One unsigned compare per axis: no wrap-around (the instruction takes the address).
    return [(f"uint64({i}) >= uint64({x}.shape[{k}])", str(k), i, "0") for k, i in enumerate(items)]


def _misaligned(x: str, axis: int, at: str, need: int, address: str) -> tuple[str, str, str, str]:
    low = need - 1
    rule = f"{ALIGN | need << 8} | (({address}) & {low}) << 24 | ((({address}) - _data({x})) & {low}) << 40"
    return f"({address}) & {low} != 0", str(axis), at, rule


def _span(x: str, index: str, dims: int, count: int, need: int, size: int, site: str) -> str:
    """``count`` elements of ``x`` from ``index`` along its last axis, in bounds,
    contiguous, their address ``need``-byte aligned (:func:`pnex_magic.tc.rules.span`)."""
    items = _items(index, dims)
    last = dims - 1
    cases = _bounds(items, x)
    cases.append((f"{items[-1]} + {count} > {x}.shape[{last}]", str(last), items[-1], str(RANGE | count << 8)))
    if count > 1:
        cases.append((f"{x}.strides[{last}] != {size}", str(last), f"{x}.strides[{last}]", str(CONTIGUOUS | size << 8)))
    cases.append(_misaligned(x, last, items[-1], need, f"_address({x}, {index})"))
    return _chain(x, site, cases)


def _tile(x: str, index: str, dims: int, rows: int, site: str) -> str:
    """``rows`` x 16 elements of a wgmma operand tile (:func:`pnex_magic.tc.rules.wgmma_tile`)."""
    items = _items(index, dims)
    last = dims - 1
    r0, c0 = items[-2], items[-1]
    strides = (f"{ROWS | 64 << 8} | min(max({x}.strides[{last}], 0), 65535) << 24 | "
               f"min(max({x}.strides[{last - 1}], 0), 65535) << 40")
    cases = _bounds(items, x)
    cases += [
        (f"{x}.shape[{last}] != 64 or {x}.strides[{last}] != 2 or {x}.strides[{last - 1}] != 128", str(last),
         f"{x}.shape[{last}]", strides),
        (f"{r0} % 8 != 0", str(last - 1), r0, str(MULTIPLE | 8 << 8)),
        (f"{c0} % 16 != 0", str(last), c0, str(MULTIPLE | 16 << 8)),
        (f"{r0} + {rows} > {x}.shape[{last - 1}]", str(last - 1), r0, str(RANGE | rows << 8)),
        _misaligned(x, last - 1, r0, 1024, f"_address({x}, {index}) - {c0} * 2"),
    ]
    return _chain(x, site, cases)


# ----------------------------------------------------------------------------------------------- intrinsics


def _intrinsics() -> dict[str, Any]:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    @intrinsic
    def _address(typingctx, x, idx):
        # The address of x[idx] (indices in bounds, no wrap-around), as an int64.
        its = index_types(idx)
        if not isinstance(x, types.Array) or its is None or len(its) != x.ndim:
            return None

        def codegen(context, builder, signature, args):
            xty, idxty = signature.args
            arr = context.make_array(xty)(context, builder, args[0])
            raw = [args[1]] if isinstance(idxty, types.Integer) else cgutils.unpack_tuple(builder, args[1], len(its))
            inds = [context.cast(builder, v, t, types.intp) for v, t in zip(raw, its)]
            pointer = cgutils.get_item_pointer(context, builder, xty, arr, inds, wraparound=False)
            return builder.ptrtoint(pointer, i64)

        return types.int64(x, idx), codegen

    @intrinsic
    def _data(typingctx, x):
        if not isinstance(x, types.Array):
            return None

        def codegen(context, builder, signature, args):
            return builder.ptrtoint(context.make_array(signature.args[0])(context, builder, args[0]).data, i64)

        return types.int64(x), codegen

    @intrinsic
    def _record(typingctx, err, site, x, axis, index, rule):
        # The first violation of the launch fills the record, with x's shape and the rule.
        if not (isinstance(err, types.Array) and isinstance(x, types.Array)
                and all(isinstance(t, types.Integer) for t in (site, axis, index, rule))):
            return None

        def codegen(context, builder, signature, args):
            errty, sitety, xty, axisty, indexty, rulety = signature.args
            rec = context.make_array(errty)(context, builder, args[0]).data
            shape = cgutils.unpack_tuple(builder, context.make_array(xty)(context, builder, args[2]).shape, xty.ndim)
            dims = [shape[k] if k < xty.ndim else ir.Constant(i64, 0) for k in range(4)]

            def wide(value: Any, ty: Any) -> Any:
                return context.cast(builder, value, ty, types.int64)

            emit_record(builder, rec, wide(args[1], sitety), wide(args[3], axisty), wide(args[4], indexty),
                        ir.Constant(i64, xty.ndim), dims, wide(args[5], rulety))
            return context.get_dummy_value()

        return types.none(err, site, x, axis, index, rule), codegen

    @intrinsic
    def _agree_warpgroup(typingctx, ok, group):
        # Whether every thread of this warpgroup is ok: bar.red.and over its 128 threads on
        # the named barrier 1 + group (convergent: never duplicated into a branch).
        if not isinstance(ok, types.Boolean) or not isinstance(group, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            flag = builder.zext(args[0], i32)
            barrier = builder.add(builder.trunc(context.cast(builder, args[1], signature.args[1], types.int64), i32),
                                  ir.Constant(i32, 1))
            text = ("{\n.reg .pred p, q;\nsetp.ne.u32 p, $1, 0;\nbar.red.and.pred q, $2, 128, p;\n"
                    "selp.u32 $0, 1, 0, q;\n}")
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32, i32]), text, "=r,r,r,~{memory}", side_effect=True)
            result = builder.call(asm, [flag, barrier], attrs=("convergent",))
            return builder.icmp_unsigned("!=", result, ir.Constant(i32, 0))

        return types.boolean(ok, group), codegen

    return {"_address": _address, "_data": _data, "_record": _record, "_agree_warpgroup": _agree_warpgroup}
