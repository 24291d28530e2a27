"""What the typed kernel calls while the simulator runs it: conversions and operations
computed as Numba-CUDA computes them on the GPU, on NumPy scalars.

Each function here is made for one type (or pair of types) when the kernel is
rewritten, so that the call the kernel makes does no type dispatch of its own.
What each mirrors, in numba-cuda 0.30 and the PTX NVVM emits for it:

* conversions (:func:`converter`): float to integer truncates toward zero and
  saturates, NaN gives 0 (PTX ``cvt.rzi``; NumPy's own conversion is the x86 one,
  ``INT_MIN``); integer to integer wraps; to floating point rounds to nearest even;
  to bfloat16 rounds once, from the exact value (:func:`round_bf16`);
* integer ``//`` and ``%`` (:func:`int_floordiv`, :func:`int_mod`): floor division,
  0 for a zero divisor and for ``MIN // -1`` (Numba's ``int_divmod_signed``);
* float ``%`` and ``//`` (:func:`float_mod`, :func:`float_floordiv`): CPython's
  ``divmod`` algorithm over the remainder NVVM computes for LLVM's ``frem``,
  ``copysign(|x| - floor(|x| / |y|) * |y|, x)``, each operation rounded (not C's
  exact ``fmod``: the GPU's differs from it where ``|x / y|`` is large);
* ``**`` with an integer exponent (:func:`static_power`, :func:`int_power`): Numba's
  square-and-multiply, whose roundings differ from ``pow``'s;
* ``min``/``max`` (:func:`minmax`): Python's algorithm, as Numba's ``do_minmax``;
* ``math.*`` (:func:`math_function`): exact operations (``sqrt``, ``floor``, ``fmod``,
  ``ldexp``, ...) computed exactly in the argument's type; ``math.pow`` of an int32
  exponent as libdevice's ``powi`` (square-and-multiply); transcendental ones
  through the C library's double-precision function (Python's ``math``, which calls
  it, except ``gamma``/``lgamma``, CPython's own), rounded once to the result type:
  within an ulp or so of the correctly rounded value, where libdevice's are within
  its documented bounds (2 ulp for most; see :data:`TRANSCENDENTAL`);
* ``cuda.fma`` and ``cuda.fp16.hfma``: one rounding of the exact ``a * b + c``
  (:func:`fma`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ..dtypes import round_bf16

__all__ = [
    "converter", "round_bf16", "int_floordiv", "int_mod", "float_mod", "float_floordiv", "static_power", "int_power",
    "float_power", "minmax", "math_function", "fma", "bit_function", "TRANSCENDENTAL", "EXACT_MATH", "rint_to_int",
    "round_ndigits", "half_minmax", "half_function", "python_result", "make", "unwrap",
]

F16, F32, F64 = np.float16, np.float32, np.float64

#: math.* functions libdevice computes to within a bound (ulp) of the correctly
#: rounded result, float32 / float64 (CUDA Math API, "Mathematical functions"
#: appendix of the CUDA C++ Programming Guide); the simulator's are within 1 ulp.
#: One is measured, not documented: float64 ``lgamma`` was 6-9 ulp from the true
#: value (mpmath) at x = 3.3743 on an H200 with CUDA 13's libdevice (2026-11-28,
#: tests/test_simulator_gpu.py), past the guide's 4 ulp for positive x; 10 here.
TRANSCENDENTAL: dict[str, tuple[int, int]] = {
    "exp": (2, 1), "exp2": (2, 1), "expm1": (1, 1), "log": (1, 1), "log2": (1, 1), "log10": (2, 1), "log1p": (1, 1),
    "sin": (2, 2), "cos": (2, 2), "tan": (4, 2), "asin": (2, 2), "acos": (2, 2), "atan": (2, 2), "atan2": (3, 2),
    "sinh": (3, 2), "cosh": (2, 1), "tanh": (2, 1), "asinh": (3, 3), "acosh": (4, 3), "atanh": (3, 2),
    "erf": (2, 2), "erfc": (4, 5), "gamma": (5, 10), "lgamma": (6, 10), "hypot": (3, 2), "pow": (4, 2), "cbrt": (1, 1),
}
#: math.* functions the GPU computes exactly (one IEEE rounding or none).
EXACT_MATH = frozenset({
    "sqrt", "fabs", "floor", "ceil", "trunc", "copysign", "fmod", "remainder", "nextafter", "ldexp", "frexp", "modf",
    "isnan", "isinf", "isfinite", "radians", "degrees",
})


# ----------------------------------------------------------------------------- conversions


def _float_to_int(dtype: np.dtype) -> Callable[[Any], Any]:
    """PTX ``cvt.rzi``: toward zero, saturating, NaN to 0."""
    make = dtype.type
    info = np.iinfo(dtype)
    lo, hi = float(info.min), float(info.max)  # hi rounds up to a power of two: >= is saturation
    top, bottom, zero = make(info.max), make(info.min), make(0)

    def convert(v: Any) -> Any:
        f = float(v)
        if f != f:
            return zero
        if f >= hi:
            return top
        if f <= lo:
            return bottom
        return make(int(f))

    return convert


@functools.lru_cache(maxsize=None)
def converter(target: str, source: str, weak: bool) -> Callable[[Any], Any]:
    """The conversion of a value of Numba scalar type named ``source`` (held as a
    NumPy scalar of its own dtype, or where ``weak`` as a Python number of that
    value) to type ``target``, as Numba-CUDA converts: names are ``float32``,
    ``int64``, ``bool``, ``bfloat16`` and so on."""
    src_float = source.startswith(("float", "bfloat"))
    through = None if not weak or src_float or source == "bool" else np.dtype(source).type
    if through is not None and target == "float64" and np.dtype(source).kind == "i":
        return F64  # a Python int in int64's range: NumPy rounds it to nearest, as sitofp does
    if target == "bfloat16":
        if through is not None:
            return lambda v: round_bf16(int(v))
        return round_bf16
    if target == "bool":
        return np.bool_
    dtype = np.dtype(target)
    make = dtype.type
    if dtype.kind in "iu" and src_float:
        return _float_to_int(dtype)
    if through is not None and through is not make:
        return lambda v: make(through(v))
    return make


def rint_to_int(dtype: str) -> Callable[[Any], Any]:
    """``round(x)`` of a float: ``llvm.rint`` (ties to even), then ``fptosi``."""
    to_int = _float_to_int(np.dtype(dtype))
    return lambda v: to_int(np.rint(v))


# ----------------------------------------------------------------------------- arithmetic


def int_floordiv(dtype: str) -> Callable[[Any, Any], Any]:
    zero = np.dtype(dtype).type(0)
    if np.dtype(dtype).kind == "u":
        return lambda a, b: zero if b == 0 else a // b
    low = np.iinfo(np.dtype(dtype)).min

    def floordiv(a: Any, b: Any) -> Any:
        if b == 0 or (b == -1 and a == low):
            return zero
        return a // b

    return floordiv


def int_mod(dtype: str) -> Callable[[Any, Any], Any]:
    zero = np.dtype(dtype).type(0)
    if np.dtype(dtype).kind == "u":
        return lambda a, b: zero if b == 0 else a % b
    low = np.iinfo(np.dtype(dtype)).min

    def mod(a: Any, b: Any) -> Any:
        if b == 0 or (b == -1 and a == low):
            return zero
        return a % b

    return mod


def _frem(x: Any, y: Any) -> Any:
    """NVVM's ``frem``: ``copysign(|x| - floor(|x| / |y|) * |y|, x)`` (sign by ``x < 0``)."""
    ax, ay = abs(x), abs(y)
    t = ax - np.floor(ax / ay) * ay
    return -t if x < 0 else t


