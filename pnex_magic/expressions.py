"""The small integer expression language of shapes and ``n_threads``.

An expression is parsed once, at definition, with :mod:`ast` into an immutable tree
of :class:`Expr` nodes; nothing is ever ``eval``-ed.  The language:

* integer literals;
* ``a.size(i)``, ``a.shape[i]`` (``i`` may be negative), ``a.numel()``, ``len(a)``
  for a tensor parameter ``a``;
* a bare tensor name inside a shape tuple: that tensor's size on the same axis;
* a bare integer scalar parameter: its value;
* ``+ - * // %``, unary ``-``, parentheses, ``min(...)`` and ``max(...)``.

A tree evaluates against concrete tensors (eager calls), against fake tensors
with symbolic sizes (``torch.compile``), and compiles to a flat postfix program
(:meth:`Expr.to_program`) that the C++ launcher runs without Python.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .errors import ArgumentShapeError, ShapeExpressionError

__all__ = [
    "Expr",
    "Const",
    "Size",
    "Numel",
    "ScalarRef",
    "BinOp",
    "Neg",
    "MinMax",
    "NameInfo",
    "parse_expression",
    "OPCODES",
    "MAX_STACK_DEPTH",
    "stack_depth",
]

# Opcodes of the postfix program (mirrored in csrc/launcher.h).
OPCODES = {
    "const": 0,
    "size": 1,
    "numel": 2,
    "scalar": 3,
    "+": 4,
    "-": 5,
    "*": 6,
    "//": 7,
    "%": 8,
    "neg": 9,
    "min": 10,
    "max": 11,
    # Conditions (pnex_magic.conditions, ``jit(requires=...)``): 1 for true, 0 for false.
    "<": 12,
    "<=": 13,
    ">": 14,
    ">=": 15,
    "==": 16,
    "!=": 17,
    "and": 18,
    "or": 19,
    "not": 20,
}


# The C++ launcher evaluates programs on a fixed stack of this many entries.
MAX_STACK_DEPTH = 64


def stack_depth(program: list[tuple[int, int, int]]) -> int:
    """The most values a postfix program holds on its stack at once."""
    depth = deepest = 0
    for op, _, _ in program:
        depth += 1 if op <= OPCODES["scalar"] else (0 if op in (OPCODES["neg"], OPCODES["not"]) else -1)
        deepest = max(deepest, depth)
    return deepest


def folded_program(operands, op: str, index_of: Callable[[str], int]) -> list[tuple[int, int, int]]:
    """The postfix program that combines ``operands`` (two or more) left to right with the
    binary opcode ``op`` (``min(a, b, c)``, ``p and q and r``)."""
    program = operands[0].to_program(index_of)
    for operand in operands[1:]:
        program += operand.to_program(index_of)
        program.append((OPCODES[op], 0, 0))
    return program


@dataclasses.dataclass(frozen=True)
class NameInfo:
    """What the parser knows about a name an expression may use."""

    kind: str  # "tensor" or "scalar"
    ndim: int = 0
    integral: bool = True  # scalars only


class Expr:
    """Base class of expression nodes."""

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Value of the expression; ``env`` maps parameter names to tensors
        (real or fake) and scalars."""
        raise NotImplementedError

    def names(self) -> frozenset[str]:
        raise NotImplementedError

    def to_program(self, index_of: Callable[[str], int]) -> list[tuple[int, int, int]]:
        """Postfix program: ``(opcode, a, b)`` triples; ``index_of`` maps a parameter
        name to its position in the kernel's parameter list."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Const(Expr):
    value: int

    def evaluate(self, env):
        return self.value

    def names(self):
        return frozenset()

    def to_program(self, index_of):
        return [(OPCODES["const"], self.value, 0)]

    def __str__(self):
        return str(self.value)


@dataclasses.dataclass(frozen=True)
class Size(Expr):
    param: str
    axis: int

    def evaluate(self, env):
        return env[self.param].shape[self.axis]

    def names(self):
        return frozenset({self.param})

    def to_program(self, index_of):
        return [(OPCODES["size"], index_of(self.param), self.axis)]

    def __str__(self):
        return f"{self.param}.size({self.axis})"


@dataclasses.dataclass(frozen=True)
class Numel(Expr):
    param: str

    def evaluate(self, env):
        return env[self.param].numel()

    def names(self):
        return frozenset({self.param})

    def to_program(self, index_of):
        return [(OPCODES["numel"], index_of(self.param), 0)]

    def __str__(self):
        return f"{self.param}.numel()"


@dataclasses.dataclass(frozen=True)
class ScalarRef(Expr):
    param: str

    def evaluate(self, env):
        return env[self.param]

    def names(self):
        return frozenset({self.param})

    def to_program(self, index_of):
        return [(OPCODES["scalar"], index_of(self.param), 0)]

    def __str__(self):
        return self.param


_BINOPS: dict[type, str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


@dataclasses.dataclass(frozen=True)
class BinOp(Expr):
    op: str
    left: Expr
    right: Expr

    def evaluate(self, env):
        a, b = self.left.evaluate(env), self.right.evaluate(env)
        if self.op in ("//", "%") and type(b) is int and b == 0:
            raise ArgumentShapeError(f"division by zero while evaluating {self} ({self.right} = 0)")
        if self.op == "+":
            return a + b
        if self.op == "-":
            return a - b
        if self.op == "*":
            return a * b
        if self.op == "//":
            return a // b
        return a % b

    def names(self):
        return self.left.names() | self.right.names()

    def to_program(self, index_of):
        return [*self.left.to_program(index_of), *self.right.to_program(index_of), (OPCODES[self.op], 0, 0)]

    def __str__(self):
        def side(e: Expr, right: bool) -> str:
            if isinstance(e, BinOp) and (
                _PRECEDENCE[e.op] < _PRECEDENCE[self.op] or (right and _PRECEDENCE[e.op] == _PRECEDENCE[self.op])
            ):
                return f"({e})"
            return str(e)

        return f"{side(self.left, False)} {self.op} {side(self.right, True)}"


@dataclasses.dataclass(frozen=True)
class Neg(Expr):
    operand: Expr

    def evaluate(self, env):
        return -self.operand.evaluate(env)

    def names(self):
        return self.operand.names()

    def to_program(self, index_of):
        return [*self.operand.to_program(index_of), (OPCODES["neg"], 0, 0)]

    def __str__(self):
        inner = str(self.operand)
        return f"-({inner})" if isinstance(self.operand, BinOp) else f"-{inner}"


@dataclasses.dataclass(frozen=True)
class MinMax(Expr):
    fn: str  # "min" or "max"
    args: tuple[Expr, ...]

    def evaluate(self, env):
        combine = torch.sym_min if self.fn == "min" else torch.sym_max
        values = [a.evaluate(env) for a in self.args]
        result = values[0]
        for v in values[1:]:
            result = combine(result, v)
        return result

    def names(self):
        return frozenset().union(*(a.names() for a in self.args))

    def to_program(self, index_of):
        return folded_program(self.args, self.fn, index_of)

    def __str__(self):
        return f"{self.fn}({', '.join(map(str, self.args))})"


class _Parser:
    def __init__(self, text: str, names: Mapping[str, NameInfo], axis: int | None, where: str):
        self.text = text
        self.names = names
        self.axis = axis
        self.where = where

    def fail(self, problem: str) -> ShapeExpressionError:
        return ShapeExpressionError(f"{self.where}: {problem} (in expression {self.text!r})")

    def tensor(self, node: ast.AST) -> tuple[str, NameInfo]:
        if not isinstance(node, ast.Name):
            raise self.fail(f"expected a tensor parameter's name, got {ast.unparse(node)!r}")
        info = self.lookup(node.id)
        if info.kind != "tensor":
            raise self.fail(f"{node.id!r} is a scalar, not a tensor")
        return node.id, info

    def lookup(self, name: str) -> NameInfo:
        info = self.names.get(name)
        if info is None:
            known = ", ".join(sorted(self.names)) or "none"
            raise self.fail(f"unknown name {name!r}; the names it may use here are: {known}")
        return info

    def axis_index(self, node: ast.AST, name: str, info: NameInfo) -> int:
        value = self.int_literal(node)
        if value is None:
            raise self.fail(f"the axis of {name!r} must be an integer literal, got {ast.unparse(node)!r}")
        if not -info.ndim <= value < info.ndim:
            raise self.fail(f"axis {value} is out of range for {name!r}, which has {info.ndim} dimension(s)")
        return value % info.ndim

    @staticmethod
    def int_literal(node: ast.AST) -> int | None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = _Parser.int_literal(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        return None

    def parse(self, node: ast.AST) -> Expr:
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise self.fail(f"only integer constants are allowed, got {node.value!r}")
            return Const(node.value)
        if isinstance(node, ast.Name):
            info = self.lookup(node.id)
            if info.kind == "scalar":
                if not info.integral:
                    raise self.fail(f"scalar {node.id!r} is not an integer, so it cannot be used in a size")
                return ScalarRef(node.id)
            if self.axis is None:
                raise self.fail(
                    f"a bare tensor name ({node.id!r}) only means a size inside a shape tuple; "
                    f"write {node.id}.size(i) or {node.id}.numel()"
                )
            if self.axis >= info.ndim:
                raise self.fail(
                    f"{node.id!r} stands for its size on axis {self.axis}, but it has {info.ndim} dimension(s)"
                )
            return Size(node.id, self.axis)
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise self.fail(
                    f"operator {ast.unparse(node)!r} is not allowed; use + - * // % (integer arithmetic only)"
                )
            return BinOp(op, self.parse(node.left), self.parse(node.right))
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return Neg(self.parse(node.operand))
            if isinstance(node.op, ast.UAdd):
                return self.parse(node.operand)
            raise self.fail(f"unary operator in {ast.unparse(node)!r} is not allowed")
        if isinstance(node, ast.Subscript):
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr == "shape":
                name, info = self.tensor(value.value)
                return Size(name, self.axis_index(node.slice, name, info))
            raise self.fail(f"{ast.unparse(node)!r}: only tensor.shape[i] may be indexed")
        if isinstance(node, ast.Call):
            if node.keywords:
                raise self.fail("keyword arguments are not allowed")
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("min", "max"):
                if len(node.args) < 2:
                    raise self.fail(f"{func.id}() needs at least two arguments")
                return MinMax(func.id, tuple(self.parse(a) for a in node.args))
            if isinstance(func, ast.Name) and func.id == "len":
                if len(node.args) != 1:
                    raise self.fail("len() takes one tensor")
                name, info = self.tensor(node.args[0])
                if info.ndim == 0:
                    raise self.fail(f"len({name}) of a 0-dimensional tensor")
                return Size(name, 0)
            if isinstance(func, ast.Attribute) and func.attr == "size":
                name, info = self.tensor(func.value)
                if len(node.args) != 1:
                    raise self.fail(f"{name}.size() needs exactly one axis, e.g. {name}.size(0)")
                return Size(name, self.axis_index(node.args[0], name, info))
            if isinstance(func, ast.Attribute) and func.attr == "numel":
                name, _ = self.tensor(func.value)
                if node.args:
                    raise self.fail(f"{name}.numel() takes no arguments")
                return Numel(name)
            raise self.fail(
                f"call {ast.unparse(node)!r} is not allowed; use t.size(i), t.shape[i], t.numel(), len(t), min(), max()"
            )
        raise self.fail(f"{ast.unparse(node)!r} is not allowed in a size expression")


def parse_expression(
    text: str | int,
    names: Mapping[str, NameInfo],
    *,
    where: str,
    axis: int | None = None,
) -> Expr:
    """Parse ``text`` into an :class:`Expr`.

    ``names`` are the parameters the expression may use; ``axis`` is the axis of
    the shape entry being parsed (a bare tensor name means its size on that
    axis), ``None`` outside shapes.  ``where`` prefixes error messages.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ShapeExpressionError(f"{where}: expected an int or an expression string, got {text!r}")
    if isinstance(text, int):
        return Const(text)
    return parse_text(text, where, "expression", _Parser(text, names, axis, where).parse)


def parse_text(text: str, where: str, kind: str, build: Callable[[ast.AST], Expr]) -> Expr:
    """``text`` parsed by :mod:`ast` and built into a tree by ``build`` (from the parsed
    body), refused where it is not Python, nests too deeply for the parser or for the
    C++ launcher's stack; ``kind`` ("expression", "condition") names it in messages."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ShapeExpressionError(f"{where}: {text!r} is not a valid {kind} ({exc.msg})") from None
    except (RecursionError, MemoryError):
        raise ShapeExpressionError(f"{where}: {kind} {text!r} is nested too deeply") from None
    try:
        expr = build(tree.body)
    except RecursionError:
        raise ShapeExpressionError(f"{where}: {kind} {text!r} is nested too deeply") from None
    depth = stack_depth(expr.to_program(lambda name: 0))
    if depth > MAX_STACK_DEPTH:
        raise ShapeExpressionError(
            f"{where}: {kind} {text!r} is nested too deeply (its evaluation holds {depth} values at once; "
            f"at most {MAX_STACK_DEPTH}); write it with fewer nested parentheses"
        )
    return expr
