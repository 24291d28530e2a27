"""From a forward kernel's source to its statements in SSA form (:mod:`.ir`).

One walk over the kernel's ``def``: every assignment of a local makes a new version of
it, every floating-point operation a gradient flows through becomes one
:class:`~pnex_magic.adjoint.ir.Assign` with its rule (:mod:`.rules`), a read of a
floating-point ``In`` tensor a :class:`~pnex_magic.adjoint.ir.Load`, a write of an
``Out`` tensor a :class:`~pnex_magic.adjoint.ir.Store`.  What no gradient flows through
(indices, conditions, constants) is kept as the kernel wrote it, over the new names.

Control flow: ``if``/``else`` (and ``a if c else b``) keep their stored condition and
name the merged values (:class:`~pnex_magic.adjoint.ir.Join`); ``for`` over ``range``
names the locals its body assigns (:class:`~pnex_magic.adjoint.ir.Carried`).  A
``return`` is folded away first: ``if t: return`` followed by ``rest`` becomes
``if t: pass else: rest``.  Everything else is refused (:class:`~.values.Refusal`).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping
from typing import Any

from ..checking.guards import int_constant
from ..kernelsource import bound_names, range_call
from ..spec import TensorParam
from .ir import Assign, Block, Carried, For, If, Join, Load, Operand, Store, is_float, is_int, promote
from .rules import BINARY, BUILTINS, MATH, RULES, UNARY, fill
from .values import Refusal, Scope

__all__ = ["Names", "Program", "build_program", "typed_constant"]


class Names:
    """Fresh names for the backward kernel: none clashes with a name of the forward's."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self.versions: dict[str, int] = {}
        self.origin: dict[str, str] = {}  #: a version's name -> the local it is a version of

    def fresh(self, base: str) -> str:
        k = 0
        name = base
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def state(self) -> tuple:
        """What :meth:`restore` goes back to (a loop's body is walked again when a local's
        type widens: its names are made again)."""
        return set(self.taken), dict(self.versions), dict(self.origin)

    def restore(self, state: tuple) -> None:
        taken, versions, origin = state
        self.taken, self.versions, self.origin = set(taken), dict(versions), dict(origin)

    def version(self, local: str) -> str:
        """A new version of ``local``: its own name the first time, then ``local_1``, ..."""
        if local not in self.versions:
            self.versions[local] = 0
            self.origin[local] = local
            return local
        self.versions[local] += 1
        name = self.fresh(f"{local}_{self.versions[local]}")
        self.origin[name] = local
        return name


def eager_test(text: str) -> str:
    """A test of comparisons joined by ``and`` (chained or not) over names, constants,
    sizes and ``+ - *`` of them, as ``(a < b) & (b < c) & ...``: all evaluated, no
    branch.  Nothing in it can fail or read memory, so the value is the same; Numba
    compiles Python's short circuit to a branch per operand, which NVVM keeps (a
    stencil's region tests, replayed at each neighbour: 5 branches each).  Any other
    test is returned as it is."""
    node = ast.parse(text, mode="eval").body

    def pure(e: ast.expr) -> bool:
        if isinstance(e, (ast.Name, ast.Constant)):
            return True
        if isinstance(e, ast.Attribute):
            return e.attr in ("shape", "size") and isinstance(e.value, ast.Name)
        if isinstance(e, ast.Subscript):  # x.shape[k] only: any other subscript may be guarded by the test
            return isinstance(e.value, ast.Attribute) and e.value.attr == "shape" and pure(e.value) \
                and isinstance(e.slice, ast.Constant)
        if isinstance(e, ast.BinOp):
            return isinstance(e.op, (ast.Add, ast.Sub, ast.Mult)) and pure(e.left) and pure(e.right)
        if isinstance(e, ast.UnaryOp):
            return isinstance(e.op, ast.USub) and pure(e.operand)
        return False

    def comparisons(e: ast.expr) -> list[str] | None:
        if isinstance(e, ast.BoolOp) and isinstance(e.op, ast.And):
            parts = [comparisons(v) for v in e.values]
            return None if any(p is None for p in parts) else [c for p in parts for c in p]
        if isinstance(e, ast.Compare) and all(pure(x) for x in (e.left, *e.comparators)):
            operands = [e.left, *e.comparators]
            return [f"({ast.unparse(ast.Compare(a, [o], [b]))})" for a, o, b in zip(operands, e.ops, operands[1:])]
        return None

    found = comparisons(node)
    return " & ".join(found) if found is not None and len(found) > 1 else text