def float_mod(dtype: str) -> Callable[[Any, Any], Any]:
    make = np.dtype(dtype).type
    zero, negzero = make(0.0), make(-0.0)

    def mod(x: Any, y: Any) -> Any:
        m = _frem(x, y)
        if y == 0:
            return m
        if m != 0 or m != m:
            if (y < 0) != (m < 0):
                m = y + m
        else:
            m = negzero if y < 0 else zero
        return m

    return mod


def float_floordiv(dtype: str) -> Callable[[Any, Any], Any]:
    make = np.dtype(dtype).type
    one, half, minus_one = make(1.0), make(0.5), make(-1.0)

    def floordiv(x: Any, y: Any) -> Any:
        if y == 0:
            return x / y
        m = _frem(x, y)
        div = (x - m) / y
        if (m != 0 or m != m) and ((y < 0) != (m < 0)):
            div = div + minus_one
        if div == 0 or div != div:
            return x * (div * div) / y
        fl = np.floor(div)
        if div - fl > half:
            fl = fl + one
        return fl

    return floordiv


def static_power(dtype: str, exponent: int) -> Callable[[Any], Any]:
    """``x ** k`` for a literal integer ``k`` (Numba's ``static_power_impl``)."""
    make = np.dtype(dtype).type
    is_int = np.dtype(dtype).kind in "iu"
    invert = exponent < 0
    k = abs(exponent)

    def power(x: Any) -> Any:
        val, res, e = x, make(1), k
        while e != 0:
            if e & 1:
                res = res * val
            e >>= 1
            if e:
                val = val * val
        if invert:
            if is_int:
                if res == 0:
                    return make(np.iinfo(np.dtype(dtype)).min)
                return res if res in (1, -1) else make(0)
            return make(F64(1.0) / F64(res))  # Numba's 1.0 / a: a float64 division, then converted
        return res

    return power


