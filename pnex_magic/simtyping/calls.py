"""Typing and rewriting a kernel's calls.

Every call asks Numba for its signature; what the rewritten kernel calls then
depends on the callee:

* a ``@cuda.jit(device=True)`` function: its own typed rewrite for the argument
  types of this call (:meth:`~.kernel.Build.device`), arguments converted to them;
* ``math.*``, ``cuda.fma``, ``cuda.cbrt``, the bit intrinsics, ``cuda.fp16.*``,
  ``min``/``max``, ``round``, conversions (``float(x)``, ``np.float32(x)``,
  ``uint64(x)``): a :mod:`.runtime` helper for that signature;
* ``cuda.atomic.*`` and stores through pnex's checked-access helpers: the
  simulator's own, with the value converted to the array's type first;
* what only moves values or threads (``cuda.grid``, ``cuda.syncthreads``,
  ``cuda.shared.array``, ``range``, ``len``, ``print``): unchanged; a number it
  returns is a Python number of the type Numba gives it;
* other functions Numba has an implementation of (``pnex.random.*``, a
  ``numba.extending.register_jitable`` function): their Python form, unchanged, its
  result held as a value of the type Numba gives it.
"""

from __future__ import annotations

import ast
import builtins
import operator
from typing import Any

import numpy as np

from . import numba_types as T
from . import runtime
from .values import SimulationError, Val, type_name

__all__ = ["Calls"]

_BUILTINS = {
    builtins.abs: "b_abs", builtins.min: "b_minmax", builtins.max: "b_minmax", builtins.int: "b_convert",
    builtins.float: "b_convert", builtins.bool: "b_convert", builtins.round: "b_round", builtins.len: "b_unchanged",
    builtins.range: "b_unchanged", builtins.print: "b_unchanged", builtins.slice: "b_unchanged",
    builtins.enumerate: "b_unchanged", builtins.zip: "b_unchanged", builtins.pow: "b_pow",
}
#: cuda.* calls that move values or threads, or are warp-level (outside the simulator's
#: promise): the simulator's own, unchanged.
_CUDA_UNCHANGED = ("grid", "gridsize", "syncthreads", "syncthreads_count", "syncthreads_and", "syncthreads_or",
                   "syncwarp", "threadfence", "threadfence_block", "threadfence_system", "cg.this_grid",
                   "shared.array", "local.array", "const.array_like", "nanosleep")
_WARP = ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "all_sync", "any_sync", "eq_sync",
         "ballot_sync", "match_any_sync", "match_all_sync", "activemask", "lanemask_lt", "vote_sync_intrinsic")
_HALF_BINARY = {"hadd": ast.Add, "hsub": ast.Sub, "hmul": ast.Mult, "hdiv": ast.Div}
_HALF_COMPARE = {"heq": ast.Eq, "hne": ast.NotEq, "hgt": ast.Gt, "hge": ast.GtE, "hlt": ast.Lt, "hle": ast.LtE}
_UFUNC_MATH = {"sqrt": "sqrt", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
               "log10": "log10", "log1p": "log1p", "sin": "sin", "cos": "cos", "tan": "tan", "arcsin": "asin",
               "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
               "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh", "arctan2": "atan2", "hypot": "hypot",
               "power": "pow", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "fabs": "fabs",
               "copysign": "copysign", "fmod": "fmod", "isnan": "isnan", "isinf": "isinf", "isfinite": "isfinite",
               "cbrt": "cbrt", "deg2rad": "radians", "rad2deg": "degrees", "radians": "radians",
               "degrees": "degrees"}