def typed_constant(value: float, ty: str, helpers: Mapping[str, str]) -> str:
    """A float constant in type ``ty``: ``1.0`` in float64, ``float32(1.0)`` in float32."""
    text = repr(float(value))
    return text if ty == "f64" else f"{helpers['f32']}({text})"


@dataclasses.dataclass
class Program:
    """A forward kernel's statements (:attr:`root`), its loads and stores."""

    root: Block
    loads: list[Load]
    stores: list[Store]
    scope: Scope


def _fold_returns(stmts: list[ast.stmt], refuse: Refusal, in_loop: bool = False) -> list[ast.stmt]:
    """``stmts`` without ``return``: the statements after an ``if`` that returns on one
    of its paths move into its other paths; what follows a ``return`` is dropped."""
    out: list[ast.stmt] = []
    for k, stmt in enumerate(stmts):
        if isinstance(stmt, ast.Return):
            if stmt.value is not None:
                raise refuse(stmt, "a kernel returns nothing")
            if in_loop:
                raise refuse(stmt, "return inside a loop is not supported")
            return out
        has_return = any(isinstance(n, ast.Return) for n in ast.walk(stmt))
        if isinstance(stmt, ast.If) and has_return:
            rest = stmts[k + 1:]
            new = ast.If(test=stmt.test, body=_fold_returns(stmt.body + rest, refuse, in_loop) or [ast.Pass()],
                         orelse=_fold_returns(stmt.orelse + rest, refuse, in_loop))
            out.append(ast.copy_location(new, stmt))
            return out
        if isinstance(stmt, (ast.For, ast.While)) and has_return:
            raise refuse(next(n for n in ast.walk(stmt) if isinstance(n, ast.Return)),
                         "return inside a loop is not supported")
        out.append(stmt)
    return out


