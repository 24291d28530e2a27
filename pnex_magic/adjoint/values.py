"""What a forward kernel's names and expressions are, for the transformer: their types,
whether a gradient flows through them, and the refusals of what it does not handle.

:class:`Scope` knows the kernel's parameters, its globals and the locals defined so far
(SSA values, :class:`~pnex_magic.adjoint.ir.Operand`); :meth:`Scope.info` gives an
expression's type and activity and refuses, with a :class:`KernelDefinitionError`
naming the line, every construct the derived backward does not handle.
:meth:`Scope.verbatim` writes an expression through which no gradient flows (an index,
a condition, a constant) as code over the SSA values.
"""

from __future__ import annotations

import ast
import math
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..checking.bindings import UNKNOWN, Bindings
from ..dtypes import resolve_dtype
from ..errors import KernelDefinitionError
from ..spec import KernelSpec, ScalarParam, TensorParam, TuneParam
from .ir import Operand, is_float, is_int, promote
from .rules import MATH

__all__ = ["Scope", "Refusal", "grad_name"]

#: math functions that are piecewise constant (no gradient) and their result kinds
_MATH_FLAT = {"floor": "i64", "ceil": "i64", "trunc": "i64", "isnan": "b", "isinf": "b", "isfinite": "b"}
_MATH_CONSTANTS = ("pi", "e", "tau", "inf", "nan")
_CUDA_REFUSED = {
    "atomic": "atomics (cuda.atomic.*)",
    "syncthreads": "cuda.syncthreads()",
    "syncthreads_count": "cuda.syncthreads_count()",
    "syncthreads_and": "cuda.syncthreads_and()",
    "syncthreads_or": "cuda.syncthreads_or()",
    "syncwarp": "cuda.syncwarp()",
    "threadfence": "memory fences",
    "shared": "shared memory (cuda.shared.array)",
    "local": "local arrays (cuda.local.array)",
    "const": "constant arrays (cuda.const.array_like)",
}
_CUDA_INTS = ("threadIdx", "blockIdx", "blockDim", "gridDim", "laneid", "warpsize")


def grad_name(name: str) -> str:
    """The backward kernel's name for the gradient of tensor ``name``."""
    return f"grad_{name}"


def _float_kind(dtype_name: str) -> str:
    return "f64" if dtype_name == "float64" else "f32"  # float16/bfloat16 are promoted to float32


def _value_kind(value: Any) -> str:
    """The type of a constant (a literal, a global or closure value, a module's attribute),
    as Numba types it; ``"x"`` for what is not a number."""
    if isinstance(value, bool | np.bool_):
        return "b"
    if isinstance(value, int | np.integer):
        return "i64"
    if isinstance(value, float | np.floating):
        return "f32" if isinstance(value, np.float32) else "f64"
    return "x"


def _dtype_kind(dtype) -> str:
    if dtype.is_floating_point:
        return _float_kind(dtype.name)
    if dtype.name == "bool":
        return "b"
    return ("u" if dtype.name.startswith("uint") else "i") + dtype.name.lstrip("uint")


class Refusal:
    """Raises the transformer's errors: the kernel, the line and its text, and why."""

    def __init__(self, kernel: str, lines: Mapping[int, str]):
        self.kernel = kernel
        self.lines = lines

    def __call__(self, node: Any, what: str) -> KernelDefinitionError:
        """The error about ``node`` (a syntax node, or a line number)."""
        line = node if isinstance(node, int) else getattr(node, "lineno", None)
        line = line or None
        where = ""
        if line is not None:
            where = f", line {line}"
            text = self.lines.get(line, "").strip()
            if text:
                where += f" (`{text}`)"
        error = KernelDefinitionError(
            f"derive_backward({self.kernel}){where}: {what}. pnex derives a backward only for the kernels it can "
            f"differentiate exactly (see the README's 'Derived gradients'); write a backward kernel and attach it "
            f"with pnex.attach_backward instead"
        )
        error.lineno = line  # where a %%pnex cell's error points
        return error


