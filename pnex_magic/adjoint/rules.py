"""The derivative rules: each operation the derived backward differentiates, with its
value and its partial derivatives, in one entry of one table (:data:`RULES`).

As Warp's builtins declare theirs, an operation is data here, not a branch in the
transformer: a new function is one entry.  An entry's templates are Python code over
placeholders that the transformer (:mod:`.program`, :mod:`.emit`) fills in:

=================  ==================================================================
``{a}``, ``{b}``   the operation's arguments (SSA values or constants)
``{r}``            its result
``{g}``            the adjoint of the result (the gradient flowing back into it)
``{f}``            the function as the kernel spells it (``math.exp``, ``exp``, ``abs``)
``{math}``         the ``math`` module
``{one}``,         constants in the result's type (``float32(1.0)`` in a float32
``{zero}``, ...    kernel, so that no float64 arithmetic creeps in)
``{k}``, ``{km1}`` an integer power's exponent as a float constant, and exponent - 1
=================  ==================================================================

``partials[i]`` is the adjoint contribution to argument ``i``: the reverse pass adds it
to that argument's adjoint (``adj_a += <partial>``) when a gradient flows through the
argument.  ``None`` is a zero derivative (a piecewise constant operation).  Which of
``{a}``, ``{b}`` and ``{r}`` a partial reads decides which forward values the reverse
pass needs (:func:`reads`).

The mutation tests (``tests/test_adjoint_random.py``) flip signs and drop factors in
this table and check that the randomised comparison with PyTorch's autograd fails.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
import string

__all__ = ["Rule", "RULES", "BINARY", "UNARY", "MATH", "BUILTINS", "CONSTANTS", "reads", "fill"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One differentiable operation: its value and a partial derivative per argument."""

    value: str
    partials: tuple[str | None, ...]


RULES: dict[str, Rule] = {
    # arithmetic
    "pos": Rule("+{a}", ("{g}",)),
    "neg": Rule("-{a}", ("-{g}",)),
    "add": Rule("{a} + {b}", ("{g}", "{g}")),
    "sub": Rule("{a} - {b}", ("{g}", "-{g}")),
    "mul": Rule("{a} * {b}", ("{g} * {b}", "{g} * {a}")),
    "div": Rule("{a} / {b}", ("{g} / {b}", "-({g} / {b}) * {r}")),  # one division: NVVM shares g / b
    "reciprocal": Rule("{a} / {b}", (None, "-{g} * {r} * {r}")),  # a is the constant 1: no division
    "floordiv": Rule("{a} // {b}", (None, None)),
    "mod": Rule("{a} % {b}", ("{g}", "-{g} * {math}.floor({a} / {b})")),
    # a ** b: both differentiable; an exponent no gradient flows through; an integer constant one.
    # As PyTorch's pow_backward_self/_exponent: 0 for the base where b == 0 (not 0 * a ** -1, NaN
    # at a = 0) and for the exponent where a == 0 <= b (not r * log(0) = 0 * -inf)
    "pow": Rule("{a} ** {b}", ("({zero} if {b} == {zero} else {g} * {b} * {a} ** ({b} - {one}))",
                               "{g} * ({zero} if {a} == {zero} and {b} >= {zero} else {r} * {math}.log({a}))")),
    "pow_exponent": Rule("{a} ** {b}", ("({zero} if {b} == 0 else {g} * {b} * {a} ** ({b} - 1))", None)),
    "pow_int": Rule("{a} ** {b}", ("{g} * {k} * {a} ** {km1}", None)),
    "mpow": Rule("{f}({a}, {b})", ("({zero} if {b} == {zero} else {g} * {b} * {f}({a}, {b} - {one}))",
                                   "{g} * ({zero} if {a} == {zero} and {b} >= {zero} else {r} * {math}.log({a}))")),
    # the math module
    "exp": Rule("{f}({a})", ("{g} * {r}",)),
    "expm1": Rule("{f}({a})", ("{g} * ({r} + {one})",)),
    "log": Rule("{f}({a})", ("{g} / {a}",)),
    "log1p": Rule("{f}({a})", ("{g} / ({one} + {a})",)),
    "sin": Rule("{f}({a})", ("{g} * {math}.cos({a})",)),
    "cos": Rule("{f}({a})", ("-{g} * {math}.sin({a})",)),
    "tan": Rule("{f}({a})", ("{g} * ({one} + {r} * {r})",)),
    "tanh": Rule("{f}({a})", ("{g} * ({one} - {r} * {r})",)),
    "sqrt": Rule("{f}({a})", ("{g} / ({r} + {r})",)),
    "erf": Rule("{f}({a})", ("{g} * {two_over_sqrt_pi} * {math}.exp(-({a} * {a}))",)),
    "atan2": Rule("{f}({a}, {b})", ("{g} * {b} / ({a} * {a} + {b} * {b})", "-{g} * {a} / ({a} * {a} + {b} * {b})")),
    "hypot": Rule("{f}({a}, {b})", ("{g} * {a} / {r}", "{g} * {b} / {r}")),
    "fabs": Rule("{f}({a})", ("({g} if {a} > {zero} else (-{g} if {a} < {zero} else {zero}))",)),
    # builtins: abs, min and max (Python's: the first argument on a tie), conversions
    "abs": Rule("{f}({a})", ("({g} if {a} > {zero} else (-{g} if {a} < {zero} else {zero}))",)),
    "min": Rule("{f}({a}, {b})", ("({g} if {a} <= {b} else {zero})", "({zero} if {a} <= {b} else {g})")),
    "max": Rule("{f}({a}, {b})", ("({g} if {a} >= {b} else {zero})", "({zero} if {a} >= {b} else {g})")),
    "cast": Rule("{f}({a})", ("{g}",)),
}

#: Operators of ``ast.BinOp`` and ``ast.UnaryOp`` and their rules.
BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
          ast.Mod: "mod", ast.Pow: "pow"}
UNARY = {ast.USub: "neg", ast.UAdd: "pos"}
#: Functions of the ``math`` module by name, and their rules.
MATH = {"exp": "exp", "expm1": "expm1", "log": "log", "log1p": "log1p", "sin": "sin", "cos": "cos",
        "tan": "tan", "tanh": "tanh", "sqrt": "sqrt", "erf": "erf", "atan2": "atan2", "hypot": "hypot",
        "fabs": "fabs", "pow": "mpow"}
#: Builtins by name (resolved to the builtin itself by the transformer), and their rules.
BUILTINS = {"abs": "abs", "min": "min", "max": "max"}
#: The typed constants templates may name.
CONSTANTS = {"one": 1.0, "zero": 0.0, "two_over_sqrt_pi": 2.0 / math.sqrt(math.pi)}

_FIELDS = string.Formatter()


def _placeholders(template: str) -> set[str]:
    return {field for _, field, _, _ in _FIELDS.parse(template) if field}


def reads(template: str | None) -> set[str]:
    """Which of the operation's values (``"a"``, ``"b"``, ``"r"``) ``template`` reads."""
    return set() if template is None else _placeholders(template) & {"a", "b", "r"}


_SIMPLE = re.compile(r"[A-Za-z_][A-Za-z_0-9.]*(\([0-9.e+]+\))?|[0-9.]+(e[+-]?[0-9]+)?")


def fill(template: str, values: dict[str, str]) -> str:
    """``template`` with its placeholders replaced; values that are not a single name or
    number are parenthesised, so that ``-{g}`` or ``{a} ** {b}`` keep their meaning."""
    wrapped = {k: v if _SIMPLE.fullmatch(v) else f"({v})" for k, v in values.items()}
    return template.format(**wrapped)