def int_power(dtype: str) -> Callable[[Any, Any], Any]:
    """``x ** n`` for an integer variable ``n`` (Numba's ``int_power_impl``), and
    ``math.pow(x, n)`` for an int32 ``n`` (libdevice's ``powi``: the same
    square-and-multiply, each product rounded)."""
    make = np.dtype(dtype).type
    is_int = np.dtype(dtype).kind in "iu"
    low = make(np.iinfo(np.dtype(dtype)).min) if is_int else None

    def power(a: Any, b: Any) -> Any:
        r = make(1)
        a = make(a)
        if b < 0:
            invert = True
            exp = -int(b)
            if is_int:
                if a == 0:
                    return low
                if a != 1 and a != -1:
                    return make(0)
        else:
            invert = False
            exp = int(b)
        if exp > 0x10000:  # Numba's cutoff: math.pow (libdevice's pow), then converted
            return converter(dtype, "float64", False)(math_function("pow", "float64")(F64(a), F64(b)))
        while exp != 0:
            if exp & 1:
                r = r * a
            exp >>= 1
            a = a * a
        if invert:
            return make(F64(1.0) / F64(r))  # Numba's 1.0 / r: a float64 division, then converted
        return r

    return power


def float_power(dtype: str) -> Callable[[Any, Any], Any]:
    """``x ** y`` for floats: libdevice's ``pow``, here the C library's in double precision."""
    return math_function("pow", dtype)


def minmax(which: str, steps: Sequence[tuple[Callable | None, Callable | None]]) -> Callable[..., Any]:
    """Numba's ``max(a, b, ...)`` (``which``: ``"max"`` or ``"min"``): left to right,
    the running value and the next one converted to their unified type (``steps``:
    the two conversions of each step, ``None`` for none), the next one taken where
    it is strictly greater (smaller)."""
    greater = which == "max"

    def pick(*values: Any) -> Any:
        acc = values[0]
        for (to_acc, to_v), v in zip(steps, values[1:]):
            if to_acc is not None:
                acc = to_acc(acc)
            if to_v is not None:
                v = to_v(v)
            if (v > acc) if greater else (v < acc):
                acc = v
        return acc

    return pick