class _Builder:
    def __init__(self, scope: Scope, names: Names, helpers: Mapping[str, str]):
        self.scope = scope
        self.names = names
        self.helpers = helpers
        self.refuse = scope.refuse
        self.block: Block = Block("function")
        self.loads: list[Load] = []
        self.stores: list[Store] = []
        self.line = 0

    # ------------------------------------------------------------------ helpers
    def emit(self, stmt: Any) -> None:
        stmt.line = self.line
        self.block.stmts.append(stmt)

    def new_float(self, base: str, ty: str, active: bool) -> str:
        name = self.names.fresh(base)
        if active and is_float(ty):
            self.block.floats.append((name, ty))
        return name

    def materialize(self, op: Operand, base: str = "t") -> str:
        """An SSA name holding ``op`` (a constant's text gets one)."""
        if op.name is not None:
            return op.name
        name = self.names.fresh(base)
        self.emit(Assign((name,), op.text, op.ty, self.line, expr_reads=op.reads))
        return name

    def bind(self, local: str, op: Operand, node: ast.AST) -> None:
        """``local = op``: a new version of ``local``.  A fresh temporary just made for
        ``op`` is renamed instead of copied; another SSA value is aliased."""
        self.scope.target(local, node)
        self.scope.unbound.pop(local, None)
        last = self.block.stmts[-1] if self.block.stmts else None
        fresh = (op.name is not None and getattr(last, "fresh", None) == op.name)
        if fresh:
            new = self.names.version(local)
            if isinstance(last, Load):
                last.target = new
            else:
                last.targets = (new,)
            self.block.floats[:] = [(new if n == op.name else n, t) for n, t in self.block.floats]
            last.fresh = None
            self.scope.env[local] = dataclasses.replace(op, text=new, name=new, reads=frozenset({new}))
        elif op.name is not None:
            self.scope.env[local] = op
        else:
            new = self.names.version(local)
            self.emit(Assign((new,), op.text, op.ty, self.line, expr_reads=op.reads))
            self.scope.env[local] = Operand(new, op.ty, False, new, frozenset({new}), op.const)

    # ------------------------------------------------------------------ statements
    def statements(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            self.line = getattr(stmt, "lineno", self.line)
            self.statement(stmt)

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Pass):
            return
        if isinstance(node, ast.Expr):
            if isinstance(node.value, ast.Constant):
                return  # a docstring or a bare constant
            self.scope.info(node.value)  # refuses atomics, syncthreads, ... by name
            raise self.refuse(node, "an expression statement (a call for its effect) is not supported")
        if isinstance(node, ast.Assign):
            if len(node.targets) != 1:
                raise self.refuse(node, "chained assignments (a = b = ...) are not supported")
            return self.assign(node.targets[0], node.value, node)
        if isinstance(node, ast.AnnAssign):
            if node.value is None:
                return
            return self.assign(node.target, node.value, node)
        if isinstance(node, ast.AugAssign):
            return self.aug_assign(node)
        if isinstance(node, ast.If):
            return self.if_statement(node)
        if isinstance(node, ast.For):
            return self.for_statement(node)
        if isinstance(node, ast.While):
            raise self.refuse(node, "while loops are not supported (their trip count depends on data); "
                                    "write a for loop over range(...)")
        if isinstance(node, (ast.Break, ast.Continue)):
            raise self.refuse(node, f"{type(node).__name__.lower()} is not supported: every trip of a loop "
                                    f"runs its whole body")
        raise self.refuse(node, f"{type(node).__name__} statements are not supported")

    def assign(self, target: ast.expr, value: ast.expr, node: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            self.bind(target.id, self.expr(value), node)
        elif isinstance(target, ast.Subscript):
            self.store(target, value, "=", node)
        elif isinstance(target, ast.Tuple) and all(isinstance(t, ast.Name) for t in target.elts):
            if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                ops = [self.expr(v) for v in value.elts]  # all values first, as Python does
                for t, op in zip(target.elts, ops):
                    self.bind(t.id, op, node)
                return
            self.unpack(target, value, node)
        else:
            raise self.refuse(node, f"the assignment target {ast.unparse(target)} is not supported")

    def unpack(self, target: ast.Tuple, value: ast.expr, node: ast.stmt) -> None:
        """``i, j = cuda.grid(2)`` or ``rows, cols = x.shape``: integers."""
        grid = isinstance(value, ast.Call) and self.scope.bindings.cuda_path(value.func) in (("grid",), ("gridsize",))
        shape = isinstance(value, ast.Attribute) and value.attr == "shape" and isinstance(value.value, ast.Name) \
            and isinstance(self.scope.params.get(value.value.id), TensorParam)
        if not (grid or shape):
            raise self.refuse(node, f"unpacking {ast.unparse(value)} is not supported")
        op = self.scope.verbatim(value)
        for t in target.elts:
            self.scope.target(t.id, node)
        new = tuple(self.names.version(t.id) for t in target.elts)
        self.emit(Assign(new, op.text, "i64", self.line, expr_reads=op.reads))
        for t, n in zip(target.elts, new):
            self.scope.unbound.pop(t.id, None)
            self.scope.env[t.id] = Operand(n, "i64", False, n, frozenset({n}))

    def aug_assign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Subscript):
            if not isinstance(node.op, (ast.Add, ast.Sub)):
                raise self.refuse(node, "only += and -= into an output are supported")
            return self.store(node.target, node.value, "+" if isinstance(node.op, ast.Add) else "-", node)
        if not isinstance(node.target, ast.Name):
            raise self.refuse(node, f"the assignment target {ast.unparse(node.target)} is not supported")
        load = ast.copy_location(ast.Name(id=node.target.id, ctx=ast.Load()), node.target)
        value = ast.copy_location(ast.BinOp(left=load, op=node.op, right=node.value), node)
        self.bind(node.target.id, self.expr(value), node)

    def store(self, target: ast.Subscript, value: ast.expr, op: str, node: ast.stmt) -> None:
        base = target.value
        param = self.scope.params.get(base.id) if isinstance(base, ast.Name) else None
        if not isinstance(param, TensorParam) or param.role != "out":
            raise self.refuse(node, f"it writes {ast.unparse(base)}; a kernel with a derived backward writes only "
                                    f"its Out tensors")
        parts = target.slice.elts if isinstance(target.slice, ast.Tuple) else [target.slice]
        if len(parts) != param.ndim or any(isinstance(p, ast.Slice) for p in parts):
            raise self.refuse(node, f"{param.name!r} has {param.ndim} dimension(s); index it with one integer each")
        index = [self.scope.verbatim(p) for p in parts]
        for p, i in zip(parts, index):
            if not is_int(i.ty):
                raise self.refuse(p, f"the index {ast.unparse(p)} is not an integer")
        operand = self.expr(value)
        differentiable = param.dtype.is_floating_point
        if differentiable and operand.active and not is_float(operand.ty):
            operand = dataclasses.replace(operand, active=False)
        stmt = Store(param.name, tuple(i.text for i in index), frozenset().union(*(i.reads for i in index)),
                     operand, op, differentiable, self.line, self.block)
        self.emit(stmt)
        self.stores.append(stmt)

    def condition(self, test: ast.expr) -> str:
        op = self.scope.verbatim(test)
        if op.name is not None:
            return op.name
        if op.text.isidentifier() and op.text in op.reads:
            return op.text
        name = self.names.fresh("c")
        self.emit(Assign((name,), eager_test(op.text), "b", self.line, expr_reads=op.reads))
        return name

    def if_statement(self, node: ast.If) -> None:
        test = self.condition(node.test)
        before = dict(self.scope.env)
        body, env_body = self.branch("body", node.body)
        self.scope.env = dict(before)
        orelse, env_else = self.branch("orelse", node.orelse)
        joins: list[Join] = []
        merged: dict[str, Operand] = {}
        for local in {*env_body, *env_else}:
            a, b = env_body.get(local), env_else.get(local)
            if a is None or b is None:
                self.scope.unbound[local] = (f"{local!r} is assigned in only one branch of the if at line "
                                             f"{node.lineno} and read after it")
                continue
            if a.name == b.name:
                merged[local] = a
                continue
            ty = a.ty if a.ty == b.ty else promote(a.ty, b.ty)
            active = (a.active or b.active) and is_float(ty)
            target = self.names.version(local)
            if active:
                self.block.floats.append((target, ty))
            joins.append(Join(target, a.name, b.name, ty, active))
            merged[local] = Operand(target, ty, active, target, frozenset({target}))
        self.scope.env = merged
        stmt = If(test, body, orelse, joins, self.line, node)
        body.owner = orelse.owner = stmt
        self.emit(stmt)

    def branch(self, kind: str, stmts: list[ast.stmt]) -> tuple[Block, dict[str, Operand]]:
        outer = self.block
        self.block = Block(kind, outer)
        try:
            self.statements(stmts)
            return self.block, self.scope.env
        finally:
            self.block = outer

    def for_statement(self, node: ast.For) -> None:
        line = self.line
        if node.orelse:
            raise self.refuse(node, "for ... else is not supported")
        args = range_call(node.iter)
        if args is None or self.scope.bindings.builtin("range") is not range or not isinstance(node.target, ast.Name):
            raise self.refuse(node, "only `for name in range(...)` loops are supported")
        step = 1
        if len(args) == 3:
            step = int_constant(args[2])
            if not step:
                raise self.refuse(node, "a loop's step must be a nonzero integer constant")
        start = self.bound(args[0]) if len(args) > 1 else Operand("0", "i64")
        stop = self.bound(args[1] if len(args) > 1 else args[0])
        k = node.target.id
        if k in bound_names(node.body):
            raise self.refuse(node, f"the loop's body assigns its variable {k!r}")
        assigned = bound_names(node.body)
        carried_locals = sorted(n for n in assigned if n in self.scope.env)
        before = dict(self.scope.env)
        guess = {n: (before[n].ty, before[n].active) for n in carried_locals}
        n_loads, n_stores, unbound = len(self.loads), len(self.stores), dict(self.scope.unbound)
        names = self.names.state()
        for _attempt in range(4):
            del self.loads[n_loads:], self.stores[n_stores:]
            self.names.restore(names)
            self.scope.unbound = dict(unbound)
            self.scope.env = dict(before)
            carriers = {}
            for n in carried_locals:
                name = self.names.version(n)
                ty, active = guess[n]
                carriers[n] = Operand(name, ty, active, name, frozenset({name}))
                self.scope.env[n] = carriers[n]
            self.scope.unbound.pop(k, None)
            target = self.names.version(k)
            self.scope.env[k] = Operand(target, "i64", False, target, frozenset({target}))
            body, env_after = self.branch("loop", node.body)
            widened = {}
            for n in carried_locals:
                a, b = before[n], env_after[n]
                ty = a.ty if a.ty == b.ty else promote(a.ty, b.ty)
                widened[n] = (ty, (a.active or b.active) and is_float(ty))
            if widened == guess:
                break
            guess = widened
        else:  # pragma: no cover - the lattice is 2 deep
            raise self.refuse(node, "the types of the loop's locals do not settle")
        carried = []
        for n in carried_locals:
            c = carriers[n]
            exit_ = env_after[n]
            if exit_.name is None:
                raise AssertionError("every local's value is named")
            carried.append(Carried(c.name, before[n].name, exit_.name, c.ty, c.active))
            if c.active:
                self.block.floats.append((c.name, c.ty))
        after = dict(before)
        for n in carried_locals:
            after[n] = carriers[n]
        for n in assigned - set(carried_locals):
            after.pop(n, None)
            self.scope.unbound[n] = f"{n!r} is assigned inside the loop at line {line} and read after it"
        after.pop(k, None)
        self.scope.unbound[k] = f"the loop variable {k!r} of the loop at line {line} is read after the loop"
        self.scope.env = after
        self.line = line
        stmt = For(target, start, stop, step, body, carried, line, node)
        body.owner = stmt
        self.emit(stmt)

    def bound(self, node: ast.expr) -> Operand:
        """A loop bound, computed once before the loop (the reverse pass runs it again)."""
        op = self.scope.verbatim(node)
        if not (op.ty[:1] in ("i", "u")):
            raise self.refuse(node, f"the loop bound {ast.unparse(node)} is not an integer")
        if op.name is not None or op.text.lstrip("-").isdigit() or (op.text.isidentifier() and op.text in op.reads):
            return op
        name = self.names.fresh("n")
        self.emit(Assign((name,), op.text, op.ty, self.line, expr_reads=op.reads))
        return Operand(name, op.ty, False, name, frozenset({name}))

    # ------------------------------------------------------------------ expressions
    def expr(self, node: ast.expr) -> Operand:
        """``node``'s value: a gradient-carrying float becomes SSA values, one per
        operation; anything else is kept as written (:meth:`Scope.verbatim`)."""
        ty, active = self.scope.info(node)
        if not (active and is_float(ty)):
            return self.scope.verbatim(node)
        if isinstance(node, ast.Name):
            return self.scope.env[node.id]
        if isinstance(node, ast.Subscript):
            return self.load(node, ty)
        if isinstance(node, ast.BinOp):
            return self.binop(node, ty)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.UAdd):
                return self.expr(node.operand)
            return self.apply(UNARY[type(node.op)], [self.expr(node.operand)], ty)
        if isinstance(node, ast.IfExp):
            return self.ifexp(node, ty)
        if isinstance(node, ast.Call):
            return self.call(node, ty)
        raise self.refuse(node, f"the expression {ast.unparse(node)} is not supported")  # pragma: no cover

    def load(self, node: ast.Subscript, ty: str) -> Operand:
        param: TensorParam = self.scope.params[node.value.id]
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        index = [self.scope.verbatim(p) for p in parts]
        half = param.dtype.name in ("float16", "bfloat16")
        name = self.new_float(f"{param.name}_v", ty, True)
        stmt = Load(name, param.name, tuple(i.text for i in index), frozenset().union(*(i.reads for i in index)),
                    ty, half, self.line, node, self.block)
        stmt.fresh = name
        self.emit(stmt)
        self.loads.append(stmt)
        return Operand(name, ty, True, name, frozenset({name}))

    def binop(self, node: ast.BinOp, ty: str) -> Operand:
        a, b = self.expr(node.left), self.expr(node.right)
        rule = BINARY.get(type(node.op))
        if rule is None:
            raise self.refuse(node, f"the operator in {ast.unparse(node)} is not differentiable")
        extra = {}
        if rule == "div" and a.const == 1.0:
            rule = "reciprocal"
        if rule == "pow" and not b.active:
            n = int_constant(node.right)
            if n:  # (x ** 0 is pow_exponent's: its derivative is 0, not 0 * x ** -1, NaN at x = 0)
                rule, extra = "pow_int", {"k": typed_constant(n, ty, self.helpers), "km1": str(n - 1)}
            else:
                rule = "pow_exponent"
        return self.apply(rule, [a, b], ty, extra)

    def call(self, node: ast.Call, ty: str) -> Operand:
        kind, value = self.scope.callee(node.func)
        args = [self.expr(a) for a in node.args]
        callee = ast.unparse(node.func)
        if kind == "math":
            return self.apply(MATH[value], args, ty, {"f": callee})
        if kind == "builtin" and value in (abs, min, max):
            rule = BUILTINS[value.__name__]
            if rule == "abs":
                return self.apply(rule, args, ty, {"f": callee})
            result = args[0]
            for arg in args[1:]:
                step_ty = promote(result.ty, arg.ty)
                result = self.apply(rule, [result, arg], step_ty, {"f": callee})
            return result
        # float(x), float32(x), real(x): a conversion (float16/bfloat16 ones become float32)
        if len(args) != 1:
            raise self.refuse(node, f"{callee}(...) takes one argument here")
        half = kind == "dtype" and value.name in ("float16", "bfloat16")
        f = self.helpers["f32"] if half else callee
        return self.apply("cast", args, ty, {"f": f})

    def ifexp(self, node: ast.IfExp, ty: str) -> Operand:
        test = self.condition(node.test)
        outer = self.block
        values = []
        blocks = []
        for kind, branch in (("body", node.body), ("orelse", node.orelse)):
            self.block = Block(kind, outer)
            try:
                values.append(self.materialize(self.expr(branch)))
            finally:
                blocks.append(self.block)
                self.block = outer
        target = self.new_float("t", ty, True)
        stmt = If(test, blocks[0], blocks[1], [Join(target, values[0], values[1], ty, True)], self.line, node)
        blocks[0].owner = blocks[1].owner = stmt
        self.emit(stmt)
        return Operand(target, ty, True, target, frozenset({target}))

    def apply(self, rule: str, args: list[Operand], ty: str, extra: dict | None = None) -> Operand:
        """One operation of :data:`~pnex_magic.adjoint.rules.RULES` on ``args``: a new SSA value."""
        extra = dict(extra or {})
        template = RULES[rule]
        values = {"a": args[0].text, **({"b": args[1].text} if len(args) > 1 else {}), **extra,
                  "math": self.helpers["math"]}
        name = self.new_float("t", ty, True)
        stmt = Assign((name,), fill(template.value, values), ty, self.line, rule, tuple(args), extra, True,
                      frozenset().union(*(a.reads for a in args)))
        stmt.fresh = name
        self.emit(stmt)
        return Operand(name, ty, True, name, frozenset({name}))