class Scope:
    """Names and expressions of one forward kernel (``fdef``, its ``spec``, its
    ``namespace`` of globals and closure values)."""

    def __init__(self, fdef: ast.FunctionDef, spec: KernelSpec, namespace: Mapping[str, Any], refuse: Refusal,
                 helpers: Mapping[str, str], bindings: Bindings | None = None):
        self.spec = spec
        self.params = {p.name: p for p in spec.params}
        self.bindings = bindings or Bindings(fdef, namespace)  # the index proofs' (IndexRanges.bindings), shared
        self.refuse = refuse
        self.helpers = helpers  #: helper role ("math", "f32", ...) -> the name the generated code uses
        self.env: dict[str, Operand] = {}  #: local name -> its current SSA value
        self.unbound: dict[str, str] = {}  #: locals not defined here, and why
        self.locals = set(self.bindings.of) - set(self.params)

    # ------------------------------------------------------------------ outside values
    def value_of(self, name: str) -> Any:
        """A name's value outside the kernel (its globals and closure, then builtins), ``None``
        for neither."""
        value = self.bindings.value_of(name)
        return None if value is UNKNOWN else value

    def callee(self, node: ast.expr) -> tuple[str, Any] | None:
        """``("math", "exp")``, ``("builtin", abs)``, ``("dtype", DType)``, ``("cuda", path)``,
        ``("device", fn)``, ``("other", value)``: what a called expression is."""
        path = self.bindings.cuda_path(node)
        if path is not None:
            return ("cuda", path)
        value: Any = None
        if isinstance(node, ast.Name):
            if node.id in self.locals or node.id in self.params:
                return None
            value = self.value_of(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id not in self.locals:
            owner = self.value_of(node.value.id)
            if owner is math:
                return ("math", node.attr)
            if isinstance(owner, types.ModuleType):
                value = getattr(owner, node.attr, None)
        else:
            return None
        if value is None:
            return None
        if isinstance(value, types.BuiltinFunctionType) and getattr(value, "__module__", "") == "math":
            return ("math", value.__name__)
        if value in (abs, min, max, float, int, bool, len, range):
            return ("builtin", value)
        if type(value).__module__.startswith("numba") and getattr(value, "py_func", None) is not None:
            return ("device", value)
        if isinstance(value, type) and issubclass(value, np.generic) or type(value).__module__.startswith("numba"):
            dtype = resolve_dtype(value)
            if dtype is not None:
                return ("dtype", dtype)
        return ("other", value)

    # ------------------------------------------------------------------ types
    def info(self, node: ast.expr) -> tuple[str, bool]:
        """``(type, active)`` of expression ``node``: its type (:mod:`.ir`) and whether a
        gradient flows through it.  Refuses what the transformer does not handle."""
        method = getattr(self, f"_info_{type(node).__name__}", None)
        if method is None:
            raise self.refuse(node, f"{type(node).__name__} expressions ({ast.unparse(node)}) are not supported")
        return method(node)

    def _info_Constant(self, node: ast.Constant) -> tuple[str, bool]:
        if isinstance(node.value, str) or node.value is None:
            return "x", False
        kind = _value_kind(node.value)
        if kind == "x":
            raise self.refuse(node, f"the constant {node.value!r} is not supported")
        return kind, False

    def _info_Name(self, node: ast.Name) -> tuple[str, bool]:
        name = node.id
        if name in self.env:
            op = self.env[name]
            return op.ty, op.active
        if name in self.unbound:
            raise self.refuse(node, self.unbound[name])
        if name in self.locals:
            raise self.refuse(node, f"{name!r} is read before it is assigned")
        param = self.params.get(name)
        if param is not None:
            if isinstance(param, TensorParam):
                return "x", False
            if isinstance(param, ScalarParam):
                return _dtype_kind(param.dtype), False
            if isinstance(param, TuneParam):
                return {"int": "i64", "float": "f64", "bool": "b"}[param.kind], False
            raise self.refuse(node, f"{name!r} is an Unused parameter")
        return _value_kind(self.value_of(name)), False  # "x": a module, a function, a type: only called

    def _info_Attribute(self, node: ast.Attribute) -> tuple[str, bool]:
        path = self.bindings.cuda_path(node)
        if path is not None:
            if path and path[0] in _CUDA_INTS:
                return "i64", False
            return "x", False
        if isinstance(node.value, ast.Name):
            base = node.value.id
            param = self.params.get(base)
            if isinstance(param, TensorParam) and node.attr in ("shape", "size", "ndim"):
                self._tensor_shape(node, param)
                return ("x" if node.attr == "shape" else "i64"), False
            if base not in self.locals and base not in self.params:
                owner = self.value_of(base)
                if owner is math and node.attr in _MATH_CONSTANTS:
                    return "f64", False
                if isinstance(owner, types.ModuleType):
                    return _value_kind(getattr(owner, node.attr, None)), False
        raise self.refuse(node, f"the attribute {ast.unparse(node)} is not supported")

    def _tensor_shape(self, node: ast.AST, param: TensorParam) -> None:
        if param.role == "out" and not param.dtype.is_floating_point:
            raise self.refuse(node, f"the backward has no tensor shaped like the integer output {param.name!r}; "
                                    f"take the size from an input")

    def _info_Subscript(self, node: ast.Subscript) -> tuple[str, bool]:
        base = node.value
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for part in parts:
            if isinstance(part, ast.Slice):
                raise self.refuse(node, "slices are not supported")
            ty, _ = self.info(part)
            if not is_int(ty):
                raise self.refuse(part, f"the index {ast.unparse(part)} is not an integer")
        if isinstance(base, ast.Attribute) and base.attr == "shape":
            self.info(base)
            return "i64", False
        if isinstance(base, ast.Name) and base.id in self.params:
            param = self.params[base.id]
            if not isinstance(param, TensorParam):
                raise self.refuse(node, f"{base.id!r} is not a tensor")
            if param.role == "out":
                raise self.refuse(node, f"it reads the output {base.id!r}; the derived backward recomputes values "
                                        f"instead of reading outputs back: keep the value in a local")
            if len(parts) != param.ndim:
                raise self.refuse(node, f"{base.id!r} has {param.ndim} dimension(s); index it with one integer each")
            return _dtype_kind(param.dtype), param.dtype.is_floating_point
        if isinstance(base, ast.Name) and base.id in self.env:
            raise self.refuse(node, f"subscripts of the local {base.id!r} are not supported")
        raise self.refuse(node, f"the subscript {ast.unparse(node)} is not supported")

    def _info_BinOp(self, node: ast.BinOp) -> tuple[str, bool]:
        (ta, aa), (tb, ab) = self.info(node.left), self.info(node.right)
        if "x" in (ta, tb):
            raise self.refuse(node, f"the operation {ast.unparse(node)} is not on numbers")
        op = type(node.op)
        active = aa or ab
        if op in (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift):
            if is_float(ta) or is_float(tb):
                raise self.refuse(node, "bitwise operations on floats are not supported")
            return "i64", False
        if op is ast.MatMult:
            raise self.refuse(node, "the @ operator is not supported")
        if op is ast.Div and not (is_float(ta) or is_float(tb)):
            return "f64", False
        if op is ast.Pow and is_float(ta) and not is_float(tb):
            return ta, active
        ty = promote(ta, tb)
        return ty, active and is_float(ty)

    def _info_UnaryOp(self, node: ast.UnaryOp) -> tuple[str, bool]:
        ty, active = self.info(node.operand)
        if isinstance(node.op, ast.Not):
            return "b", False
        if isinstance(node.op, ast.Invert):
            if is_float(ty):
                raise self.refuse(node, "~ on a float is not supported")
            return "i64", False
        return ty, active

    def _info_BoolOp(self, node: ast.BoolOp) -> tuple[str, bool]:
        for v in node.values:
            ty, _ = self.info(v)
            if is_float(ty):
                raise self.refuse(node, "`and`/`or` over floats are not supported; compare them first")
        return "b", False

    def _info_Compare(self, node: ast.Compare) -> tuple[str, bool]:
        for v in [node.left, *node.comparators]:
            self.info(v)
        return "b", False

    def _info_IfExp(self, node: ast.IfExp) -> tuple[str, bool]:
        self.info(node.test)
        (ta, aa), (tb, ab) = self.info(node.body), self.info(node.orelse)
        if ta == tb:
            return ta, aa or ab
        return promote(ta, tb), aa or ab

    def _info_Tuple(self, node: ast.Tuple) -> tuple[str, bool]:
        for e in node.elts:
            self.info(e)
        return "x", False

    def _info_Call(self, node: ast.Call) -> tuple[str, bool]:
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise self.refuse(node, "calls with keywords or *args are not supported")
        what = self.callee(node.func)
        if what is None:
            raise self.refuse(node, f"the call {ast.unparse(node.func)}(...) is not supported")
        kind, value = what
        if kind == "cuda":
            return self._cuda_call(node, value)
        if kind == "device":
            raise self.refuse(node, f"it calls the device function {ast.unparse(node.func)}; the derived backward "
                                    f"does not differentiate through @cuda.jit(device=True) functions: write its "
                                    f"body in the kernel")
        args = [self.info(a) for a in node.args]
        active = any(a for _, a in args)
        if kind == "math":
            if value in _MATH_FLAT:
                return _MATH_FLAT[value], False
            if value not in MATH and active:
                raise self.refuse(node, f"math.{value} is not among the differentiable functions "
                                        f"({', '.join(sorted(MATH))})")
            ty = args[0][0] if len(args) == 1 else promote(args[0][0], args[1][0])
            return (ty if is_float(ty) else "f64"), active
        if kind == "builtin":
            if value is len:
                arg = node.args[0] if node.args else None
                param = self.params.get(arg.id) if isinstance(arg, ast.Name) else None
                if isinstance(param, TensorParam):
                    self._tensor_shape(node, param)
                return "i64", False
            if value is range:
                raise self.refuse(node, "range(...) is only supported as the iterable of a for loop")
            if value is int:
                return "i64", False
            if value is bool:
                return "b", False
            if value is float:
                return "f64", active
            if value is abs:
                return args[0][0], active
            ty = args[0][0]
            for t, _ in args[1:]:
                ty = promote(ty, t)
            return ty, active and is_float(ty)
        if kind == "dtype":
            ty = _dtype_kind(value)
            return ty, active and is_float(ty)
        raise self.refuse(node, f"the call {ast.unparse(node.func)}(...) is not supported")

    def _cuda_call(self, node: ast.Call, path: tuple[str, ...]) -> tuple[str, bool]:
        head = path[0] if path else ""
        if head in _CUDA_REFUSED:
            raise self.refuse(node, f"{_CUDA_REFUSED[head]} in the forward kernel are not supported: threads that "
                                    f"share state have no per-thread adjoint")
        if path in (("grid",), ("gridsize",)):
            return ("i64" if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 1
                    else "x"), False
        raise self.refuse(node, f"cuda.{'.'.join(path)}(...) is not supported")

    # ------------------------------------------------------------------ code
    def verbatim(self, node: ast.expr) -> Operand:
        """``node``, through which no gradient flows, as code over the SSA values."""
        ty, _ = self.info(node)
        renamer = _Renamer(self)
        text = ast.unparse(renamer.visit(_copy(node)))
        return Operand(text, ty, False, None, frozenset(renamer.read), self.constant(node))

    def constant(self, node: ast.expr) -> float | None:
        """The value of a float constant written as ``1.0``, ``-1.0``, ``real(1.0)``,
        ``float(1)`` or a local bound to one; ``None`` for anything else."""
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.constant(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.Name) and node.id in self.env:
            return self.env[node.id].const
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
            kind = self.callee(node.func)
            if kind is not None and (kind[0] == "dtype" and kind[1].is_floating_point
                                     or kind == ("builtin", float)):
                return self.constant(node.args[0])
        return None

    def target(self, name: str, node: ast.AST) -> None:
        """Refuse an assignment to ``name`` that the transformer cannot follow."""
        if name in self.params:
            raise self.refuse(node, f"it assigns the parameter {name!r}; assign a new local instead")


def _copy(node: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(node), mode="eval").body


class _Renamer(ast.NodeTransformer):
    """Locals become their current SSA values, an output's name its gradient's (only its
    shape is ever read)."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self.read: set[str] = set()

    def visit_Name(self, node: ast.Name) -> ast.Name:
        op = self.scope.env.get(node.id)
        if op is not None:
            if op.name is None:
                return ast.parse(f"({op.text})", mode="eval").body
            self.read.add(op.name)
            return ast.Name(id=op.name, ctx=ast.Load())
        param = self.scope.params.get(node.id)
        if isinstance(param, TensorParam) and param.role == "out":
            return ast.Name(id=grad_name(node.id), ctx=ast.Load())
        return node
