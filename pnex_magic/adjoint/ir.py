"""The forward kernel as the transformer sees it: a small tree of statements over
values in SSA form, each value with its type and whether a gradient flows through it.

:mod:`.program` builds it from the kernel's source; :mod:`.ownership` decides how each
``In`` tensor's gradient is written; :mod:`.emit` writes the backward kernel from it.

Values are named once (SSA): every assignment of a local makes a new version, so a
value's name means the same number everywhere it appears, in the forward replay and in
the reverse pass.  Where control flow merges, :class:`Join` (after an ``if``) and
:class:`Carried` (around a ``for``) name the merged value.

Types follow Numba's typing of scalars closely enough to keep a float32 kernel's
adjoint in float32 (``f32``), a float64 one's in float64 (``f64``): float16 and
bfloat16 values are promoted to float32 where they are read, so every float of the
backward kernel is one of the two.  Other kinds: ``b`` (bool), ``i8`` ... ``i64``,
``u8`` ... ``u64`` (integers: never differentiated) and ``x`` (anything else: a tuple,
a shape, a module; only used where the forward used it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

__all__ = [
    "FLOATS", "is_float", "is_int", "promote", "Operand", "Stmt", "Assign", "Load", "Store", "Join", "If",
    "Carried", "For", "Block", "blocks", "statements", "useful_values",
]

FLOATS = ("f32", "f64")


def is_float(ty: str) -> bool:
    return ty in FLOATS


def is_int(ty: str) -> bool:
    return ty[:1] in ("i", "u") or ty == "b"


def _bits(ty: str) -> int:
    return 1 if ty == "b" else int(ty[1:])


def promote(a: str, b: str) -> str:
    """The type of an arithmetic operation on ``a`` and ``b`` (Numba's rules: float32
    with an integer of 32 bits or more, or with a float64, gives float64)."""
    if "x" in (a, b):
        return "x"
    if "f64" in (a, b):
        return "f64"
    if "f32" in (a, b):
        other = b if a == "f32" else a
        return "f32" if other == "f32" or _bits(other) <= 16 else "f64"
    return "i64"


@dataclasses.dataclass(frozen=True)
class Operand:
    """An argument of an operation: an SSA value (``name``) or a constant's text."""

    text: str
    ty: str
    active: bool = False  #: a gradient flows through it (it depends on a floating-point In tensor)
    name: str | None = None  #: the SSA value's name; ``None`` for a constant or an expression
    reads: frozenset[str] = frozenset()  #: SSA values the text reads
    const: float | None = None  #: its value, when it is a constant (``1.0``, ``real(1.0)``)


class Stmt:
    """A statement of the forward kernel."""

    line: int

    def reads(self) -> frozenset[str]:
        """SSA values the statement's forward code reads."""
        raise NotImplementedError

    def defines(self) -> tuple[str, ...]:
        """SSA values it defines."""
        raise NotImplementedError


@dataclasses.dataclass
class Assign(Stmt):
    """``targets = expr``.  With a ``rule`` (:mod:`.rules`), ``expr`` is that rule's value
    of ``args`` and the reverse pass applies its partial derivatives; without one,
    ``expr`` is copied as it is (integers, conditions, constants): no gradient."""

    targets: tuple[str, ...]
    expr: str
    ty: str
    line: int
    rule: str | None = None
    args: tuple[Operand, ...] = ()
    extra: dict = dataclasses.field(default_factory=dict)  #: constants a rule's templates name
    active: bool = False
    expr_reads: frozenset[str] = frozenset()

    def reads(self) -> frozenset[str]:
        return self.expr_reads | frozenset(a.name for a in self.args if a.name)

    def defines(self) -> tuple[str, ...]:
        return self.targets


@dataclasses.dataclass
class Load(Stmt):
    """``target = tensor[index]`` from a floating-point ``In`` tensor: its adjoint goes
    into ``grad_<tensor>`` at ``index`` (:mod:`.ownership` says how)."""

    target: str
    tensor: str
    index: tuple[str, ...]  #: each axis's index, as code over SSA values
    index_reads: frozenset[str]
    ty: str
    half: bool  #: the tensor is float16/bfloat16: the value is promoted to float32
    line: int
    node: object = None  #: the subscript in the forward's source (for the ownership proof)
    scope: object = None  #: the :class:`Block` holding it

    def reads(self) -> frozenset[str]:
        return self.index_reads

    def defines(self) -> tuple[str, ...]:
        return (self.target,)


