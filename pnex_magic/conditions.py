"""Conditions on a call's arguments: ``jit(requires=...)``.

A kernel may be right only for some values of its scalars or sizes: a tile that must
keep an interior (``2 * steps < 32``), a length that must be a multiple of the tile
(``x.size(0) % 128 == 0``).  Such a kernel given other values computes wrong numbers
without a fault; ``requires`` states the rule, and every launcher (the Python and C++
launchers, the simulator, JAX, a saved artifact) refuses a call that breaks it with
one :class:`~pnex_magic.errors.ArgumentValueError` naming the rule and the values::

    @pnex.jit(n_threads="x.size(0)", requires=["0 <= steps <= 15", "x.size(0) % 128 == 0"])

or, with what each rule means (it ends the message)::

    @pnex.jit(..., requires={"a.size(1) % 64 == 0": "K must be a multiple of the k-tile, 64"})

A condition is the integer language of :mod:`pnex_magic.expressions` (sizes, integer
scalars, ``+ - * // %``, ``min``/``max``) compared with ``< <= > >= == !=`` (chains like
``0 <= steps <= 15`` included) and combined with ``and``, ``or``, ``not``.  Both sides of
``and``/``or`` are always evaluated (as the C++ launcher does): a division by zero on
either side is an error, not a short circuit.  It may name the op's arguments only: not
its outputs, whose sizes follow from the arguments, nor ``Tune`` parameters, whose
choices the autotuner makes.

``jit(tune_requires=...)`` states rules in the same language over ``Tune`` parameters
(:func:`parse_tune_rules`).  A rule over ``Tune`` parameters alone keeps the combinations
of choices that hold, and only those are compiled and timed (``"STAGES * (BM + BN) * 128
<= 232448"`` drops the tile shapes whose buffers do not fit, where ``Tune`` alone can only
drop a value of one parameter in every combination).  A rule that also names the call's
arguments (``"w.size(0) % BN == 0"``) is a rule *per call*: each call launches only the
combinations that keep it for its sizes (:func:`variant_check`: the rule with a
combination's values in place of the ``Tune`` names, a condition on the call alone), and
a call that leaves none is refused (:func:`any_variant_rule`).

Parsed once at definition into a tree whose postfix program (opcodes ``<`` .. ``not`` of
:data:`~pnex_magic.expressions.OPCODES`) the C++ launcher evaluates without Python.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import ArgumentShapeError, ArgumentValueError, ShapeExpressionError
from .expressions import (
    MAX_STACK_DEPTH,
    OPCODES,
    Const,
    Expr,
    NameInfo,
    Numel,
    ScalarRef,
    Size,
    _Parser,
    folded_program,
    parse_text,
    stack_depth,
)

__all__ = ["Condition", "Requirement", "parse_requirements", "parse_tune_rules", "kept_combinations",
           "per_call", "variant_check", "any_variant_rule", "check_requirements", "requirement_message",
           "reworded", "programs", "BROKEN"]

_OPERATORS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
              "!=": operator.ne}
_COMPARE: dict[type, str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
}


class Condition(Expr):
    """A node whose value is true or false (a comparison, ``and``/``or``, ``not``)."""


@dataclasses.dataclass(frozen=True)
class Compare(Condition):
    op: str
    left: Expr
    right: Expr

    def evaluate(self, env):
        return _OPERATORS[self.op](self.left.evaluate(env), self.right.evaluate(env))

    def names(self):
        return self.left.names() | self.right.names()

    def to_program(self, index_of):
        return [*self.left.to_program(index_of), *self.right.to_program(index_of), (OPCODES[self.op], 0, 0)]

    def __str__(self):
        return f"{self.left} {self.op} {self.right}"


@dataclasses.dataclass(frozen=True)
class Logical(Condition):
    op: str  # "and" or "or"
    operands: tuple[Condition, ...]

    def evaluate(self, env):
        values = [bool(c.evaluate(env)) for c in self.operands]  # every operand, as the C++ launcher
        return all(values) if self.op == "and" else any(values)

    def names(self):
        return frozenset().union(*(c.names() for c in self.operands))

    def to_program(self, index_of):
        return folded_program(self.operands, self.op, index_of)

    def __str__(self):
        return f" {self.op} ".join(f"({c})" if isinstance(c, Logical) else str(c) for c in self.operands)


@dataclasses.dataclass(frozen=True)
class Not(Condition):
    operand: Condition

    def evaluate(self, env):
        return not self.operand.evaluate(env)

    def names(self):
        return self.operand.names()

    def to_program(self, index_of):
        return [*self.operand.to_program(index_of), (OPCODES["not"], 0, 0)]

    def __str__(self):
        return f"not ({self.operand})" if isinstance(self.operand, Logical) else f"not {self.operand}"


class _ConditionParser(_Parser):
    def condition(self, node: ast.AST) -> Condition:
        if isinstance(node, ast.Compare):
            if not all(type(op) in _COMPARE for op in node.ops):
                raise self.fail("only < <= > >= == != compare here (not `in`, `is`)")
            terms = [self.parse(node.left), *(self.parse(c) for c in node.comparators)]
            pairs = [Compare(_COMPARE[type(op)], terms[i], terms[i + 1]) for i, op in enumerate(node.ops)]
            return pairs[0] if len(pairs) == 1 else Logical("and", tuple(pairs))
        if isinstance(node, ast.BoolOp):
            return Logical("and" if isinstance(node.op, ast.And) else "or",
                           tuple(self.condition(v) for v in node.values))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return Not(self.condition(node.operand))
        raise self.fail(
            f"{ast.unparse(node)!r} is not a condition; write a comparison such as `steps <= 15` or "
            f"`x.size(0) % 128 == 0`, combined with and / or / not"
        )


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One ``requires`` entry: its text as written, the parsed condition, the terms
    (sizes and scalars) its message shows the values of, and what it means (``why``,
    from the dict form; ends the message)."""

    text: str
    condition: Condition
    terms: tuple[Expr, ...]
    why: str = ""

    def __str__(self) -> str:
        return self.text