class Calls:
    """Call typing: mixed into the walker of :mod:`.statements`."""

    em: Any

    def e_Call(self, node: ast.Call, state: dict) -> tuple[ast.expr, Val]:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise SimulationError("a call with *args or **kwargs")
        func_node, f = self.expr(node.func, state)
        args = [self.expr(a, state) for a in node.args]
        kws = {k.arg: self.expr(k.value, state) for k in node.keywords}
        if f.path == "device":
            if kws:
                raise SimulationError("a device function called with keyword arguments")
            return self.device_call(node, f.const, args)
        path = f.path or ""
        if path.startswith("cuda."):
            return self.cuda_call(node, func_node, f, path[5:], args, kws)
        const = f.const
        t = T.nb()
        try:
            handler = _BUILTINS.get(const)
        except TypeError:  # an unhashable callee
            handler = None
        if handler is not None:
            return getattr(self, handler)(node, func_node, f, args, kws)
        if getattr(const, "__module__", None) == "math" and callable(const):
            return self.math_call(node, f, const.__name__, args, kws)
        if isinstance(f.ty, (t.NumberClass, t.TypeRef)) and len(args) == 1 and not kws:
            return self.b_convert(node, func_node, f, args, kws)
        if isinstance(const, np.ufunc) and const.__name__ in _UFUNC_MATH and not kws and all(v.scalar for _, v in args):
            return self.math_call(node, f, _UFUNC_MATH[const.__name__], args, kws)
        name = getattr(const, "__name__", "")
        if name in _CHECKED:
            return self.checked_call(node, func_node, f, name, args)
        if name in ("vload", "vstore") and getattr(const, "__module__", "").endswith("pnex_magic.vector"):
            return self.checked_call(node, func_node, f, "__pnex_" + name, args, offset=-2)
        if isinstance(f.ty, (t.Function, t.BoundFunction, t.Dispatcher)):
            return self.opaque_call(node, func_node, f, args, kws)
        raise SimulationError(f"a call of {getattr(const, '__qualname__', None) or f.ty}")

    # ------------------------------------------------------------------ helpers

    def signature(self, f: Val, args: list, kws: dict) -> Any:
        return T.resolve_call(f.ty, tuple(v.ty for _, v in args), {k: v.ty for k, (_, v) in kws.items()})

    def value_of(self, ty: Any, exact: bool, py: bool = False) -> Val:
        """A result of type ``ty`` (``exact``: held exactly in its type; ``py``: as a
        Python number)."""
        t = T.nb()
        if isinstance(ty, t.BaseTuple):
            return Val(ty, elems=tuple(self.value_of(e, exact, py) for e in ty))
        return Val(ty, exact=exact and T.is_scalar(ty), py=py and T.is_scalar(ty))

    def rebuilt(self, node: ast.Call, func_node: ast.expr, args: list[ast.expr], kws: dict | None = None) -> ast.Call:
        keywords = [ast.keyword(arg=k, value=v) for k, v in (kws or {}).items()]
        return ast.copy_location(ast.Call(func=func_node, args=args, keywords=keywords), node)

    def converted(self, args: list, types: tuple) -> list[ast.expr]:
        return [self.em.convert(n, v, T.unliteral(ty)) if v.scalar and T.is_scalar(ty) else n
                for (n, v), ty in zip(args, types)]

    # ------------------------------------------------------------------ builtins

    def b_unchanged(self, node, func_node, f, args, kws):
        sig = self.signature(f, args, kws)
        new = self.rebuilt(node, func_node, [n for n, _ in args], {k: n for k, (n, _) in kws.items()})
        if f.const is builtins.len and isinstance(args[0][1].ty, T.nb().BaseTuple):
            return new, Val(sig.return_type, const=len(args[0][1].ty), py=True)
        return new, self.value_of(sig.return_type, False, py=f.const is builtins.len)

    def b_abs(self, node, func_node, f, args, kws):
        sig = self.signature(f, args, kws)
        if not T.is_scalar(sig.return_type):
            raise SimulationError(f"abs of {args[0][1].ty}")
        arg = self.converted(args, sig.args)
        return self.rebuilt(node, func_node, arg), Val(sig.return_type, exact=True)

    def b_convert(self, node, func_node, f, args, kws):
        """``int(x)``, ``float(x)``, ``bool(x)``, ``np.float32(x)``, ``uint64(x)``."""
        sig = self.signature(f, args, kws)
        target = sig.return_type
        if not T.is_scalar(target) or len(args) > 1 or kws:
            raise SimulationError(f"a conversion to {target}")
        if not args:
            return self.em.constant(0, target), Val(target, exact=True)
        n, v = args[0]
        if not v.scalar:
            raise SimulationError(f"a conversion of {v.ty} to {target}")
        return self.em.convert(n, v, target) if not (v.exact and T.unliteral(v.ty) == T.unliteral(target)) else n, \
            Val(target, exact=True)

    def b_round(self, node, func_node, f, args, kws):
        sig = self.signature(f, args, kws)
        (n, v), target = args[0], sig.return_type
        if len(args) == 1:
            if T.is_integer(v.ty):
                return self.em.convert(n, v, target), Val(target, exact=True)
            arg = self.converted(args, sig.args)
            name = type_name(target)
            helper = self.em.helper(("rint", name), "round")
            return self.em.call(helper, arg, node), Val(target, exact=True)
        if not T.is_float(sig.args[0]) or T.is_bf16(sig.args[0]):
            raise SimulationError(f"round of {v.ty}")
        x = self.em.convert(n, v, T.unliteral(sig.args[0]))
        name = type_name(sig.args[0])
        helper = self.em.helper(("round_ndigits", name), "round_ndigits")
        return self.em.call(helper, [x, args[1][0]], node), Val(target, exact=True)

    def b_pow(self, node, func_node, f, args, kws):
        if len(args) != 2 or kws:
            raise SimulationError("pow() with a modulus")
        sig = T.resolve_call(operator.pow, (args[0][1].ty, args[1][1].ty))
        return self.binop(node, operator.pow, sig, args[0][0], args[0][1], args[1][0], args[1][1])

    def b_minmax(self, node, func_node, f, args, kws):
        """Numba's ``do_minmax``: left to right, each pair unified then compared."""
        sig = self.signature(f, args, kws)
        items = list(args)
        if len(items) == 1 and isinstance(items[0][1].ty, T.nb().BaseTuple):
            tup = items[0][1]
            if tup.elems is None:
                raise SimulationError("min/max of a tuple the simulator cannot see into")
            nodes = [n for n, _ in items]
            values = list(tup.elems)
            star = True
        else:
            nodes, values, star = [n for n, _ in items], [v for _, v in items], False
        if not all(v.scalar for v in values):
            raise SimulationError("min/max of values that are not numbers")
        steps, acc = [], values[0]
        for v in values[1:]:
            ty = T.unify(acc.ty, v.ty)
            if ty is None:
                raise T.TypingFailure(f"min/max of {acc.ty} and {v.ty}")
            steps.append((self.em.converter_key(acc, ty), self.em.converter_key(v, ty)))
            exact = acc.exact and T.unliteral(acc.ty) == T.unliteral(ty) or self.em.needs(acc, ty)
            exact = exact and (v.exact and T.unliteral(v.ty) == T.unliteral(ty) or self.em.needs(v, ty))
            acc = Val(T.unliteral(ty), exact=exact)
        result = T.unliteral(sig.return_type)
        if not steps:
            return self.em.convert(nodes[0], values[0], result), Val(result, exact=True)
        which = "max" if f.const is builtins.max else "min"
        helper = self.em.helper(("minmax", which, tuple(steps)), which)
        call_args = [ast.Starred(value=nodes[0], ctx=ast.Load())] if star else nodes
        new = self.em.call(helper, call_args, node)
        return self.em.convert(new, acc, result), Val(result, exact=True)

    # ------------------------------------------------------------------ math

    def math_call(self, node, f, name, args, kws):
        if kws:
            raise SimulationError(f"math.{name} with keyword arguments")
        sig = self.signature(f, args, kws)
        if name not in runtime.EXACT_MATH and name not in runtime.TRANSCENDENTAL:
            raise SimulationError(f"math.{name}")
        result = sig.return_type
        arg_types = list(sig.args)
        float_result = result if T.is_float(result) else (result.types[0] if isinstance(result, T.nb().BaseTuple)
                                                           else None)
        for k, ty in enumerate(arg_types):  # Numba converts integer arguments to the float it returns
            if T.is_integer(ty) and float_result is not None and not (name in ("ldexp", "pow") and k == 1):
                arg_types[k] = float_result
            elif T.is_integer(ty) and name in ("isnan", "isinf", "isfinite"):
                arg_types[k] = T.nb().float64
        dtype = type_name(arg_types[0])
        if name == "pow" and T.is_integer(arg_types[1]):  # libdevice's powi: square-and-multiply, exact products
            converted = self.converted(args, tuple(arg_types))
            helper = self.em.helper(("ipow", dtype), f"powi_{dtype}")
            return self.em.call(helper, converted, node), self.value_of(result, True)
        # A float64 argument may stay a Python number: the C library's function takes its double
        double = dtype == "float64" and name not in ("fabs", "ldexp", "frexp", "modf", "floor", "ceil", "trunc",
                                                     "copysign", "fmod", "nextafter", "radians", "degrees")
        converted = [n if double and v.py and ty == T.nb().float64 else
                     (self.em.convert(n, v, ty) if v.scalar and T.is_scalar(ty) else n)
                     for (n, v), ty in zip(args, arg_types)]
        helper = self.em.helper(("math", name, dtype), f"math_{name}")
        py = runtime.python_result(name, dtype)
        return self.em.call(helper, converted, node), self.value_of(result, not py, py)

    # ------------------------------------------------------------------ cuda.*

    def cuda_call(self, node, func_node, f, name, args, kws):
        sig = self.signature(f, args, kws)
        result = sig.return_type
        plain = [n for n, _ in args]
        if name in _CUDA_UNCHANGED or name in _WARP:
            new = self.rebuilt(node, func_node, plain, {k: n for k, (n, _) in kws.items()})
            return new, self.value_of(result, False, py=name in ("grid", "gridsize"))
        if kws:
            raise SimulationError(f"cuda.{name} with keyword arguments")
        if name.startswith("atomic."):
            first = 1 if name == "atomic.compare_and_swap" else 2
            values = plain[:first] + self.converted(args[first:], sig.args[first:])
            return self.rebuilt(node, func_node, values), Val(result, exact=T.is_scalar(result))
        if name == "selp":
            values = plain[:1] + self.converted(args[1:], sig.args[1:])
            return self.rebuilt(node, func_node, values), Val(result, exact=True)
        converted = self.converted(args, sig.args)
        dtype = type_name(sig.args[0]) if sig.args else ""
        if name == "fma":
            helper = self.em.helper(("fma", dtype), "fma")
        elif name == "cbrt":
            helper = self.em.helper(("math", "cbrt", dtype), "cbrt")
        elif name in ("popc", "brev", "clz", "ffs"):
            bits = T.runtime_dtype(sig.args[0]).itemsize * 8
            res = type_name(result)
            helper = self.em.helper(("bits", name, bits, res), name)
        elif name.startswith("fp16."):
            return self.half_call(node, name[5:], converted, result)
        else:
            raise SimulationError(f"cuda.{name}")
        return self.em.call(helper, converted, node), Val(result, exact=True)

    def half_call(self, node, name, args, result):
        if name in _HALF_BINARY:
            new = ast.BinOp(left=args[0], op=_HALF_BINARY[name](), right=args[1])
        elif name in _HALF_COMPARE:
            new = ast.Compare(left=args[0], ops=[_HALF_COMPARE[name]()], comparators=[args[1]])
            return ast.copy_location(new, node), Val(result)
        elif name == "hneg":
            new = ast.UnaryOp(op=ast.USub(), operand=args[0])
        elif name == "habs":
            new = ast.Call(func=self.em.helper(("builtin", "abs"), "abs"), args=args, keywords=[])
        elif name == "hfma":
            new = ast.Call(func=self.em.helper(("fma", "float16"), "hfma"),
                           args=args, keywords=[])
        elif name in ("hmax", "hmin"):
            which = name[1:]
            new = ast.Call(func=self.em.helper(("hminmax", which), name),
                           args=args, keywords=[])
        elif name.startswith("h") and name[1:] in ("sin", "cos", "log", "log2", "log10", "exp", "exp2", "exp10",
                                                    "sqrt", "rsqrt", "rcp", "ceil", "floor", "trunc", "rint"):
            fn = name[1:]
            new = ast.Call(func=self.em.helper(("half", fn), name),
                           args=args, keywords=[])
        else:
            raise SimulationError(f"cuda.fp16.{name}")
        return ast.copy_location(new, node), Val(result, exact=True)

    # ------------------------------------------------------------------ pnex's helpers and other functions

    def checked_call(self, node, func_node, f, name, args, offset: int = 0):
        """pnex's checked-access helpers (and ``pnex.vload``/``pnex.vstore``, whose
        arguments are the helpers' without the record and site: ``offset`` -2)."""
        sig = self.signature(f, args, {})
        plain = [n for n, _ in args]
        array = args[0][1].ty
        dtype = getattr(array, "dtype", None)
        if name == _CHECKED_STORE:
            plain[4] = self.em.convert(args[4][0], args[4][1], dtype)
        elif name == _CHECKED_VSTORE:
            k = 4 + offset
            plain[k] = self.tuple_to(args[k][0], args[k][1], dtype)
        result = sig.return_type
        exact = name in (_CHECKED_LOAD, _CHECKED_LOAD_ON_CHIP, _CHECKED_ZERO, _CHECKED_VLOAD)
        return self.rebuilt(node, func_node, plain), self.value_of(result, exact)

    def tuple_to(self, node: ast.expr, val: Val, dtype: Any) -> ast.expr:
        """A tuple of values, each converted to ``dtype``."""
        if isinstance(node, ast.Tuple) and val.elems is not None:
            elts = [self.em.convert(n, v, dtype) if v.scalar else n for n, v in zip(node.elts, val.elems)]
            return ast.copy_location(ast.Tuple(elts=elts, ctx=ast.Load()), node)
        elems = val.elems or tuple(Val(e) for e in val.ty)
        keys = tuple(self.em.converter_key(v, dtype) for v in elems)
        return self.em.call(self.em.helper(("tuple", keys), "tuple_to"), [node], node)

    def opaque_call(self, node, func_node, f, args, kws):
        sig = self.signature(f, args, kws)
        new = self.rebuilt(node, func_node, [n for n, _ in args], {k: n for k, (n, _) in kws.items()})
        return new, self.value_of(sig.return_type, False)

    def device_call(self, node, device, args):
        typed, params, result = self.unit.device(node, device, [v for _, v in args])
        callee = self.em.name_of(typed, typed.function.__name__, ("device", *self.unit.identity(typed)))
        converted = [self.em.convert(n, v, p) if v.scalar and T.is_scalar(p) else n
                     for (n, v), p in zip(args, params)]
        return self.em.call(callee, converted, node), result


_CHECKED_LOAD, _CHECKED_LOAD_ON_CHIP, _CHECKED_STORE = "__pnex_load", "__pnex_load_on_chip", "__pnex_store"
_CHECKED_CHECK, _CHECKED_ZERO, _CHECKED_VLOAD, _CHECKED_VSTORE = \
    "__pnex_check", "__pnex_zero", "__pnex_vload", "__pnex_vstore"
_CHECKED = {_CHECKED_LOAD, _CHECKED_LOAD_ON_CHIP, _CHECKED_STORE, _CHECKED_CHECK, _CHECKED_ZERO, _CHECKED_VLOAD,
            _CHECKED_VSTORE}
