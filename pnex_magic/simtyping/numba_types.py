"""Numba-CUDA's typing, asked one operation at a time.

The typed rewrite (:mod:`.statements`, :mod:`.expressions`, :mod:`.calls`) walks a
kernel's syntax tree and asks Numba-CUDA's own typing context what each operation
gives: ``resolve_function_type(operator.add, (float32, float64))`` is the signature
Numba compiles (its arguments are what the operands are converted to, its return
type the result's type), ``unify_pairs`` what a variable is after two paths join,
``resolve_getattr`` what ``cuda.threadIdx.x`` or ``a.shape`` is.  Nothing here
decides a type itself: the rules are Numba's, read from the same context the GPU
compile uses (``numba.cuda.descriptor.cuda_target``).

Also here: the NumPy dtype a Numba scalar type is held in at run time
(:func:`runtime_dtype`; bfloat16, which NumPy lacks, is held in float32), and the
typing of a Python value read as a global (:func:`typeof_value`, as Numba's
``typeof_global``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types as pytypes
from typing import Any

import numpy as np

from .. import random as kernel_random
from .. import vector
from ..numbadriver import target_device
from ..tc import lowering as tc_lowering

__all__ = [
    "nb", "context", "refresh", "typing_lock", "is_scalar", "is_float", "is_integer", "is_bf16", "runtime_dtype", "unliteral",
    "literal_value", "typeof_value", "unify", "resolve_call", "resolve_value", "TypingFailure",
]

_LOCK = threading.RLock()


class TypingFailure(Exception):
    """Numba's typing context found no signature (the message says for what)."""


@functools.lru_cache(maxsize=1)
def nb() -> Any:
    """``numba.cuda.types`` (imported on first use)."""
    from numba.cuda import types

    return types


def context() -> Any:
    """Numba-CUDA's typing context (:func:`refresh` installs what was registered)."""
    from numba.cuda.descriptor import cuda_target

    return cuda_target.typing_context


def refresh() -> None:
    """Install every typing registry, and any registered since (pnex's checked-access
    helpers, ``pnex.random``, ``pnex.tc``): about 2 s the first time in a process, as for a GPU
    compile; nothing much after."""
    vector.register_cuda()  # pnex.vload / pnex.vstore in kernels
    kernel_random.register_cuda()  # pnex.random in kernels
    tc_lowering.register_cuda()  # pnex.tc (tensor cores) in kernels
    with typing_lock():
        context().refresh()


@contextlib.contextmanager
def typing_lock():
    """Serialises typing: numba-cuda compiles the operators of float16 and bfloat16
    while it types them, for the current device, which a CPU machine has none of:
    pnex's compile stage stands a target device in (``numbadriver.target_device``); and
    the ``cuda`` target is the current one, as while Numba-CUDA compiles."""
    from numba.cuda.utils import numba_target_override

    with _LOCK, target_device((7, 5)), numba_target_override():
        yield


def is_scalar(ty: Any) -> bool:
    """A number or a bool (literals included): what the rewrite converts."""
    t = nb()
    ty = unliteral(ty)
    return isinstance(ty, (t.Integer, t.Float, t.Boolean)) or is_bf16(ty)


def is_float(ty: Any) -> bool:
    t = nb()
    return isinstance(unliteral(ty), t.Float) or is_bf16(ty)


def is_integer(ty: Any) -> bool:
    return isinstance(unliteral(ty), nb().Integer)


def is_bf16(ty: Any) -> bool:
    return type(ty).__name__ == "Bfloat16"


def unliteral(ty: Any) -> Any:
    return nb().unliteral(ty)


def literal_value(ty: Any, default: Any = None) -> Any:
    """The value of a literal type (``Literal[int](3)`` -> 3), else ``default``."""
    return getattr(ty, "literal_value", default) if isinstance(ty, nb().Literal) else default


def runtime_dtype(ty: Any) -> np.dtype:
    """The NumPy dtype a value of scalar type ``ty`` is held in while the simulator
    runs: its own, or float32 for bfloat16 (its values, rounded to bfloat16)."""
    if is_bf16(ty):
        return np.dtype(np.float32)
    from numba.cuda.np.numpy_support import as_dtype

    return as_dtype(unliteral(ty))