def _terms(node: Expr) -> list[Expr]:
    if isinstance(node, (Size, Numel, ScalarRef)):
        return [node]
    found: list[Expr] = []
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        value = getattr(node, field.name)
        for child in value if isinstance(value, tuple) else (value,):
            if isinstance(child, Expr):
                found += [t for t in _terms(child) if t not in found]
    return found


def parse_requirements(kernel: str, requires: Any, names: Mapping[str, NameInfo], tune: Sequence[str] = (),
                       outputs: Sequence[str] = ()) -> tuple[Requirement, ...]:
    """Parse ``jit(requires=...)``: a condition string or a sequence of them.  ``names``
    are the argument names the conditions may use; ``tune`` and ``outputs`` the names
    they may not (each refused with the reason)."""
    if requires is None:
        return ()
    pairs = _pairs(kernel, requires, "requires", "requires=['steps <= 15'] or requires={'x.size(0) % 128 == 0': 'N "
                   "must be a multiple of the tile, 128'}")
    found = []
    for i, (text, why) in enumerate(pairs):
        where = f"kernel {kernel!r}, requires[{i}]"

        def build(body: ast.AST, text: str = text, where: str = where) -> Condition:
            for node in ast.walk(body):
                if isinstance(node, ast.Name) and (node.id in tune or node.id in outputs):
                    reason = ("a Tune parameter: the autotuner chooses it, so a call cannot break a rule on it; "
                              "a rule on Tune parameters goes in tune_requires= (it keeps the combinations of "
                              "choices that hold, for every call or, naming the call's arguments too, per call)"
                              if node.id in tune
                              else "an output: its sizes follow from the arguments; state the rule on those")
                    raise ShapeExpressionError(f"{where}: {text!r} names {node.id!r}, {reason}")
            return _ConditionParser(text, names, None, where).condition(body)

        condition = parse_text(text, where, "condition", build)
        found.append(Requirement(text.strip(), condition, tuple(_terms(condition)), why.strip()))
    return tuple(found)


def _pairs(kernel: str, rules: Any, keyword: str, example: str) -> list[tuple[Any, Any]]:
    """``requires``-style rules as (condition text, meaning) pairs, or an error naming ``keyword``."""
    if isinstance(rules, dict):
        pairs = list(rules.items())
    elif isinstance(rules, (list, tuple)):
        pairs = [(text, "") for text in rules]
    else:  # one condition (anything else is refused below)
        pairs = [(rules, "")]
    if not all(isinstance(t, str) and isinstance(w, str) for t, w in pairs):
        raise ShapeExpressionError(
            f"kernel {kernel!r}: {keyword}= takes a condition string, a list of them, or a dict of conditions and "
            f"what each means, e.g. {example}, got {rules!r}"
        )
    return pairs


