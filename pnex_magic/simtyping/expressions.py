"""Typing and rewriting a kernel's expressions (calls are :mod:`.calls`').

Each method takes a node and the state (what each local variable holds, a
:class:`~.values.Val`) and returns the rewritten node and its value.  An operation
asks Numba for its signature; its operands are converted to the signature's
argument types where the simulator would otherwise hold them as something else
(:meth:`~.values.Emitter.convert`): a Python literal, a Python integer from a
shape or a thread index, a NumPy scalar of another type.  Then NumPy computes the
operation in exactly Numba's types, and where NumPy's rule for the result's type is
not Numba's, the result is converted, or the operation is a helper of
:mod:`.runtime` that computes it as the GPU does.

Also :meth:`Expressions.static_truth`: the branch conditions Numba decides at
compile time (its ``dead_branch_prune``), whose other branch Numba never types.
"""

from __future__ import annotations

import ast
import builtins
import functools
import itertools
import operator
import types as pytypes
from typing import Any

import numpy as np

from ..lazycuda import is_lazy_cuda
from ..lazycuda import resolve as resolve_lazy_cuda
from ..snapshot import DeviceFunction, FrozenModule
from . import numba_types as T
from .promotion import Promotion, numpy_result
from .values import NOCONST, SimulationError, Val, type_name

__all__ = ["Expressions", "BINARY", "COMPARE"]

BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
    ast.RShift: operator.rshift, ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.BitAnd: operator.and_,
    ast.MatMult: operator.matmul,
}
INPLACE = {
    ast.Add: operator.iadd, ast.Sub: operator.isub, ast.Mult: operator.imul, ast.Div: operator.itruediv,
    ast.FloorDiv: operator.ifloordiv, ast.Mod: operator.imod, ast.Pow: operator.ipow, ast.LShift: operator.ilshift,
    ast.RShift: operator.irshift, ast.BitOr: operator.ior, ast.BitXor: operator.ixor, ast.BitAnd: operator.iand,
}
COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not, ast.In: operator.contains,
    ast.NotIn: operator.contains,
}
_temp_counter = itertools.count()
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}
_PLAIN = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
          operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
          operator.ipow: operator.pow, operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
          operator.ior: operator.or_, operator.ixor: operator.xor, operator.iand: operator.and_}


_FOLDABLE = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.operator, ast.unaryop, ast.expr_context)


def const_of(node: ast.expr) -> Any:
    """The constant CPython's compiler makes of ``node`` (``-1``, ``100000 ** 3``,
    ``(1, 2)``: Numba sees the folded constant), found by compiling it; else NOCONST."""
    if isinstance(node, ast.Constant):
        return node.value
    if not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Tuple)) or \
            not all(isinstance(n, _FOLDABLE) for n in ast.walk(node)):
        return NOCONST
    return _folded(ast.unparse(node))


@functools.lru_cache(maxsize=4096)
def _folded(text: str) -> Any:
    import dis

    try:
        code = compile(text, "<pnex-fold>", "eval")
    except (SyntaxError, ValueError, OverflowError, MemoryError):
        return NOCONST
    ops = [ins for ins in dis.get_instructions(code) if ins.opname not in ("RESUME", "NOP", "CACHE")]
    if len(ops) == 2 and ops[0].opname == "LOAD_CONST" and ops[1].opname == "RETURN_VALUE":
        return ops[0].argval
    if len(ops) == 1 and ops[0].opname == "RETURN_CONST":  # Python 3.12+
        return ops[0].argval
    return NOCONST