# ----------------------------------------------------------------------------- math.*


def _guarded(fn: Callable[..., float], fallback: Callable[..., Any], make: Any = None) -> Callable[..., Any]:
    """``fn`` of the C library (through Python's ``math``), whose range and domain
    errors become what C returns (inf, nan): NumPy's function, computed again;
    ``make``: the result converted to it (else a Python float)."""
    def again(*args: Any) -> float:
        with np.errstate(all="ignore"):
            return float(fallback(*(F64(a) for a in args)))

    if make is None:
        def call(*args: Any) -> float:
            try:
                return fn(*args)
            except (OverflowError, ValueError):
                return again(*args)
    else:
        def call(*args: Any) -> Any:
            try:
                return make(fn(*args))
            except (OverflowError, ValueError):
                return make(again(*args))
    return call


def _lgamma(x: float) -> float:
    return math.lgamma(x)


_DOUBLE: dict[str, tuple[Callable[..., float], Callable[..., Any]]] = {
    "exp": (math.exp, np.exp), "exp2": (lambda x: 2.0**x, np.exp2), "expm1": (math.expm1, np.expm1),
    "log": (math.log, np.log), "log2": (math.log2, np.log2), "log10": (math.log10, np.log10),
    "log1p": (math.log1p, np.log1p), "sin": (math.sin, np.sin), "cos": (math.cos, np.cos), "tan": (math.tan, np.tan),
    "asin": (math.asin, np.arcsin), "acos": (math.acos, np.arccos), "atan": (math.atan, np.arctan),
    "sinh": (math.sinh, np.sinh), "cosh": (math.cosh, np.cosh), "tanh": (math.tanh, np.tanh),
    "asinh": (math.asinh, np.arcsinh), "acosh": (math.acosh, np.arccosh), "atanh": (math.atanh, np.arctanh),
    "erf": (math.erf, lambda x: np.float64(math.erf(x))), "erfc": (math.erfc, lambda x: np.float64(math.erfc(x))),
    "gamma": (math.gamma, lambda x: np.copysign(np.inf, x) if x == 0 or x > 171 else np.float64(np.nan)),
    "lgamma": (_lgamma, lambda x: np.float64(np.inf)),
    "atan2": (math.atan2, np.arctan2), "hypot": (lambda x, y: float(np.hypot(x, y)), np.hypot),  # C's hypot
    "pow": (math.pow, np.power),
    "cbrt": (getattr(math, "cbrt", None) or np.cbrt, np.cbrt),
}
if hasattr(math, "exp2"):
    _DOUBLE["exp2"] = (math.exp2, np.exp2)


def _exact(name: str, make: type) -> Callable[..., Any] | None:
    if name == "sqrt":  # the double square root, rounded once: exact for float32 and float16 too
        return _guarded(math.sqrt, np.sqrt, None if make is F64 else make)
    if name == "fabs":
        return abs
    if name in ("floor", "ceil", "trunc", "copysign", "fmod", "nextafter", "ldexp", "frexp", "modf"):
        return getattr(np, name)
    if name in ("isnan", "isinf", "isfinite"):
        return getattr(np, name)
    if name == "remainder":
        return lambda x, y: make(math.remainder(float(x), float(y))) if math.isfinite(float(x)) and float(y) != 0 \
            else make(np.nan)
    if name in ("radians", "degrees"):
        coef = make(math.pi / 180 if name == "radians" else 180 / math.pi)
        return lambda x: x * coef
    return None


def python_result(name: str, dtype: str) -> bool:
    """Whether :func:`math_function` gives a Python float (a float64 from the C
    library: the simulator holds float64 values either way) rather than a NumPy scalar."""
    return dtype == "float64" and (name in _DOUBLE or name == "sqrt")