def parse_tune_rules(kernel: str, rules: Any, tune: Mapping[str, NameInfo], others: Sequence[str] = (),
                     arguments: Mapping[str, NameInfo] | None = None,
                     outputs: Sequence[str] = ()) -> tuple[Requirement, ...]:
    """Parse ``jit(tune_requires=...)``: conditions over the ``Tune`` parameters ``tune``,
    each naming one of them at least; ``arguments``: the call's arguments a rule may also
    name (a rule per call, :func:`per_call`); ``others`` and ``outputs``: the kernel's
    other parameters, each refused with the reason."""
    if rules is None:
        return ()
    example = "tune_requires=['BM * BN <= 16384', 'w.size(0) % BN == 0'] or tune_requires={'STAGES * (BM + BN) * " \
              "128 <= 232448': 'the buffers fit in shared memory'}"
    pairs = _pairs(kernel, rules, "tune_requires", example)
    names = {**(arguments or {}), **tune}
    found = []
    for i, (text, why) in enumerate(pairs):
        where = f"kernel {kernel!r}, tune_requires[{i}]"

        def build(body: ast.AST, text: str = text, where: str = where) -> Condition:
            called = {id(n.func) for n in ast.walk(body) if isinstance(n, ast.Call)}  # min, max: the parser's
            named = {n.id for n in ast.walk(body) if isinstance(n, ast.Name) and id(n) not in called}
            for name in sorted(named - set(names)):
                reason = ("an output: its sizes follow from the arguments; state the rule on those" if name in outputs
                          else "a parameter the rule cannot read" if name in others
                          else "not a parameter of the kernel")
                raise ShapeExpressionError(
                    f"{where}: {text!r} names {name!r}, {reason}; tune_requires rules name Tune parameters "
                    f"({', '.join(tune) or 'the kernel has none'}), the call's arguments and integer constants")
            if not named & set(tune):
                raise ShapeExpressionError(
                    f"{where}: {text!r} names no Tune parameter ({', '.join(tune)}): a rule on the call's arguments "
                    f"alone goes in requires=")
            return _ConditionParser(text, names, None, where).condition(body)

        condition = parse_text(text, where, "condition", build)
        found.append(Requirement(text.strip(), condition, tuple(_terms(condition)), why.strip()))
    return tuple(found)


def per_call(rule: Requirement, tune: Sequence[str]) -> bool:
    """Whether a ``tune_requires`` rule names the call's arguments (its truth depends on
    the call), not the ``Tune`` parameters ``tune`` alone."""
    return not rule.condition.names() <= set(tune)


def _substituted(node: Expr, values: Mapping[str, Any]) -> Expr:
    """``node`` with every scalar named in ``values`` replaced by its value (an int)."""
    if isinstance(node, ScalarRef) and node.param in values:
        return Const(int(values[node.param]))
    changes = {}
    for field in dataclasses.fields(node):  # type: ignore[arg-type]
        value = getattr(node, field.name)
        if isinstance(value, Expr):
            changes[field.name] = _substituted(value, values)
        elif isinstance(value, tuple) and any(isinstance(v, Expr) for v in value):
            changes[field.name] = tuple(_substituted(v, values) if isinstance(v, Expr) else v for v in value)
    return dataclasses.replace(node, **changes) if changes else node  # type: ignore[type-var]


def variant_check(rules: Sequence[Requirement], values: Mapping[str, Any]) -> Condition:
    """The condition a combination of ``Tune`` values (``values``, by name) puts on a call:
    every rule of ``rules`` (rules per call) with those values in place of the names."""
    checks = tuple(_substituted(r.condition, values) for r in rules)
    return checks[0] if len(checks) == 1 else Logical("and", checks)  # type: ignore[return-value]


#: The text of the rule :func:`any_variant_rule` makes begins so (no rule a user writes
#: parses with it), and :func:`reworded` words its message.
TUNE_RULE = "tune_requires: "


def any_variant_rule(kernel: str, rules: Sequence[Requirement], checks: Sequence[Condition],
                     combinations: Sequence[str]) -> Requirement:
    """The rule every launcher checks when ``tune_requires`` has rules per call
    (``rules``): some combination of ``Tune`` choices (``checks``, each as
    :func:`variant_check` made it; ``combinations``, how each reads) keeps them for the
    call.  Its message names the rules, the call's values and the combinations."""
    condition = checks[0] if len(checks) == 1 else Logical("or", tuple(checks))
    texts = "; ".join(r.text for r in rules)
    if stack_depth(condition.to_program(lambda name: 0)) > MAX_STACK_DEPTH:  # (each rule was checked alone)
        raise ShapeExpressionError(
            f"kernel {kernel!r}, tune_requires {texts!r}: combined over the Tune combinations, the rules nest deeper "
            f"than the C++ launcher evaluates (at most {MAX_STACK_DEPTH}); write them with fewer nested parentheses")
    shown = "; ".join(combinations[:6]) + (f" and {len(combinations) - 6} more" if len(combinations) > 6 else "")
    meanings = "".join(f"{r.why}; " for r in rules if r.why)
    return Requirement(TUNE_RULE + texts, condition, tuple(_terms(condition)),
                       f"{meanings}no combination of the Tune choices ({shown}) keeps it for this call")