def _exclusive(a: Block, b: Block) -> bool:
    """Whether no run of a thread goes through both blocks: they lie in the two branches
    of one ``if``."""
    branches = {id(blk.owner): blk.kind for blk in a.ancestors() if blk.kind in ("body", "orelse")}
    return any(blk.kind in ("body", "orelse") and branches.get(id(blk.owner), blk.kind) != blk.kind
               for blk in b.ancestors())


def _check_overwrites(stores: list[Store], refuse: Refusal) -> None:
    """An output element written with ``=`` twice keeps the second value: only it gets the
    output's gradient.  Refuse what could do that: two ``=`` writes (or one and a ``+=``)
    of an output on one path, or a ``=`` write in a loop at an index without the loop's
    variable."""
    for s in stores:
        if not s.differentiable or s.op != "=":
            continue
        for blk in s.scope.ancestors():
            if blk.kind == "loop" and blk.owner.target not in s.index:
                raise refuse(s.line, f"it writes {s.tensor!r} with `=` in the loop at line {blk.owner.line} at "
                                          f"an index without the loop's variable: a later trip overwrites the value "
                                          f"an earlier one wrote")
        for other in stores:
            if other is not s and other.tensor == s.tensor and not _exclusive(s.scope, other.scope):
                raise refuse(max(s.line, other.line),
                             f"{s.tensor!r} is written at lines {min(s.line, other.line)} and "
                             f"{max(s.line, other.line)} on one path; pnex cannot tell whether one write "
                             f"overwrites the other (write each output element once, or accumulate with +=)")


def build_program(fdef: ast.FunctionDef, scope: Scope, names: Names, helpers: Mapping[str, str]) -> Program:
    """The statements of kernel ``fdef`` (:mod:`.ir`)."""
    builder = _Builder(scope, names, helpers)
    builder.statements(_fold_returns(list(fdef.body), scope.refuse))
    _check_overwrites(builder.stores, scope.refuse)
    return Program(builder.block, builder.loads, builder.stores, scope)