def unify(*tys: Any) -> Any | None:
    """Numba's type of a variable that one of ``tys`` reaches (a phi node): ``None``
    where Numba cannot unify them."""
    if len(tys) == 1:
        return tys[0]
    with typing_lock():
        try:
            return context().unify_types(*tys)
        except RecursionError:  # numba-cuda 0.30's bfloat16.unify(float32) recurses forever
            return None


def resolve_value(value: Any) -> Any:
    """Numba's type of ``value`` used as a constant (``ValueError`` where it has none)."""
    with typing_lock():
        return context().resolve_value_type(value)


def typeof_value(value: Any) -> Any:
    """The type Numba gives a global or closure value the kernel reads (its
    ``typeof_global``): integers and bools as literals, tuples of them as tuples of
    literals, a NumPy array as a read-only array, a module as a module."""
    t = nb()
    lit = t.maybe_literal(value)
    if lit is not None and not isinstance(value, (str, bytes)):
        return lit
    with typing_lock():
        ctx = context()
        try:
            ty = ctx.resolve_value_type(value)
        except (ValueError, TypeError) as exc:
            if isinstance(value, pytypes.ModuleType):
                return t.Module(value)
            raise TypingFailure(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if isinstance(ty, t.Array) and not hasattr(value, "__cuda_array_interface__"):
        ty = ty.copy(readonly=True)
    if isinstance(ty, t.BaseAnonymousTuple):
        literaled = [t.maybe_literal(x) for x in value]
        if all(literaled):
            ty = t.Tuple(literaled)
    return ty


def resolve_call(fnty: Any, args: tuple, kws: dict | None = None) -> Any:
    """The signature Numba resolves for calling ``fnty`` (a Numba function type, or a
    Python callable such as ``operator.add`` or ``math.sqrt``) with arguments of
    types ``args``; :class:`TypingFailure` where there is none."""
    kws = kws or {}
    with typing_lock():
        ctx = context()
        if not isinstance(fnty, (nb().Type, str)):  # a string: an intrinsic by its key ("getiter")
            fnty = ctx.resolve_value_type(fnty)
        if isinstance(fnty, nb().TypeRef):
            fnty = fnty.instance_type
        try:
            sig = ctx.resolve_function_type(fnty, tuple(args), kws)
        except Exception as exc:  # Numba's typing errors come in many classes
            raise TypingFailure(_first_line(exc)) from None
    if sig is None:
        shown = ", ".join(str(a) for a in args)
        raise TypingFailure(f"no signature of {fnty} for ({shown})")
    return sig


def resolve_getattr(ty: Any, attr: str) -> Any | None:
    with typing_lock():
        try:
            return context().resolve_getattr(ty, attr)
        except Exception as exc:  # noqa: BLE001 - a template's own error: no such attribute here
            raise TypingFailure(_first_line(exc)) from None


def resolve_static_getitem(ty: Any, index: Any) -> Any | None:
    with typing_lock():
        sig = context().resolve_static_getitem(value=ty, index=index)
    return None if sig is None else sig.return_type


def resolve_setitem(target: Any, index: Any, value: Any, static: Any = None) -> Any:
    """The signature of ``target[index] = value`` (``static``: a constant index, as
    Numba tries first for records and tuples)."""
    with typing_lock():
        ctx = context()
        sig = None
        if static is not None:
            sig = ctx.resolve_static_setitem(target, static, value)
        if sig is None:
            try:
                sig = ctx.resolve_setitem(target, index, value)
            except Exception as exc:  # noqa: BLE001
                raise TypingFailure(_first_line(exc)) from None
    if sig is None:
        raise TypingFailure(f"cannot store {value} into {target} at index {index}")
    return sig


def resolve_setattr(target: Any, attr: str, value: Any) -> Any:
    with typing_lock():
        sig = context().resolve_setattr(target, attr, value)
    if sig is None:
        raise TypingFailure(f"cannot set attribute {attr!r} of {target} to {value}")
    return sig


def _first_line(exc: BaseException) -> str:
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("-", "*"))]
    return " ".join(lines[:2])[:400] if lines else type(exc).__name__
