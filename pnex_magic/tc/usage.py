"""Which tensor-core primitives a kernel calls, read off its code and globals without
Numba: the compile stage picks a stand-in architecture that has them (no GPU), and
refuses a GPU that does not, naming the primitive; the derived backward refuses them."""

from __future__ import annotations

import ast
import dis
import types
from collections.abc import Mapping
from typing import Any

from ..lazycuda import is_lazy_cuda
from .api import FUNCTIONS

_PACKAGE = "pnex_magic.tc"

__all__ = ["MIN_ARCH", "ONLY_ARCH", "used_primitives", "required_cc", "arch_problem", "primitive_lines",
           "primitive_sites", "call_primitive", "cluster_rank_problem"]

#: The oldest architecture each primitive runs on.
MIN_ARCH = {
    "mma": (8, 0), "mma_bf16": (8, 0), "mma_tf32": (8, 0),
    "cp_async": (8, 0), "cp_async_commit": (8, 0), "cp_async_wait": (8, 0),
    "ldmatrix": (7, 5), "pack_f16x2": (8, 0), "pack_bf16x2": (8, 0), "unpack_f16x2": (5, 0),
    "unpack_bf16x2": (5, 0), "store_pair": (8, 0), "to_tf32": (8, 0),
    "exp2_approx": (5, 0),
    "wgmma": (9, 0), "wgmma_bf16": (9, 0), "wgmma_fence": (9, 0), "wgmma_commit": (9, 0), "wgmma_wait": (9, 0),
    "fence_async_shared": (9, 0),
    "mbarrier_init": (9, 0), "mbarrier_arrive": (9, 0), "mbarrier_arrive_expect_tx": (9, 0), "mbarrier_wait": (9, 0),
    "tma_load": (9, 0), "tensor_map_acquire": (9, 0), "setmaxnreg_inc": (9, 0), "setmaxnreg_dec": (9, 0),
    "named_barrier": (7, 0),
    "cluster_ctarank": (9, 0), "cluster_sync": (9, 0), "mbarrier_arrive_cluster": (9, 0), "tma_load_multicast": (9, 0),
    "fence_mbarrier_init_cluster": (9, 0),
}


#: Primitives that exist on one architecture only: Hopper's warpgroup MMA is an sm_90a
#: instruction, which Blackwell (sm_100, whose tensor cores take tcgen05) does not have.
ONLY_ARCH = {"wgmma": (9, 0), "wgmma_bf16": (9, 0), "wgmma_fence": (9, 0), "wgmma_commit": (9, 0),
             "wgmma_wait": (9, 0), "setmaxnreg_inc": (9, 0), "setmaxnreg_dec": (9, 0)}

#: Where each family came from, for the messages.
_ORIGIN = {
    "ldmatrix": "ldmatrix came with Turing",
    "pack_f16x2": "cvt.rn.f16x2.f32 came with Ampere",
    "store_pair": "cvt.rn.f16x2.f32 came with Ampere",
    "fence_async_shared": "the async proxy's fence came with Hopper",
    "tma_load": "the Tensor Memory Accelerator (cp.async.bulk.tensor) came with Hopper",
    "tensor_map_acquire": "the Tensor Memory Accelerator (cp.async.bulk.tensor) came with Hopper",
    "setmaxnreg_inc": "setmaxnreg exists on sm_90a: H100, H200",
    "setmaxnreg_dec": "setmaxnreg exists on sm_90a: H100, H200",
    "tma_load_multicast": "the Tensor Memory Accelerator's multicast to a thread-block cluster came with Hopper",
}


def _origin(name: str) -> str:
    if name in _ORIGIN:
        return _ORIGIN[name]
    if "cluster" in name:
        return "thread-block clusters came with Hopper"
    if name.startswith("mbarrier"):
        return "mbarrier transaction counts (expect_tx) came with Hopper"
    if name.startswith("wgmma"):
        return "Hopper's warpgroup MMA, wgmma, exists on sm_90a: H100, H200"
    return "the tensor cores' mma.sync m16n8k16 and cp.async came with Ampere"


