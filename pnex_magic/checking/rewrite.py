"""The AST rewrite that makes a kernel's checked variant: each access becomes a helper call.

``SITE`` is the access's number in the sites the rewrite collects (:class:`~pnex_magic.checking.record.Site`)::

    x[i, j]                  ->  __pnex_load(x, __pnex_err, SITE, (i, j))
    x[i, j] = v              ->  __pnex_store(x, __pnex_err, SITE, (i, j), v)
    x[f(i)] += v             ->  __pnex_k0 = f(i)                 # the index once
                                 __pnex_store(x, __pnex_err, SITE, __pnex_k0,
                                              __pnex_load(x, __pnex_err, SITE, __pnex_k0) + v)
    cuda.atomic.add(x, i, v) ->  if __pnex_check(x, __pnex_err, SITE, i):
                                     cuda.atomic.add(x, i, v)     # as a statement;
                                 (cuda.atomic.add(x, i, v) if __pnex_check(x, __pnex_err, SITE, i)
                                  else __pnex_zero(x))            # where its result is used
    x[i][j]                  ->  __pnex_load(__pnex_load(x, __pnex_err, S1, i), __pnex_err, S2, j)
    pnex.vload(x, i, 4)      ->  __pnex_vload(x, __pnex_err, SITE, i, 4)   # and vstore
    tc.cp_async(d, i, s, j)  ->  __pnex_tc_cp_async(__pnex_err, SITE, d, i, s, j, True)

A tensor-core primitive that touches memory (:mod:`pnex_magic.checking.tc_helpers`)
becomes its checked form, its arguments bound to its parameters (defaults filled in);
each of its operands is a site, numbered from ``SITE`` in the order of
:data:`~pnex_magic.checking.tc_helpers.OPERANDS`.

``x`` is anything the kernel names: a parameter, a ``cuda.shared.array`` or
``cuda.local.array``, a global array, a tuple (the helpers decide by type, when Numba
types the call).  A subscript whose brackets hold a slice, ``...`` or ``None`` is left
as written (its bounds are clipped anyway, as in NumPy).

An access the source proves in bounds (:class:`~pnex_magic.checking.index_ranges.IndexRanges`)
is left as written and listed apart (:attr:`Rewriter.proven`).  The rewrite follows the
guards in statement order (:meth:`Rewriter.visit_block`) to know which facts hold where:
the test of an ``if`` in its body, the negation of ``if test: return`` after it, a
``range`` loop's bounds in its body, none about a name the region rebinds.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from ..tc.api import FUNCTIONS
from .guards import Fact
from .helpers import CHECK, LOAD, LOAD_ON_CHIP, RESERVED, STORE, VLOAD, VSTORE, ZERO
from .index_ranges import IndexRanges
from .record import ERR_PARAM, Site
from ..kernelsource import bound_names
from .tc_helpers import CHECKED, OPERANDS, helper_name

__all__ = ["Rewriter", "array_roles"]

_ATOMICS_WITH_INDEX = frozenset(
    {"add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax", "nanmin", "cas"}
)


def _name(id_: str) -> ast.Name:
    return ast.Name(id=id_, ctx=ast.Load())


def _bad_index(node: ast.AST) -> bool:
    """A slice, ``...``, ``None`` or ``*x`` among a subscript's indices."""
    parts = node.elts if isinstance(node, ast.Tuple) else [node]
    for p in parts:
        if isinstance(p, (ast.Slice, ast.Starred)):
            return True
        if isinstance(p, ast.Constant) and (p.value is Ellipsis or p.value is None):
            return True
    return False


def _simple(node: ast.AST) -> bool:
    """An expression that is cheap and pure to evaluate twice (no calls, no subscripts)."""
    allowed = (
        ast.Name, ast.Constant, ast.Attribute, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.Load,
        ast.operator, ast.unaryop,
    )
    return all(isinstance(n, allowed) for n in ast.walk(node))


