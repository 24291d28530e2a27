"""The checked forms of the tensor-core primitives (:mod:`pnex_magic.tc`), as Python
functions: what the CUDA simulator runs in a checked launch.

The rewrite (:mod:`pnex_magic.checking.rewrite`) turns a call of a primitive that
touches memory into a call of its checked form, with the error record and the number
of the call's first operand site (one site per operand, :data:`OPERANDS` order)::

    tc.cp_async(sa, (r, c), a, (m0 + r, k0 + c), ok)
      ->  __pnex_tc_cp_async(__pnex_err, SITE, sa, (r, c), a, (m0 + r, k0 + c), ok)

A checked form tests what the primitive requires of its operands
(:mod:`pnex_magic.tc.rules`: spans in bounds along a contiguous last axis, aligned;
fragments of their lengths; whole warps or warpgroups), records the first violation
and skips the primitive where one is found.  A warp-level primitive (``mma``,
``ldmatrix``, ``wgmma``) is skipped by its whole warp (warpgroup) together, as its
lanes must execute it together.  Types that the GPU's typing refuses at definition
(a fragment of the wrong dtype) raise, as in an unchecked run.

Their CUDA implementations: :mod:`pnex_magic.checking.tc_overloads`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..tc import api as tc
from ..tc import layouts, rules, simulate
from ..tc.arrays import itemsize, unwrap
from .helpers import RESERVED, record_fault

__all__ = ["CHECKED", "OPERANDS", "MMA_KINDS", "TC_HELPERS", "helper_name"]

#: The primitives a checked launch checks, with their operands in site order:
#: (argument position, what the message calls it, kind of access).
OPERANDS: dict[str, tuple[tuple[int, str, str], ...]] = {
    "mma": ((0, "accumulator", "update"), (1, "A fragment", "load"), (2, "B fragment", "load")),
    "mma_bf16": ((0, "accumulator", "update"), (1, "A fragment", "load"), (2, "B fragment", "load")),
    "mma_tf32": ((0, "accumulator", "update"), (1, "A fragment", "load"), (2, "B fragment", "load")),
    "ldmatrix": ((0, "fragment", "store"), (1, "tile", "load")),
    "cp_async": ((0, "destination", "store"), (2, "source", "load")),
    "store_pair": ((0, "array", "store"),),
    "wgmma": ((0, "accumulator", "update"), (1, "A tile", "load"), (3, "B tile", "load")),
    "wgmma_bf16": ((0, "accumulator", "update"), (1, "A tile", "load"), (3, "B tile", "load")),
}
CHECKED = frozenset(OPERANDS)
_WORDS = ("uint32", "int32")
#: The mma primitives' kinds (:data:`pnex_magic.tc.layouts.MMA_SHAPES`).
MMA_KINDS = {"mma": "f16", "mma_bf16": "bf16", "mma_tf32": "tf32"}


def helper_name(primitive: str) -> str:
    """The name the rewritten kernel calls the checked form of ``primitive`` by."""
    return f"{RESERVED}tc_{primitive}"


def _record(err: Any, site: int, fault: rules.Fault | None) -> bool:
    """Record ``fault`` (if any) at ``site``; whether there was none."""
    if fault is None:
        return True
    record_fault(err, site, fault.axis, fault.index, fault.shape, fault.word())
    return False


def _agree(ok: bool, name: str, group: int) -> bool:
    """Whether every thread of the warp (``group`` 32) or warpgroup (128) is ``ok``."""
    return simulate.collective(f"checked {name}", bool(ok), lambda oks: [all(oks)] * len(oks), group)


def _mma(name: str) -> Callable[..., None]:
    m, n, k, a_words, b_words, _ = layouts.MMA_SHAPES[MMA_KINDS[name]]
    primitive = getattr(tc, name)
    what = f"pnex.tc.{name}"

    def checked(err: Any, site: int, acc: Any, a: Any, b: Any) -> None:
        if not _record(err, site, rules.whole(32)):
            return
        ok = True
        operands = ((acc, 4, ("float32",), "the accumulator"), (a, a_words, _WORDS, "the A fragment"),
                    (b, b_words, _WORDS, "the B fragment"))
        for number, (array, length, dtypes, operand) in enumerate(operands):
            array = unwrap(array)
            rules.fragment_dtype(array, dtypes, f"{what}: {operand}")
            ok = ok and _record(err, site + number, rules.fragment(array, length, True, f"{what}: {operand}"))
        if _agree(ok, what, 32):
            primitive(acc, a, b)

    return checked


def _ldmatrix(err: Any, site: int, frag: Any, tile: Any, index: Any, count: int = 4, trans: bool = False) -> None:
    what = f"pnex.tc.ldmatrix (x{count}{', trans' if trans else ''})"
    if not _record(err, site, rules.whole(32)):
        return
    frag_, tile_ = unwrap(frag), unwrap(tile)
    rules.fragment_dtype(frag_, _WORDS, f"{what}: the fragment")
    if itemsize(tile_) != 2:
        raise TypeError(f"{what}: the tile must hold 16-bit elements (float16, bfloat16, int16), got {tile_.dtype}")
    ok = _record(err, site, rules.fragment(frag_, count, False, f"{what}: the fragment"))
    if simulate.lane_id() < 8 * count:  # the lanes whose addresses the instruction reads
        ok = ok and _record(err, site + 1, rules.span(tile_, index, 8, 16, f"{what}: the tile"))
    if _agree(ok, what, 32):
        tc.ldmatrix(frag, tile, index, count, trans)


def _cp_async(err: Any, site: int, dst: Any, dst_index: Any, src: Any, src_index: Any, valid: Any = True) -> None:
    what = "pnex.tc.cp_async"
    dst_, src_ = unwrap(dst), unwrap(src)
    rules.same_element_size(dst_, src_, what)
    count = 16 // itemsize(dst_)
    if not _record(err, site, rules.span(dst_, dst_index, count, 16, f"{what}: the destination")):
        return
    if valid and not _record(err, site + 1, rules.span(src_, src_index, count, 16, f"{what}: the source")):
        return
    tc.cp_async(dst, dst_index, src, src_index, valid)


def _store_pair(err: Any, site: int, array: Any, index: Any, lo: Any, hi: Any) -> None:
    target = unwrap(array)
    if not isinstance(target, simulate.Bf16Shadow) and target.dtype.name != "float16":
        raise TypeError(f"pnex.tc.store_pair: the array must hold float16 or bfloat16, got {target.dtype.name}")
    if _record(err, site, rules.span(target, index, 2, 4, "pnex.tc.store_pair: the array")):
        tc.store_pair(array, index, lo, hi)


def _wgmma(name: str) -> Callable[..., None]:
    primitive = getattr(tc, name)

    def checked(err: Any, site: int, acc: Any, a: Any, a_index: Any, b: Any, b_index: Any, n: int,
                accumulate: Any = True) -> None:
        what = f"pnex.tc.{name} (m64n{n}k16)"
        if not _record(err, site, rules.whole(128)):
            return
        acc_, a_, b_ = unwrap(acc), unwrap(a), unwrap(b)
        rules.fragment_dtype(acc_, ("float32",), f"{what}: the accumulator")
        for tile, operand in ((a_, "the A tile"), (b_, "the B tile")):
            if itemsize(tile) != 2:
                raise TypeError(f"{what}: {operand} must hold 16-bit elements (float16, bfloat16), got {tile.dtype}")
        ok = _record(err, site, rules.fragment(acc_, n // 2, False, f"{what}: the accumulator"))
        ok = ok and _record(err, site + 1, rules.wgmma_tile(a_, a_index, 64, f"{what}: the A tile"))
        ok = ok and _record(err, site + 2, rules.wgmma_tile(b_, b_index, n, f"{what}: the B tile"))
        if _agree(ok, what, 128):
            primitive(acc, a, a_index, b, b_index, n, accumulate)

    return checked


_FORMS: dict[str, Callable[..., None]] = {
    "mma": _mma("mma"), "mma_bf16": _mma("mma_bf16"), "mma_tf32": _mma("mma_tf32"),
    "ldmatrix": _ldmatrix, "cp_async": _cp_async, "store_pair": _store_pair,
    "wgmma": _wgmma("wgmma"), "wgmma_bf16": _wgmma("wgmma_bf16"),
}

#: The checked forms by the names the rewritten kernel calls them (its extra globals).
TC_HELPERS: dict[str, Callable[..., None]] = {helper_name(name): form for name, form in _FORMS.items()}