@functools.lru_cache(maxsize=None)
def math_function(name: str, dtype: str) -> Callable[..., Any]:
    """``math.<name>`` for arguments of dtype ``dtype`` (converted to the signature
    Numba resolved; a float64 may be a Python float), returning that dtype (a Python
    float for float64 where :func:`python_result` says so): exact functions computed
    in it, transcendental ones in double precision and rounded once."""
    make = np.dtype(dtype).type
    exact = _exact(name, make)
    if exact is not None:
        return exact
    fn, fallback = _DOUBLE[name]
    return _guarded(fn, fallback, None if make is F64 else make)


# ----------------------------------------------------------------------------- fused multiply-add


_FORMATS = {"float16": (11, -14, 15), "float32": (24, -126, 127), "float64": (53, -1022, 1023)}


def _round_exact(q: Fraction, dtype: str) -> Any:
    """The exact rational ``q`` rounded once (to nearest, ties to even) to ``dtype``."""
    precision, emin, emax = _FORMATS[dtype]
    make = np.dtype(dtype).type
    if q == 0:
        return make(0.0)
    negative = q < 0
    a = -q if negative else q
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2**(e - 1) < a < 2**(e + 1)
    if a < Fraction(2) ** e:
        e -= 1  # now 2**e <= a < 2**(e + 1)
    e = max(e, emin)
    shift = precision - 1 - e
    scaled = a * (Fraction(2) ** shift)
    n, rest = divmod(scaled.numerator, scaled.denominator)
    twice = 2 * rest
    if twice > scaled.denominator or (twice == scaled.denominator and n % 2 == 1):
        n += 1
    limit = emax + 1 + shift  # 2**(emax + 1) is n == 2**limit
    value = math.inf if limit <= 0 or n >= (1 << limit) else math.ldexp(n, -shift)
    return make(-value if negative else value)


def fma(dtype: str) -> Callable[[Any, Any, Any], Any]:
    """``a * b + c`` with one rounding to ``dtype`` (PTX ``fma.rn``)."""
    make = np.dtype(dtype).type

    def fused(a: Any, b: Any, c: Any) -> Any:
        fa, fb, fc = float(a), float(b), float(c)
        if not (math.isfinite(fa) and math.isfinite(fb) and math.isfinite(fc)):
            with np.errstate(all="ignore"):
                return make(F64(fa) * F64(fb) + F64(fc))
        exact = Fraction(fa) * Fraction(fb) + Fraction(fc)
        if exact == 0:  # IEEE's sign of an exact zero sum, rounding to nearest: -0 only for -0 + -0
            if (fa == 0 or fb == 0) and fc == 0:
                product_negative = math.copysign(1.0, fa) * math.copysign(1.0, fb) < 0
                return make(-0.0) if product_negative and math.copysign(1.0, fc) < 0 else make(0.0)
            return make(0.0)
        return _round_exact(exact, dtype)

    return fused


# ----------------------------------------------------------------------------- bit intrinsics


def bit_function(name: str, bits: int, result: str) -> Callable[[Any], Any]:
    """``cuda.popc``, ``cuda.clz``, ``cuda.ffs``, ``cuda.brev`` on the ``bits``-wide
    two's complement of the argument, as the PTX instructions compute them."""
    mask = (1 << bits) - 1
    make = np.dtype(result).type

    def word(v: Any) -> int:
        return int(v) & mask

    if name == "popc":
        return lambda v: make(bin(word(v)).count("1"))
    if name == "clz":
        return lambda v: make(bits - word(v).bit_length())
    if name == "ffs":
        return lambda v: make((word(v) & -word(v)).bit_length())
    if name == "brev":
        return lambda v: make(int(format(word(v), f"0{bits}b")[::-1], 2))
    raise KeyError(name)