@dataclasses.dataclass
class Store(Stmt):
    """``tensor[index] = value`` (``op`` "=") or ``tensor[index] += value`` ("+", "-") into an
    ``Out`` tensor: the reverse pass reads ``grad_<tensor>[index]`` into ``value``'s adjoint."""

    tensor: str
    index: tuple[str, ...]
    index_reads: frozenset[str]
    value: Operand
    op: str
    differentiable: bool  #: a floating-point Out (integer outputs have no gradient)
    line: int
    scope: object = None  #: the :class:`Block` holding it

    def reads(self) -> frozenset[str]:
        return frozenset()  # the store is not replayed: nothing is written in the backward

    def defines(self) -> tuple[str, ...]:
        return ()


@dataclasses.dataclass(frozen=True)
class Join:
    """``target`` is ``body`` after the ``if`` branch ran and ``orelse`` after the other."""

    target: str
    body: str
    orelse: str
    ty: str
    active: bool


@dataclasses.dataclass
class If(Stmt):
    """``if test: body else: orelse``; ``test`` is the name of the stored condition."""

    test: str
    body: Block
    orelse: Block
    joins: list[Join]
    line: int
    node: object = None  #: the ``if`` (or ``a if c else b``) in the forward's source

    def reads(self) -> frozenset[str]:
        return frozenset({self.test})

    def defines(self) -> tuple[str, ...]:
        return tuple(j.target for j in self.joins)


@dataclasses.dataclass(frozen=True)
class Carried:
    """A local the loop's body assigns: ``carrier`` holds it at the start of each trip
    and after the loop; ``init`` is its value before the loop, ``exit`` at a trip's end."""

    carrier: str
    init: str
    exit: str
    ty: str
    active: bool


@dataclasses.dataclass
class For(Stmt):
    """``for target in range(start, stop, step)``; ``start``/``stop`` are code over SSA
    values computed before the loop, ``step`` a nonzero int constant."""

    target: str
    start: Operand
    stop: Operand
    step: int
    body: Block
    carried: list[Carried]
    line: int
    node: object = None  #: the ``for`` in the forward's source

    def reads(self) -> frozenset[str]:
        return self.start.reads | self.stop.reads | frozenset(c.init for c in self.carried)

    def defines(self) -> tuple[str, ...]:
        return tuple(c.carrier for c in self.carried)


@dataclasses.dataclass(eq=False)
class Block:
    """A list of statements and where it sits: the function's body, a branch of an
    ``if`` (``kind`` "body"/"orelse" of ``owner``), or a loop's body ("loop")."""

    kind: str  #: "function", "body", "orelse" or "loop"
    parent: Block | None = None
    owner: Stmt | None = None  #: the If or For whose block this is
    stmts: list[Stmt] = dataclasses.field(default_factory=list)
    #: floats defined here (their adjoints start at zero where the block's reverse starts)
    floats: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def ancestors(self):
        block = self
        while block is not None:
            yield block
            block = block.parent


def blocks(root: Block) -> Iterator[Block]:
    """``root`` and every block nested in it: an ``if``'s body, then its else branch, a
    loop's body, each followed by the blocks inside it, in the order of the source."""
    yield root
    for stmt in root.stmts:
        if isinstance(stmt, If):
            yield from blocks(stmt.body)
            yield from blocks(stmt.orelse)
        elif isinstance(stmt, For):
            yield from blocks(stmt.body)


def statements(root: Block) -> Iterator[tuple[Block, Stmt]]:
    """Every statement under ``root``, nested ones too, with the block that holds it
    (block by block, in :func:`blocks`' order)."""
    for block in blocks(root):
        for stmt in block.stmts:
            yield block, stmt


def useful_values(root: Block) -> set[str]:
    """The SSA values whose adjoints can be nonzero: those a differentiable ``Store``
    writes, and, back through the rules, joins and loops, every value they are computed
    from (the "useful" half of an AD tool's activity analysis).

    The reverse pass keeps the adjoints of these only.  A value no output depends on
    (``t = math.sin(x ** y)`` never stored) has no derivative terms: its partials would
    be zero times something that may be inf or NaN (``cos(inf)``) where PyTorch, which
    never visits it, gives a finite gradient."""
    useful: set[str] = set()
    stmts = [stmt for _, stmt in statements(root)]
    for stmt in stmts:
        if isinstance(stmt, Store) and stmt.differentiable and stmt.value.name:
            useful.add(stmt.value.name)
    while True:
        before = len(useful)
        for stmt in stmts:
            if isinstance(stmt, Assign) and stmt.rule is not None and useful.intersection(stmt.targets):
                useful.update(a.name for a in stmt.args if a.name and a.active)
            elif isinstance(stmt, If):
                for j in stmt.joins:
                    if j.target in useful:
                        useful.update((j.body, j.orelse))
            elif isinstance(stmt, For):
                for c in stmt.carried:
                    if c.carrier in useful or c.exit in useful:  # a trip's start is the last one's end
                        useful.update((c.carrier, c.init, c.exit))
        if len(useful) == before:
            return useful