class Expressions(Promotion):
    """Expression typing: mixed into the walker of :mod:`.statements`."""

    em: Any  # values.Emitter
    namespace: dict[str, Any]
    local_names: set[str]
    params: dict[str, Val]

    # ------------------------------------------------------------------ entry points

    def expr(self, node: ast.expr, state: dict[str, Val]) -> tuple[ast.expr, Val]:
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Tuple)):
            folded = const_of(node)
            if folded is not NOCONST:  # CPython compiles it as a constant: so does Numba see it
                node = ast.copy_location(ast.Constant(value=folded), node)
        method = getattr(self, "e_" + type(node).__name__, None)
        if method is None:
            raise self.em.fail(node, f"a {type(node).__name__} expression")
        try:
            return method(node, state)
        except T.TypingFailure as exc:
            raise self.em.fail(node, str(exc), typing=True) from None
        except SimulationError as exc:
            raise self.em.fail(node, str(exc)) from None

    def condition(self, node: ast.expr, state: dict[str, Val]) -> tuple[ast.expr, Val]:
        """A value only tested for truth (``if``, ``while``, the test of ``x if c else
        y``): ``and``/``or`` operands keep their own types."""
        if isinstance(node, ast.BoolOp):
            values = [self.condition(v, state) for v in node.values]
            new = ast.copy_location(ast.BoolOp(op=node.op, values=[v[0] for v in values]), node)
            return new, Val(T.nb().boolean)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner, _ = self.condition(node.operand, state)
            return ast.copy_location(ast.UnaryOp(op=node.op, operand=inner), node), Val(T.nb().boolean)
        return self.expr(node, state)

    # ------------------------------------------------------------------ leaves

    def e_Constant(self, node: ast.Constant, state: dict) -> tuple[ast.expr, Val]:
        value = node.value
        t = T.nb()
        if value is None:
            return node, Val(t.none, const=None)
        if isinstance(value, float):
            return node, Val(t.float64, const=value, py=True)
        if isinstance(value, complex):
            return node, Val(t.complex128, const=value)
        if isinstance(value, tuple):
            # A folded tuple of constants: Numba's interpreter builds it from one constant per
            # element (LOAD_CONST), so its elements are literals where Numba has them (an int,
            # a bool: ``cuda.shared.array((32, 16), ...)`` needs them); a tuple nested in it
            # is one constant, typed as a value.
            elems = tuple(self.e_Constant(ast.Constant(value=v), state)[1] if not isinstance(v, tuple) else
                          _tuple_value(v) for v in value)
            tys = [e.ty for e in elems]
            ty = t.UniTuple(tys[0], len(tys)) if tys and all(x == tys[0] for x in tys) else t.Tuple(tys)
            return node, Val(ty, elems=elems, const=value)
        try:
            lit = t.maybe_literal(value)
        except (TypeError, ValueError) as exc:  # an int beyond 64 bits
            raise T.TypingFailure(str(exc)) from None
        if lit is None:
            raise SimulationError(f"the constant {value!r}")
        return node, Val(lit, const=value, py=isinstance(value, (int, bool)))

    def e_Name(self, node: ast.Name, state: dict) -> tuple[ast.expr, Val]:
        found = state.get(node.id)
        if found is not None:
            self.record(node.id, found.ty, read=True)
            return node, found
        if node.id in self.local_names:
            raise SimulationError(f"the variable {node.id!r} is read where it may not have a value yet")
        return node, self.global_val(self.lookup(node, node.id), node.id)

    def lookup(self, node: ast.AST, name: str) -> Any:
        if name in self.namespace:
            return self.namespace[name]
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise self.em.fail(node, f"the name {name!r} is not defined", typing=True)

    def global_val(self, value: Any, name: str = "") -> Val:
        """What a global (or closure) value the kernel reads is, as Numba types it."""
        if is_lazy_cuda(value):
            value = resolve_lazy_cuda(value)
        if isinstance(value, DeviceFunction):
            return Val(None, const=value, path="device")
        if isinstance(value, FrozenModule):
            return Val(None, const=value, path="frozen")
        if isinstance(value, pytypes.ModuleType):
            root = value.__name__
            path = "cuda" if root in ("numba.cuda", "numba_cuda.numba.cuda") else \
                "math" if root == "math" else "np" if root == "numpy" else None
            return Val(T.typeof_value(value), const=value, path=path)
        if isinstance(value, tuple):
            elems = tuple(self.global_val(v) for v in value)
            return Val(T.typeof_value(value), elems=elems, const=value)
        ty = T.typeof_value(value)
        exact = isinstance(value, np.generic) and T.is_scalar(ty) and not T.is_bf16(ty)
        return Val(ty, exact=exact, const=value, py=isinstance(value, (int, float, bool)) and T.is_scalar(ty))

    # ------------------------------------------------------------------ attributes and subscripts

    def e_Attribute(self, node: ast.Attribute, state: dict) -> tuple[ast.expr, Val]:
        base_node, base = self.expr(node.value, state)
        new = ast.copy_location(ast.Attribute(value=base_node, attr=node.attr, ctx=ast.Load()), node)
        attr = node.attr
        if base.path == "frozen":
            if not hasattr(base.const, attr):
                raise self.em.fail(node, f"module {base.const.__name__!r} has no attribute {attr!r}", typing=True)
            return new, self.global_val(getattr(base.const, attr), attr)
        if base.path == "cuda" or (base.path or "").startswith("cuda."):
            ty = T.resolve_getattr(base.ty, attr)
            if ty is None:
                raise T.TypingFailure(f"numba.cuda has no attribute {base.path[5:] + '.' if '.' in base.path else ''}"
                                      f"{attr!r}")
            return new, self._cuda_attribute(ty, f"{base.path}.{attr}")
        if isinstance(base.const, pytypes.ModuleType) or (base.const is not NOCONST and isinstance(base.const, type)):
            if not hasattr(base.const, attr):
                raise self.em.fail(node, f"{base.const.__name__!r} has no attribute {attr!r}", typing=True)
            val = self.global_val(getattr(base.const, attr), attr)
            path = f"{base.path}.{attr}" if base.path else None
            return new, Val(val.ty, val.exact, val.elems, val.const, path, val.py)
        ty = T.resolve_getattr(base.ty, attr)
        if ty is None:
            raise T.TypingFailure(f"{base.ty} has no attribute {attr!r}")
        t = T.nb()
        if isinstance(base.ty, t.Array) and attr in ("shape", "strides"):  # Python ints (the simulator's arrays are NumPy's)
            return new, Val(ty, elems=tuple(Val(t.intp, py=True) for _ in range(base.ty.ndim)))
        if isinstance(base.ty, t.Array) and attr in ("size", "ndim", "itemsize", "nbytes"):
            return new, Val(ty, py=True)
        exact = isinstance(base.ty, t.Record) and T.is_scalar(ty)
        return new, Val(ty, exact=exact)

    def _cuda_attribute(self, ty: Any, path: str) -> Val:
        """``cuda.threadIdx.x``, ``cuda.warpsize``, ...: Python ints in the simulator."""
        t = T.nb()
        if isinstance(ty, t.BaseTuple):
            return Val(ty, elems=tuple(Val(e, py=T.is_scalar(e)) for e in ty), path=path)
        return Val(ty, path=path, py=T.is_scalar(ty))

    def e_Subscript(self, node: ast.Subscript, state: dict) -> tuple[ast.expr, Val]:
        base_node, base = self.expr(node.value, state)
        t = T.nb()
        index = const_of(node.slice)
        if index is not NOCONST and isinstance(base.ty, (t.BaseTuple, t.Record)):
            ty = T.resolve_static_getitem(base.ty, index)
            if ty is not None:
                if base.elems is not None and isinstance(index, int):
                    val = base.elems[index]
                else:
                    val = Val(ty, exact=isinstance(base.ty, t.Record) and T.is_scalar(ty))
                new = ast.copy_location(ast.Subscript(value=base_node, slice=node.slice, ctx=ast.Load()), node)
                return new, val
        idx_node, idx = self.expr(node.slice, state)
        sig = T.resolve_call(operator.getitem, (base.ty, idx.ty))
        new = ast.copy_location(ast.Subscript(value=base_node, slice=idx_node, ctx=ast.Load()), node)
        result = sig.return_type
        if isinstance(base.ty, t.BaseTuple):
            exact = base.elems is not None and all(e.exact for e in base.elems)
            py = base.elems is not None and all(e.py for e in base.elems)
            return new, Val(result, exact=exact and T.is_scalar(result), py=py and T.is_scalar(result))
        return new, Val(result, exact=T.is_scalar(result))

    def e_Slice(self, node: ast.Slice, state: dict) -> tuple[ast.expr, Val]:
        parts, tys = [], []
        for part in (node.lower, node.upper, node.step):
            if part is None:
                parts.append(None)
                tys.append(T.nb().none)
            else:
                p_node, p = self.expr(part, state)
                parts.append(p_node)
                tys.append(p.ty)
        while len(tys) > 2 and tys[-1] == T.nb().none:
            tys.pop()
        sig = T.resolve_call(slice, tuple(tys))
        return ast.copy_location(ast.Slice(lower=parts[0], upper=parts[1], step=parts[2]), node), Val(sig.return_type)

    def e_Tuple(self, node: ast.Tuple, state: dict) -> tuple[ast.expr, Val]:
        typed = [self.expr(e, state) for e in node.elts]
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise SimulationError("a starred tuple element")
        tys = [v.ty for _, v in typed]
        t = T.nb()
        ty = t.UniTuple(tys[0], len(tys)) if tys and all(x == tys[0] for x in tys) else t.Tuple(tys)
        new = ast.copy_location(ast.Tuple(elts=[n for n, _ in typed], ctx=ast.Load()), node)
        return new, Val(ty, elems=tuple(v for _, v in typed))

    # ------------------------------------------------------------------ operators

    def e_BinOp(self, node: ast.BinOp, state: dict) -> tuple[ast.expr, Val]:
        left_node, left = self.expr(node.left, state)
        right_node, right = self.expr(node.right, state)
        fn = BINARY[type(node.op)]
        sig = T.resolve_call(fn, (left.ty, right.ty))
        return self.binop(node, fn, sig, left_node, left, right_node, right)

    def binop(self, node: ast.AST, fn: Any, sig: Any, left_node: ast.expr, left: Val, right_node: ast.expr,
              right: Val) -> tuple[ast.expr, Val]:
        """``left <fn> right`` computed as Numba computes it, with signature ``sig``."""
        fn = _PLAIN.get(fn, fn)
        t = T.nb()
        result = sig.return_type
        if not (left.scalar and right.scalar and T.is_scalar(result)):
            if fn is operator.add and isinstance(left.ty, t.BaseTuple) and isinstance(right.ty, t.BaseTuple):
                new = ast.copy_location(ast.BinOp(left=left_node, op=ast.Add(), right=right_node), node)
                elems = (left.elems or ()) + (right.elems or ()) if left.elems and right.elems else None
                return new, Val(result, elems=elems)
            raise SimulationError(f"{fn.__name__} of {left.ty} and {right.ty}")
        a_ty, b_ty = (T.unliteral(x) for x in sig.args)
        helper = self._arith_helper(fn, a_ty, b_ty, result, right)
        op = next((k for k, v in BINARY.items() if v is fn), None)
        if helper is None and op is not None and not T.is_bf16(result):
            chosen = self.operands(fn, (a_ty, b_ty), result, [(left_node, left), (right_node, right)])
            if chosen is not None:  # NumPy computes it in Numba's types as the operands are
                (a, b), py = chosen
                new = ast.copy_location(ast.BinOp(left=a, op=op(), right=b), node)
                return new, Val(result, exact=not py, py=py)
        a = self.em.convert(left_node, left, a_ty)
        b = self.em.convert(right_node, right, b_ty)
        if helper is not None:
            return self.em.call(helper, [a, b], node), Val(result, exact=True)
        new = ast.copy_location(ast.BinOp(left=a, op=op(), right=b), node)
        return self.fix_result(new, fn, (a_ty, b_ty), result), Val(result, exact=True)

    def _arith_helper(self, fn: Any, a_ty: Any, b_ty: Any, result: Any, right: Val) -> ast.expr | None:
        """A :mod:`.runtime` helper for the operations NumPy computes otherwise."""
        name = type_name(result)
        if fn in (operator.floordiv, operator.mod):
            if not (T.is_integer(result) or T.is_float(result)) or T.is_bf16(result):
                raise SimulationError(f"{fn.__name__} giving {result}")
            return self.em.helper((fn.__name__, name), f"{fn.__name__}_{name}")
        if fn is operator.pow:
            if T.is_integer(b_ty) and (T.is_integer(a_ty) or T.is_float(a_ty)) and not T.is_bf16(result):
                return self.em.helper(("ipow", name), f"ipow_{name}")
            if T.is_float(a_ty) and T.is_float(b_ty) and not T.is_bf16(result):
                return self.em.helper(("fpow", name), f"fpow_{name}")
            raise SimulationError(f"{a_ty} ** {b_ty}")
        return None

    def fix_result(self, new: ast.expr, fn: Any, arg_tys: tuple, result: Any) -> ast.expr:
        """``new`` (NumPy's operation on operands of exactly ``arg_tys``) converted to
        ``result`` where NumPy's result type differs (and rounded, for bfloat16)."""
        if T.is_bf16(result):
            fn_node = self.em.helper(("bf16",), "round_bf16")
            return self.em.call(fn_node, [new], new)
        dtypes = [str(T.runtime_dtype(x)) for x in arg_tys]
        got = numpy_result(fn, dtypes[0], dtypes[1] if len(dtypes) > 1 else None)
        want = T.runtime_dtype(result)
        if got == want:
            return new
        if got.kind == "b" and want.kind in "iu":  # a bool operation NumPy keeps bool: Numba's ints would differ
            raise SimulationError(f"{fn.__name__} of {arg_tys} giving {result}")
        source = Val(_numba_of(got), exact=True)
        return self.em.convert(new, source, result)

    def e_UnaryOp(self, node: ast.UnaryOp, state: dict) -> tuple[ast.expr, Val]:
        operand_node, operand = self.expr(node.operand, state)
        fn = UNARY[type(node.op)]
        sig = T.resolve_call(fn, (operand.ty,))
        if fn is operator.not_:
            return ast.copy_location(ast.UnaryOp(op=node.op, operand=operand_node), node), Val(sig.return_type)
        if not (operand.scalar and T.is_scalar(sig.return_type)):
            raise SimulationError(f"{fn.__name__} of {operand.ty}")
        arg_ty = T.unliteral(sig.args[0])
        if operand.rep == ("py", "float") and fn in (operator.neg, operator.pos) and type_name(arg_ty) == "float64":
            return ast.copy_location(ast.UnaryOp(op=node.op, operand=operand_node), node), \
                Val(sig.return_type, py=True)  # exact on a double
        value = self.em.convert(operand_node, operand, arg_ty)
        new = ast.copy_location(ast.UnaryOp(op=node.op, operand=value), node)
        if T.is_bf16(sig.return_type):  # negation and + of a bfloat16 are exact
            return new, Val(sig.return_type, exact=True)
        return self.fix_result(new, fn, (arg_ty,), sig.return_type), Val(sig.return_type, exact=True)

    def e_BoolOp(self, node: ast.BoolOp, state: dict) -> tuple[ast.expr, Val]:
        typed = [self.expr(v, state) for v in node.values]
        unified = T.unify(*(v.ty for _, v in typed))
        if unified is None:
            raise T.TypingFailure("the operands of and/or have types Numba cannot unify: "
                                  + ", ".join(str(v.ty) for _, v in typed))
        scalar = T.is_scalar(unified)
        values = [self.em.convert(n, v, unified) if scalar else n for n, v in typed]
        return ast.copy_location(ast.BoolOp(op=node.op, values=values), node), Val(unified, exact=scalar)

    def e_IfExp(self, node: ast.IfExp, state: dict) -> tuple[ast.expr, Val]:
        test_node, _ = self.condition(node.test, state)
        taken = self.static_truth(node.test, state)
        body_node, body = self.expr(node.body, state) if taken is not False else (node.body, None)
        else_node, other = self.expr(node.orelse, state) if taken is not True else (node.orelse, None)
        if body is None or other is None:
            val = body or other
            return ast.copy_location(ast.IfExp(test=test_node, body=body_node, orelse=else_node), node), val
        unified = T.unify(body.ty, other.ty)
        if unified is None:
            raise T.TypingFailure(f"the branches of a conditional expression have types {body.ty} and {other.ty}")
        if T.is_scalar(unified):
            body_node = self.em.convert(body_node, body, unified)
            else_node = self.em.convert(else_node, other, unified)
            val = Val(unified, exact=True)
        else:
            val = Val(unified)
        return ast.copy_location(ast.IfExp(test=test_node, body=body_node, orelse=else_node), node), val

    def e_Compare(self, node: ast.Compare, state: dict) -> tuple[ast.expr, Val]:
        operands = [self.expr(node.left, state)] + [self.expr(c, state) for c in node.comparators]
        targets: list[tuple[Any, Any]] = []  # per pair: what its left and right operands become (None: as they are)
        for k, op in enumerate(node.ops):
            (ln, lv), (rn, rv) = operands[k], operands[k + 1]
            fn = COMPARE[type(op)]
            if fn is operator.contains:
                T.resolve_call(fn, (rv.ty, lv.ty))
                targets.append((None, None))
                continue
            sig = T.resolve_call(fn, (lv.ty, rv.ty))
            if fn in (operator.is_, operator.is_not) or not (lv.scalar and rv.scalar):
                targets.append((None, None))
                continue
            a_ty, b_ty = (T.unliteral(x) for x in sig.args)
            if T.is_integer(a_ty) and T.is_integer(b_ty) and not (T.is_float(lv.ty) or T.is_float(rv.ty)):
                targets.append((None, None))  # integers compare by value, in Python, NumPy and Numba alike
                continue
            chosen = self.conversions(fn, (a_ty, b_ty), T.nb().boolean, [(ln, lv), (rn, rv)])
            how = chosen[0] if chosen is not None else ("np", "np")
            targets.append(((a_ty, how[0]) if how[0] != "keep" else None, (b_ty, how[1]) if how[1] != "keep" else None))
        boolean = Val(T.nb().boolean)

        def side(k: int, target: Any, node_: ast.expr) -> ast.expr:
            return node_ if target is None else self.convert_as(node_, operands[k][1], target[0], target[1])

        if len(node.ops) == 1:
            new = ast.Compare(left=side(0, targets[0][0], operands[0][0]), ops=list(node.ops),
                              comparators=[side(1, targets[0][1], operands[1][0])])
            return ast.copy_location(new, node), boolean
        uses: list[tuple[ast.expr, ast.expr]] = []  # per pair: its two operands
        first = side(0, targets[0][0], operands[0][0])
        chain_ok = True
        for k in range(len(node.ops)):
            right_ty = targets[k][1]
            next_ty = targets[k + 1][0] if k + 1 < len(node.ops) else right_ty
            if k + 1 < len(node.ops) and right_ty != next_ty:  # two conversions of one operand, evaluated once
                chain_ok = False
                temp = f"__pnex_sim_cmp_{next(_temp_counter)}"
                named = ast.NamedExpr(target=ast.Name(id=temp, ctx=ast.Store()), value=operands[k + 1][0])
                right = side(k + 1, right_ty, ast.copy_location(named, node))
                following = side(k + 1, next_ty, ast.copy_location(ast.Name(id=temp, ctx=ast.Load()), node))
            else:
                right = following = side(k + 1, right_ty, operands[k + 1][0])
            uses.append((first, right))
            first = following
        if chain_ok:
            new = ast.Compare(left=uses[0][0], ops=list(node.ops), comparators=[r for _, r in uses])
            return ast.copy_location(new, node), boolean
        pairs = [ast.Compare(left=left, ops=[op], comparators=[right]) for (left, right), op in zip(uses, node.ops)]
        return ast.copy_location(ast.BoolOp(op=ast.And(), values=pairs), node), boolean

    # ------------------------------------------------------------------ compile-time branches

    def static_truth(self, node: ast.expr, state: dict) -> bool | None:
        """``True``/``False`` where Numba decides the branch on ``node`` at compile time
        (``dead_branch_prune``: a comparison of two constants, or a constant, where a
        constant is a literal, a global, a closure value, a variable assigned one,
        ``a.ndim`` of an array argument or ``None`` as an argument); else ``None``."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.static_truth(node.operand, state)
            return None if inner is None else not inner
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self._const(node.left, state), self._const(node.comparators[0], state)
            if left is NOCONST or right is NOCONST:
                return None
            try:
                return bool(COMPARE[type(node.ops[0])](left, right)) if not isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                    else None
            except Exception:  # noqa: BLE001 - Numba prunes nothing where comparing fails
                return None
        if isinstance(node, ast.BinOp):
            left, right = self._const(node.left, state), self._const(node.right, state)
            if left is NOCONST or right is NOCONST:
                return None
            try:
                return bool(BINARY[type(node.op)](left, right))
            except Exception:  # noqa: BLE001
                return None
        value = self._const(node, state, predicate=True)
        if value is NOCONST:
            return None
        try:
            return bool(value)
        except Exception:  # noqa: BLE001
            return None

    def _const(self, node: ast.expr, state: dict, predicate: bool = False) -> Any:
        """What Numba's ``find_const`` finds for ``node`` (NOCONST: nothing).  An
        argument is a constant only as ``None`` in a comparison (``prune_by_type``)."""
        folded = const_of(node)
        if folded is not NOCONST:
            return folded
        t = T.nb()
        if isinstance(node, ast.Name):
            found = state.get(node.id)
            if found is not None:
                if any(found is p for p in self.params.values()):
                    if predicate:
                        return NOCONST
                    none = isinstance(found.ty, t.NoneType) or (isinstance(found.ty, t.Omitted) and found.ty.value is None)
                    return None if none else NOCONST
                return found.const
            if node.id in self.local_names:
                return NOCONST
            if node.id in self.namespace:
                return self.namespace[node.id]
            return getattr(builtins, node.id, NOCONST)
        if isinstance(node, ast.Attribute) and node.attr == "ndim" and isinstance(node.value, ast.Name):
            found = state.get(node.value.id)
            if found is not None and any(found is p for p in self.params.values()) and isinstance(found.ty, t.Array):
                return found.ty.ndim
        return NOCONST


def _numba_of(dtype: np.dtype) -> Any:
    from numba.cuda.np.numpy_support import from_dtype

    return from_dtype(dtype)


def _tuple_value(value: tuple) -> Val:
    """A tuple constant inside a folded tuple: one constant to Numba, typed as a value
    (its elements not literals)."""
    elems = tuple(_tuple_value(v) if isinstance(v, tuple) else
                  Val(T.resolve_value(v), const=v, py=isinstance(v, (int, float, bool))) for v in value)
    return Val(T.resolve_value(value), elems=elems, const=value)