def _arch_name(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def _functions(fn: types.FunctionType, seen: set[int]) -> list[types.FunctionType]:
    """``fn`` and the Python functions of the device functions it calls, frozen or not."""
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    found = [fn]
    values = list(getattr(fn, "__globals__", {}).values())
    values += [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
    for value in values:
        if isinstance(value, (types.ModuleType, type)) or is_lazy_cuda(value):
            continue  # (reading an attribute of %%pnex's lazy `cuda` would import Numba)
        inner = getattr(value, "function", None) or getattr(value, "py_func", None)
        if isinstance(inner, types.FunctionType):
            found += _functions(inner, seen)
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _calls(fn: types.FunctionType) -> list[tuple[str, int]]:
    """(primitive, line) for each call of a ``pnex_magic.tc`` function in ``fn``'s code:
    ``tc.mma(...)``, ``pnex.tc.mma(...)`` or ``mma(...)`` imported from it."""
    namespace = dict(fn.__globals__)
    namespace.update(zip(fn.__code__.co_freevars, (c.cell_contents if _filled(c) else None for c in fn.__closure__ or ())))
    # the modules themselves, or the snapshot's frozen copies of them (same names)
    modules = {name: value.__name__ for name, value in namespace.items() if isinstance(value, types.ModuleType)}
    tc_names = {name for name, module in modules.items() if module == _PACKAGE}
    pnex_names = {name for name, module in modules.items() if module == _PACKAGE.rpartition(".")[0]}
    direct = {name: value.__name__ for name, value in namespace.items()
              if callable(value) and FUNCTIONS.get(getattr(value, "__name__", "")) is value}
    found: list[tuple[str, int]] = []
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        previous: list[Any] = []
        line = code.co_firstlineno
        for ins in dis.get_instructions(code):
            position = getattr(ins, "positions", None)
            line = getattr(position, "lineno", None) or line
            name = ins.argval if isinstance(ins.argval, str) else None
            if ins.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME") and name in direct:
                found.append((direct[name], line))
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and name in FUNCTIONS and previous:
                before = previous[-1]
                if before in tc_names or (before == "tc" and len(previous) > 1 and previous[-2] in pnex_names):
                    found.append((name, line))
            if name is not None and ins.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD"):
                previous.append(name)
    return found


def primitive_lines(fn: types.FunctionType) -> list[tuple[str, int]]:
    """(primitive, line) of every tensor-core primitive call in the kernel ``fn`` and the
    device functions it calls (lines of their own files)."""
    return [(name, line) for name, _, line in primitive_sites(fn)]


def primitive_sites(fn: types.FunctionType) -> list[tuple[str, types.FunctionType, int]]:
    """(primitive, function, line) of every tensor-core primitive call in the kernel
    ``fn`` (its own first) and the device functions it calls (lines of their files)."""
    found: list[tuple[str, types.FunctionType, int]] = []
    for f in _functions(fn, set()):
        found += [(name, f, line) for name, line in _calls(f)]
    return found


def call_primitive(func: ast.expr, namespace: Mapping[str, Any]) -> str | None:
    """The primitive a call's function expression names in a kernel whose free names
    ``namespace`` resolves: ``tc.mma`` (``tc`` the module or the snapshot's frozen copy),
    ``pnex.tc.mma``, or a name bound to the function (``mma = tc.mma`` outside the
    kernel); ``None`` for anything else."""
    if isinstance(func, ast.Name):
        value = namespace.get(func.id)
        name = getattr(value, "__name__", None)
        return name if callable(value) and FUNCTIONS.get(name or "") is value else None
    if not isinstance(func, ast.Attribute) or func.attr not in FUNCTIONS:
        return None
    owner = func.value
    if isinstance(owner, ast.Name):
        return func.attr if getattr(namespace.get(owner.id), "__name__", None) == _PACKAGE else None
    if isinstance(owner, ast.Attribute) and owner.attr == "tc" and isinstance(owner.value, ast.Name):
        module = namespace.get(owner.value.id)
        return func.attr if getattr(module, "__name__", None) == _PACKAGE.rpartition(".")[0] else None
    return None


def used_primitives(fn: types.FunctionType) -> set[str]:
    return {name for name, _ in primitive_lines(fn)}


def required_cc(fn: types.FunctionType) -> tuple[tuple[int, int], str] | None:
    """The oldest architecture that runs every primitive ``fn`` calls, and one primitive
    that needs it (``None``: no primitive needs more than any GPU has)."""
    best: tuple[tuple[int, int], str] | None = None
    for name in sorted(used_primitives(fn)):
        cc = MIN_ARCH.get(name)
        if cc is not None and (best is None or cc > best[0]):
            best = (cc, name)
    return best


def arch_problem(fn: types.FunctionType, cc: tuple[int, int]) -> str | None:
    """Why kernel ``fn`` cannot run on architecture ``cc`` (``"calls pnex.tc.mma, which
    needs sm_80 or newer (...)"``), or ``None`` where every primitive it calls exists.
    A primitive of one architecture only (``wgmma``) is named first."""
    used = sorted(used_primitives(fn))
    for name in used:
        only = ONLY_ARCH.get(name)
        if only is not None and cc != only:
            return (f"calls pnex.tc.{name}, which exists on {_arch_name(only)} only ({_origin(name)}; Ada and older "
                    f"GPUs have no wgmma, and Blackwell's sm_100 has tcgen05 instead)")
    for name in used:
        low = MIN_ARCH.get(name)
        if low is not None and cc < low:
            return f"calls pnex.tc.{name}, which needs {_arch_name(low)} or newer ({_origin(name)})"
    return None


#: The cluster primitives' operand that names CTA ranks: (position, keyword, a mask or one rank).
_RANK_OPERANDS = {"tma_load_multicast": (6, "cta_mask", True), "mbarrier_arrive_cluster": (2, "rank", False)}


def _constant(node: ast.expr, namespace: Mapping[str, Any]) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        value = namespace.get(node.id)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def cluster_rank_problem(fn: types.FunctionType, blocks: int) -> str | None:
    """Why a constant CTA rank or multicast mask of the kernel ``fn`` (and the device
    functions it calls) names a block outside its clusters of ``blocks`` blocks (on the
    GPU: undefined behaviour), e.g. ``"line 12: pnex.tc.tma_load_multicast's cta_mask
    0b101 names CTA rank 2..."``; ``None`` when none does (or the source is not here)."""
    import inspect
    import textwrap

    for f in _functions(fn, set()):
        try:
            source = textwrap.dedent(inspect.getsource(f))
            tree = ast.parse(source)
        except (OSError, TypeError, SyntaxError):
            continue
        namespace = dict(f.__globals__)
        namespace.update(zip(f.__code__.co_freevars, (c.cell_contents if _filled(c) else None
                                                      for c in f.__closure__ or ())))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = call_primitive(node.func, namespace)
            if name not in _RANK_OPERANDS:
                continue
            position, keyword, is_mask = _RANK_OPERANDS[name]
            given = node.args[position] if len(node.args) > position else next(
                (k.value for k in node.keywords if k.arg == keyword), None)
            value = None if given is None else _constant(given, namespace)
            if value is None:
                continue
            line = f.__code__.co_firstlineno + node.lineno - 1
            if is_mask and not 0 < value < 1 << 16:
                return (f"line {line}: pnex.tc.{name}'s {keyword} {value:#x} must name 1 to 16 CTA ranks (a 16-bit "
                        f"mask, bit r for rank r, not 0)")
            ranks = [r for r in range(max(value.bit_length(), 1)) if value >> r & 1] if is_mask else [value]
            outside = [r for r in ranks if not 0 <= r < blocks]
            if outside:
                what = f"{keyword} {value:#b}" if is_mask else f"{keyword} {value}"
                return (f"line {line}: pnex.tc.{name}'s {what} names CTA rank {outside[0]}, outside its cluster of "
                        f"{blocks} block{'s' if blocks > 1 else ''} (ranks 0 to {blocks - 1}; cluster_dims sets the "
                        f"shape); on the GPU it would reach no block's shared memory")
    return None