def reworded(message: str) -> str:
    """A broken-rule message (:func:`requirement_message`, or the C++ launcher's same words)
    as the user wrote the rule: ``the call breaks tune_requires `...``` for the rule of
    :func:`any_variant_rule`, which the user did not write in ``requires``."""
    at = message.find(BROKEN)
    if at < 0:
        return message
    close = message.find("] `", at)
    if close < 0 or not message.startswith(TUNE_RULE, close + 3):
        return message
    return message[:at] + "(): the call breaks tune_requires `" + message[close + 3 + len(TUNE_RULE):]


def kept_combinations(kernel: str, names: Sequence[str], choices: Sequence[Sequence[Any]],
                      rules: Sequence[Requirement]) -> tuple[tuple[Any, ...], ...]:
    """The combinations of ``Tune`` values (one value per name of ``names``, of its
    ``choices``, in the product's order) that keep every rule of ``rules`` over the
    ``Tune`` parameters alone (every combination where there is none); an error when a
    rule cannot be evaluated on one (a division by zero) or no combination is left."""
    every = tuple(itertools.product(*choices))
    rules = [r for r in rules if not per_call(r, names)]  # a rule per call keeps every combination here
    if not rules:
        return every
    kept = []
    for values in every:
        env = dict(zip(names, values))
        holds = True
        for i, r in enumerate(rules):
            try:
                holds = bool(r.condition.evaluate(env)) and holds  # (every rule evaluated, as requires')
            except (ZeroDivisionError, ArgumentShapeError) as exc:
                setting = ", ".join(f"{n}={v!r}" for n, v in env.items())
                raise ShapeExpressionError(f"kernel {kernel!r}, tune_requires[{i}]: `{r.text}` with the Tune choice "
                                           f"{setting}: {exc}") from None
        if holds:
            kept.append(tuple(values))
    if not kept:
        raise ShapeExpressionError(
            f"kernel {kernel!r}: no combination of the Tune choices keeps tune_requires "
            f"({'; '.join(f'`{r.text}`' for r in rules)}): there is nothing to compile; widen the choices or the "
            f"rules")
    return tuple(kept)


#: What every message of a broken rule holds after the kernel's name (the C++ launcher's
#: too, which the op's error translation recognises by it).
BROKEN = "(): the call breaks requires["


def requirement_message(kernel: str, index: int, requirement: Requirement, values: Sequence[int]) -> str:
    """The message of a call that breaks ``requirement`` (``values``: of its terms, in
    order); the C++ launcher builds the same words (csrc/launcher_call.cpp)."""
    shown = ", ".join(f"{t} = {v}" for t, v in zip(requirement.terms, values, strict=True))
    return reworded(f"{kernel}{BROKEN}{index}] `{requirement.text}`" + (f" ({shown})" if shown else "")
                    + (f": {requirement.why}" if requirement.why else ""))


def check_requirements(kernel: str, requirements: Sequence[Requirement], env: Mapping[str, Any]) -> None:
    """Raise :class:`~pnex_magic.errors.ArgumentValueError` for the first requirement
    the arguments in ``env`` break."""
    for i, r in enumerate(requirements):
        if not r.condition.evaluate(env):
            raise ArgumentValueError(requirement_message(kernel, i, r, [_concrete(t.evaluate(env)) for t in r.terms]))


def _concrete(value: Any) -> Any:
    """A size as the call has it: under ``torch.compile`` with dynamic shapes a size is a
    symbol (``s17``) whose hint is this call's value."""
    hint = getattr(getattr(value, "node", None), "hint", None)
    return hint if hint is not None else value


def programs(requirements: Sequence[Requirement], index_of: Callable[[str], int]) -> list[dict[str, Any]]:
    """The requirements as the launch description holds them (postfix programs)."""
    return [{"text": r.text, "why": r.why, "program": r.condition.to_program(index_of),
             "terms": [[str(t), t.to_program(index_of)] for t in r.terms]} for r in requirements]