def array_roles(fdef: ast.FunctionDef) -> dict[str, str]:
    """Locals bound to ``cuda.shared.array(...)`` / ``cuda.local.array(...)``: "shared
    array" or "local array"."""
    roles: dict[str, str] = {}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "array":
                owner = func.value
                kind = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if kind in ("shared", "local"):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            roles[target.id] = f"{kind} array"
    return roles


class Rewriter(ast.NodeTransformer):
    """Rewrites a kernel's statements (:meth:`visit_block` of its body).  ``lines``: the
    file's lines by number; ``params``: the kernel's parameters; ``roles``:
    :func:`array_roles`; ``ranges``: what the source proves."""

    def __init__(self, lines: dict[int, str], params: set[str], roles: dict[str, str], ranges: IndexRanges,
                 primitive_of: Callable[[ast.Call], str | None] | None = None):
        self.primitive_of = primitive_of  # the pnex.tc primitive a call names (None: none)
        self.lines = lines
        self.params = params
        self.roles = roles
        self.ranges = ranges
        self.sites: list[Site] = []  #: the checked accesses, numbered as the record's slot 1
        self.proven: list[Site] = []  #: the accesses left as written, proven in bounds
        self._proven_ids: dict[int, bool] = {}
        self.temps = 0
        self.facts: list[Fact] = []  # what the enclosing guards establish where the visit is

    # ------------------------------------------------------------------ guards
    def _holding(self, facts: list[Fact], region: list[ast.AST]) -> list[Fact]:
        """The facts still true throughout ``region``: none about a name it rebinds."""
        rebound = bound_names(region)
        return [f for f in facts if f.name not in rebound]

    @contextlib.contextmanager
    def _assuming(self, facts: list[Fact]) -> Iterator[None]:
        """``facts`` hold for what is visited inside; the facts added inside go at the end."""
        depth = len(self.facts)
        self.facts += facts
        try:
            yield
        finally:
            del self.facts[depth:]

    def visit_block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """Rewrite a list of statements; after ``if test: return`` (or ``continue``,
        ``break``, ``raise``), what ``test`` being false establishes holds for the rest."""
        out: list[ast.stmt] = []
        with self._assuming([]):
            for k, stmt in enumerate(stmts):
                after: list[Fact] = []
                if (isinstance(stmt, ast.If) and not stmt.orelse and stmt.body
                        and isinstance(stmt.body[-1], (ast.Return, ast.Continue, ast.Break, ast.Raise))):
                    # from the test as written (the visit below rewrites it)
                    after = self._holding(self.ranges.exit_facts(stmt.test), [stmt.test, *stmts[k + 1:]])
                new = self.visit(stmt)
                out.extend(new if isinstance(new, list) else [new] if new is not None else [])
                self.facts += after
        return out

    def visit_If(self, node: ast.If) -> ast.If:
        facts = self._holding(self.ranges.facts(node.test), [node.test, *node.body])  # from the test as written
        node.test = self.visit(node.test)
        with self._assuming(facts):
            node.body = self.visit_block(node.body)
        node.orelse = self.visit_block(node.orelse)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.IfExp:
        facts = self._holding(self.ranges.facts(node.test), [node.test, node.body])
        node.test = self.visit(node.test)
        with self._assuming(facts):
            node.body = self.visit(node.body)
        node.orelse = self.visit(node.orelse)
        return node

    def visit_For(self, node: ast.For) -> ast.For:
        facts = self._holding(self.ranges.loop_facts(node), list(node.body))
        node.target = self.visit(node.target)
        node.iter = self.visit(node.iter)
        with self._assuming(facts):
            node.body = self.visit_block(node.body)
        node.orelse = self.visit_block(node.orelse)
        return node

    def visit_While(self, node: ast.While) -> ast.While:
        node.test = self.visit(node.test)
        node.body = self.visit_block(node.body)
        node.orelse = self.visit_block(node.orelse)
        return node

    # ------------------------------------------------------------------ bookkeeping
    def _describe(self, node: ast.Subscript | ast.Call, variable: ast.expr, kind: str, index: int) -> Site:
        if isinstance(variable, ast.Name):
            role = "parameter" if variable.id in self.params else self.roles.get(variable.id, "")
        else:
            role = ""
        line = node.lineno
        return Site(index, ast.unparse(variable), line, self.lines.get(line, "").strip(), kind, role)

    def _site(self, node: ast.Subscript | ast.Call, variable: ast.expr, kind: str) -> ast.Constant:
        self.sites.append(self._describe(node, variable, kind, len(self.sites)))
        return ast.Constant(len(self.sites) - 1)

    def _proven(self, node: ast.Subscript, call: ast.Call | None = None) -> bool:
        """Whether the source proves this access (``call``: an atomic's, on ``node``'s array
        and index) in bounds; it is then left as written."""
        key = id(call if call is not None else node)
        found = self._proven_ids.get(key)
        if found is None:
            found = self._proven_ids[key] = self.ranges.in_bounds(node, self.facts)
            if found:
                kind = "atomic" if call is not None else "store" if isinstance(node.ctx, ast.Store) else "load"
                self.proven.append(self._describe(call or node, node.value, kind, len(self.proven)))
        return found

    def _proven_atomic(self, call: ast.Call, array: ast.expr, index: ast.expr | None) -> bool:
        if index is None:
            return False
        access = ast.copy_location(ast.Subscript(value=array, slice=index, ctx=ast.Load()), call)
        return self._proven(access, call)

    def _load_helper(self, variable: ast.expr) -> str:
        """The load helper for an array: on-chip (a shared or local array) or not."""
        on_chip = isinstance(variable, ast.Name) and self.roles.get(variable.id, "").startswith(("shared", "local"))
        return LOAD_ON_CHIP if on_chip and variable.id not in self.params else LOAD

    def _temp(self, value: ast.expr, where: ast.AST) -> tuple[ast.stmt, ast.Name]:
        """``__pnex_kN = value`` (placed at ``where``) and a load of the new name."""
        self.temps += 1
        name = f"{RESERVED}k{self.temps - 1}"
        assign = ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value), where)
        return assign, _name(name)

    def _checkable(self, node: ast.AST) -> bool:
        """A subscript of a plain name (or of a subscript of one) without slices, not
        proven in bounds."""
        if not isinstance(node, ast.Subscript) or _bad_index(node.slice) or self._proven(node):
            return False
        value = node.value
        while isinstance(value, ast.Subscript):  # x[i][j], x[0:2][k]: the view is checked too
            value = value.value
        return isinstance(value, ast.Name)

    def _call(self, helper: str, *args: ast.expr) -> ast.Call:
        return ast.Call(func=_name(helper), args=list(args), keywords=[])

    # ------------------------------------------------------------------ loads
    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if not isinstance(node.ctx, ast.Load) or not self._checkable(node):
            return self.generic_visit(node)
        site = self._site(node, node.value, "load")
        value = self.visit(node.value)
        index = self.visit(node.slice)
        return ast.copy_location(self._call(self._load_helper(node.value), value, _name(ERR_PARAM), site, index), node)

    # ------------------------------------------------------------------ stores
    def _store(self, target: ast.Subscript, value: ast.expr, kind: str = "store") -> ast.stmt:
        site = self._site(target, target.value, kind)
        call = self._call(STORE, self.visit(target.value), _name(ERR_PARAM), site, self.visit(target.slice), value)
        return ast.copy_location(ast.Expr(call), target)

    def _has_checked_target(self, target: ast.AST) -> bool:
        if isinstance(target, (ast.Tuple, ast.List)):
            return any(self._has_checked_target(t) for t in target.elts)
        return self._checkable(target)

    def _unpacking(self, target: ast.expr, later: list[tuple[ast.expr, str]]) -> ast.expr:
        """``target`` with each checked subscript in it replaced by a new name (listed in
        ``later`` with its subscript, to store after the unpacking)."""
        if self._checkable(target):
            self.temps += 1
            name = f"{RESERVED}k{self.temps - 1}"
            later.append((target, name))
            return ast.Name(id=name, ctx=ast.Store())
        if isinstance(target, (ast.Tuple, ast.List)):
            return type(target)(elts=[self._unpacking(e, later) for e in target.elts], ctx=ast.Store())
        return self.visit(target)

    def _assign_to(self, target: ast.expr, value: ast.expr, where: ast.stmt) -> list[ast.stmt]:
        if self._checkable(target):
            return [self._store(target, value)]
        if isinstance(target, (ast.Tuple, ast.List)) and self._has_checked_target(target):
            later: list[tuple[ast.expr, str]] = []
            unpack = ast.copy_location(ast.Assign(targets=[self._unpacking(target, later)], value=value), where)
            return [unpack, *(self._store(t, _name(name)) for t, name in later)]
        return [ast.copy_location(ast.Assign(targets=[self.visit(target)], value=value), where)]

    def visit_Assign(self, node: ast.Assign) -> Any:
        if not any(self._has_checked_target(t) for t in node.targets):
            return self.generic_visit(node)
        value = self.visit(node.value)
        out: list[ast.stmt] = []
        if len(node.targets) > 1:
            assign, value = self._temp(value, node)
            out.append(assign)
        for target in node.targets:
            out += self._assign_to(target, value, node)
        return out

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        if node.value is not None and self._checkable(node.target):
            return [self._store(node.target, self.visit(node.value))]
        return self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        if not self._checkable(target):
            return self.generic_visit(node)
        out: list[ast.stmt] = []
        site = self._site(target, target.value, "update")
        array = self.visit(target.value)
        index = self.visit(target.slice)
        if not _simple(array):  # evaluated once, read and written through the new name
            assign, array = self._temp(array, node)
            out.append(assign)
        if not _simple(index):
            assign, index = self._temp(index, node)
            out.append(assign)
        old = self._call(LOAD, array, _name(ERR_PARAM), site, index)
        new = ast.BinOp(left=old, op=node.op, right=self.visit(node.value))
        out.append(ast.copy_location(ast.Expr(self._call(STORE, array, _name(ERR_PARAM), site, index, new)), node))
        return out

    # ------------------------------------------------------------------ atomics and vectors
    def _atomic(self, call: ast.Call) -> tuple[ast.expr, ast.expr | None] | None:
        """(array, index) of a ``cuda.atomic.<op>(array, index, ...)`` call on a plain name."""
        func = call.func
        if not isinstance(func, ast.Attribute) or call.keywords or not call.args:
            return None
        owner = func.value
        if not ((isinstance(owner, ast.Attribute) and owner.attr == "atomic") or
                (isinstance(owner, ast.Name) and owner.id == "atomic")):
            return None
        if not isinstance(call.args[0], ast.Name):
            return None
        if func.attr == "compare_and_swap" and len(call.args) == 3:
            return call.args[0], None
        if func.attr in _ATOMICS_WITH_INDEX and len(call.args) >= 3 and not _bad_index(call.args[1]):
            return call.args[0], call.args[1]
        return None

    def _guarded_atomic(self, call: ast.Call) -> tuple[list[ast.stmt], ast.Call, ast.Call] | None:
        """For an atomic statement not proven in bounds: the statements that evaluate its
        index once, the atomic, and its check."""
        found = self._atomic(call)
        if found is None or self._proven_atomic(call, *found):
            return None
        array, index = found
        site = self._site(call, array, "atomic")
        args = [self.visit(a) for a in call.args]
        pre: list[ast.stmt] = []
        if index is None:
            check_index: ast.expr = ast.Constant(0)
        else:
            check_index = args[1]
            if not _simple(check_index):
                assign, check_index = self._temp(check_index, call)
                pre.append(assign)
                args[1] = _name(check_index.id)
        atomic = ast.copy_location(ast.Call(func=call.func, args=args, keywords=[]), call)
        check = ast.copy_location(self._call(CHECK, array, _name(ERR_PARAM), site, check_index), call)
        return pre, atomic, check

    def visit_Expr(self, node: ast.Expr) -> Any:
        if isinstance(node.value, ast.Call):
            guarded = self._guarded_atomic(node.value)
            if guarded is not None:
                pre, atomic, check = guarded
                body = [ast.copy_location(ast.Expr(atomic), node)]
                return [*pre, ast.copy_location(ast.If(test=check, body=body, orelse=[]), node)]
        return self.generic_visit(node)

    def _vector(self, call: ast.Call) -> str | None:
        """The checked helper for a ``pnex.vload(x, i, w)`` / ``pnex.vstore(x, i, v)``
        call (by name, as ``vload(...)`` too) on a plain name, else ``None``."""
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in ("vload", "vstore") or call.keywords or len(call.args) != 3:
            return None
        if not isinstance(call.args[0], ast.Name):
            return None
        return VLOAD if name == "vload" else VSTORE

    def _primitive(self, node: ast.Call) -> tuple[str, list[ast.expr]] | None:
        """(name, arguments bound to its parameters, defaults filled in) of a call of a
        tensor-core primitive the checked variant checks, else ``None`` (a call with
        ``*args``/``**kwargs`` or that does not bind is left to Numba's typing)."""
        name = self.primitive_of(node) if self.primitive_of is not None else None
        if name not in CHECKED:
            return None
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return None
        try:
            bound = inspect.signature(FUNCTIONS[name]).bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError:
            return None
        bound.apply_defaults()
        return name, [v if isinstance(v, ast.AST) else ast.Constant(v) for v in bound.arguments.values()]

    def _checked_primitive(self, node: ast.Call, name: str, args: list[ast.expr]) -> ast.Call:
        first = len(self.sites)
        for position, label, kind in OPERANDS[name]:
            site = self._describe(node, args[position], kind, len(self.sites))
            self.sites.append(dataclasses.replace(site, operand=f"pnex.tc.{name} {label}"))
        call = self._call(helper_name(name), _name(ERR_PARAM), ast.Constant(first), *(self.visit(a) for a in args))
        return ast.copy_location(call, node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        primitive = self._primitive(node)
        if primitive is not None:
            return self._checked_primitive(node, *primitive)
        helper = self._vector(node)
        if helper is not None:
            array, index, last = node.args
            site = self._site(node, array, "load" if helper == VLOAD else "store")
            args = [self.visit(array), _name(ERR_PARAM), site, self.visit(index), self.visit(last)]
            return ast.copy_location(self._call(helper, *args), node)
        found = self._atomic(node)
        if found is None or self._proven_atomic(node, *found):
            return self.generic_visit(node)
        return self._atomic_value(node, *found)

    def _atomic_value(self, node: ast.Call, array: ast.expr, index: ast.expr | None) -> ast.AST:
        """An atomic whose result is used: ``(atomic(x, i, v) if check(x, err, S, i) else
        zero(x))``.  Its index is evaluated twice (Numba 0.30 cannot type a walrus there):
        an index whose evaluation has side effects would see them twice."""
        site = self._site(node, array, "atomic")
        args = [self.visit(a) for a in node.args]
        check_index = ast.Constant(0) if index is None else self.visit(index)
        check = self._call(CHECK, array, _name(ERR_PARAM), site, check_index)
        atomic = ast.Call(func=node.func, args=args, keywords=[])
        zero = self._call(ZERO, array)
        return ast.copy_location(ast.IfExp(test=check, body=atomic, orelse=zero), node)


class _ProofWalk(Rewriter):
    """The rewriter's walk, recording where each access it asks about is proven in bounds."""

    def __init__(self, ranges: IndexRanges):
        super().__init__({}, set(), {}, ranges)
        self.found: set[tuple[int, int]] = set()

    def _proven(self, node: ast.Subscript, call: ast.Call | None = None) -> bool:
        found = super()._proven(node, call)
        if found and call is None:
            self.found.add((node.lineno, node.col_offset))
        return found


def proven_subscripts(fdef: ast.FunctionDef, ranges: IndexRanges) -> set[tuple[int, int]]:
    """``(line, column)`` of every array access (load or store) in ``fdef`` that the source proves in bounds
    where it is (each index in ``[0, n)``: never one Numba would wrap around), by the
    same proof as the checked variant's (the walk rewrites a copy: ``fdef`` is not changed)."""
    import copy

    walk = _ProofWalk(ranges)
    walk.visit_block(copy.deepcopy(fdef).body)
    return walk.found

