"""The reference side of ``tests/random_kernels.py``: math functions for
``numba.njit`` kernels that compute as the CUDA simulator does.

Each ``name(x)`` types as Numba types ``math.name(x)`` (asked of Numba's CPU typing
context), and computes it the same way, except that a float32 result is the C
library's double-precision function rounded once to float32 (what the simulator
computes; Numba's CPU target would call ``expf``, whose last bit may differ).
``power(x, y)`` is ``x ** y`` likewise.  So a random kernel's reference and the
simulator agree bit for bit, transcendental functions included, and what the
comparison tests is everything else: types, promotions, conversions, operations.
"""

from __future__ import annotations

import math
import operator

import numpy as np
from numba import types
from numba.core.registry import cpu_target
from numba.extending import overload

__all__ = ["exp", "expm1", "log", "log1p", "sin", "cos", "tan", "tanh", "erf", "atan2", "hypot", "pow", "power"]


def _signature(fn, args):
    ctx = cpu_target.typing_context
    ctx.refresh()
    return ctx.resolve_function_type(ctx.resolve_value_type(fn), args, {})


def _single(sig) -> bool:
    return sig is not None and sig.return_type == types.float32 and all(a == types.float32 for a in sig.args)


def _unary(name: str):
    fn = getattr(math, name)

    def stub(x):
        raise NotImplementedError

    stub.__name__ = name

    @overload(stub)
    def impl(x):
        if _single(_signature(fn, (x,))):
            return lambda x: np.float32(fn(np.float64(x)))
        return lambda x: fn(x)

    return stub


def _binary(name: str, fn):
    def stub(x, y):
        raise NotImplementedError

    stub.__name__ = name

    @overload(stub)
    def impl(x, y):
        if _single(_signature(fn, (x, y))):
            return lambda x, y: np.float32(fn(np.float64(x), np.float64(y)))
        return lambda x, y: fn(x, y)

    return stub


exp, expm1, log, log1p, sin, cos, tan, tanh, erf = (
    _unary(n) for n in ("exp", "expm1", "log", "log1p", "sin", "cos", "tan", "tanh", "erf"))
atan2 = _binary("atan2", math.atan2)
hypot = _binary("hypot", math.hypot)


def pow(x, y):  # noqa: A001 - math.pow's name
    raise NotImplementedError


@overload(pow)
def _pow(x, y):
    """``math.pow`` as Numba-CUDA types it (asked of its typing context): an int32
    exponent (or a smaller one) is libdevice's ``powi``, square-and-multiply as
    Numba's CPU target computes any integer exponent; every other integer exponent,
    a literal one included, converts to float64 for ``pow`` (``Math_pow`` has no
    other integer case), where Numba's CPU target would still square and multiply."""
    from numba.cuda.descriptor import cuda_target

    ctx = cuda_target.typing_context
    ctx.refresh()
    sig = ctx.resolve_function_type(ctx.resolve_value_type(math.pow), (x, y), {})
    if sig is not None and isinstance(y, types.Integer) and isinstance(sig.args[1], types.Float):
        return lambda x, y: math.pow(np.float64(x), np.float64(y))
    if _single(_signature(math.pow, (x, y))):
        return lambda x, y: np.float32(math.pow(np.float64(x), np.float64(y)))
    return lambda x, y: math.pow(x, y)


power = _binary("power", operator.pow)