def round_ndigits(dtype: str) -> Callable[[Any, Any], Any]:
    """``round(x, n)`` of a float (Numba's ``round_ndigits``: the scaled value rounded
    in ``x``'s own type by ``llvm.rint``, the powers of ten square-and-multiplied)."""
    make = np.dtype(dtype).type
    power = int_power("float64")
    ten, e22, one = F64(10.0), F64(1e22), F64(1.0)

    def rnd(x: Any, ndigits: Any) -> Any:
        if np.isinf(x) or np.isnan(x):
            return x
        n = int(ndigits)
        with np.errstate(all="ignore"):
            if n >= 0:
                pow1, pow2 = (power(ten, n - 22), e22) if n > 22 else (power(ten, n), one)
                y = (F64(x) * pow1) * pow2
                if np.isinf(y):
                    return x
                return make((F64(np.rint(make(y))) / pow2) / pow1)
            pow1 = power(ten, -n)
            return make(F64(np.rint(make(F64(x) / pow1))) * pow1)

    return rnd


def half_minmax(which: str) -> Callable[[Any, Any], Any]:
    """``cuda.fp16.hmax``/``hmin``: a NaN operand loses to the other (both NaN: NaN)."""
    def pick(a: Any, b: Any) -> Any:
        if a != a:
            return b
        if b != b:
            return a
        return a if ((a >= b) if which == "max" else (a <= b)) else b

    return pick


def half_function(name: str) -> Callable[..., Any]:
    """A ``cuda.fp16`` function of float16 arguments not among ``math``'s."""
    if name == "exp10":
        return _guarded(lambda v: 10.0 ** float(v), lambda v: np.power(10.0, v), F16)
    if name == "rsqrt":
        return lambda x: F16(1.0 / math.sqrt(float(x))) if float(x) > 0 else F16(np.float32(1.0) / np.sqrt(F32(x)))
    if name == "rcp":
        return lambda x: F16(np.float32(1.0) / F32(x))
    if name in ("ceil", "floor", "trunc", "rint"):
        return getattr(np, name)
    return math_function(name, "float16")


# ----------------------------------------------------------------------------- by key


def unwrap(array: Any) -> Any:
    """The NumPy array of a simulator's array argument (itself for anything else): its
    wrapper's indexing costs microseconds a call, NumPy's a tenth of that."""
    item = getattr(array, "_item", None) if type(array).__name__ == "FakeWithinKernelCUDAArray" else None
    return getattr(item, "_ary", array) if item is not None else array


def _tuple_converter(converters: tuple) -> Callable[[tuple], tuple]:
    def convert(values: tuple) -> tuple:
        return tuple(v if c is None else c(v) for c, v in zip(converters, values))

    return convert


def make(key: tuple) -> Any:
    """The helper a rewritten kernel binds to a global name, made from its key (what a
    stored simulated form keeps instead of the object): ``("convert", to, from,
    weak)``, ``("math", name, dtype)``, ``("const", dtype, hex)``, ...."""
    kind, args = key[0], key[1:]
    if kind == "convert":
        return converter(*args)
    if kind in ("floordiv", "mod"):
        integer = np.dtype(args[0]).kind in "iu"
        return {("floordiv", True): int_floordiv, ("mod", True): int_mod, ("floordiv", False): float_floordiv,
                ("mod", False): float_mod}[(kind, integer)](args[0])
    if kind == "const":
        return np.frombuffer(bytes.fromhex(args[1]), dtype=np.dtype(args[0]))[0]
    if kind == "minmax":
        steps = tuple(tuple(None if k is None else make(k) for k in step) for step in args[1])
        return minmax(args[0], steps)
    if kind == "tuple":
        return _tuple_converter(tuple(None if k is None else make(k) for k in args[0]))
    if kind == "builtin":
        import builtins

        return getattr(builtins, args[0])
    makers = {"ipow": int_power, "fpow": float_power, "rint": rint_to_int, "round_ndigits": round_ndigits,
              "math": math_function, "fma": fma, "bits": bit_function, "hminmax": half_minmax,
              "half": half_function, "bf16": lambda: round_bf16, "unwrap": lambda: unwrap}
    return makers[kind](*args)
