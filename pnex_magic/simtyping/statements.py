"""Typing and rewriting a kernel's statements: assignments, stores, and where paths
join.

A state maps each local variable to its :class:`~.values.Val`.  Where paths join
(after an ``if``, at a loop's head, after a loop) a variable that arrives with
different types has Numba's unified type there, as a phi node of Numba's SSA form
has: the rewrite converts it on each path that brings another type, at the path's
end (the end of a branch, before ``continue`` or ``break``, before the loop, in the
loop's ``else``).  A loop's head state is found by walking its body until it no
longer changes; only then is the body written.  Branches Numba removes at compile
time (:meth:`~.expressions.Expressions.static_truth`) are not typed, as Numba types
them not; they never run.
"""

from __future__ import annotations

import ast
import itertools
from typing import Any

from . import numba_types as T
from .calls import Calls
from .expressions import INPLACE, Expressions
from .values import NOCONST, SimulationError, Val, same_state

__all__ = ["Walker", "Loop"]

_MAX_ROUNDS = 32
_temp_names = itertools.count()


class Loop:
    """A loop being walked: the states its ``continue``/``break`` leave, and (once
    known) the states they go to."""

    def __init__(self, head: dict | None = None, exit: dict | None = None):
        self.head = head
        self.exit = exit
        self.breaks: list[dict] = []
        self.continues: list[dict] = []


class Walker(Calls, Expressions):
    """Types and rewrites one function for given parameter values."""

    def __init__(self, unit: Any, em: Any, namespace: dict, local_names: set[str], params: dict[str, Val],
                 return_type: Any = None):
        self.unit = unit
        self.em = em
        self.namespace = namespace
        self.local_names = local_names
        self.params = params
        self.return_type = return_type
        self.loops: list[Loop] = []
        self.returns: list[Val] = []
        self.recording = True
        #: variable -> types it was given (assigned or read) and types at joins (for the Numba cross-check)
        self.assigned: dict[str, set] = {}
        self.joined: dict[str, set] = {}

    # ------------------------------------------------------------------ bookkeeping

    def record(self, name: str, ty: Any, read: bool = False, merge: bool = False) -> None:
        if self.recording and ty is not None:
            (self.joined if merge else self.assigned).setdefault(name, set()).add(ty)

    def join(self, states: list[dict | None], where: ast.AST) -> dict | None:
        live = [s for s in states if s is not None]
        if not live:
            return None
        out: dict[str, Val] = {}
        for name in dict.fromkeys(k for s in live for k in s):
            vals = [s[name] for s in live if name in s]
            first = vals[0]
            unbound = len(vals) < len(live) or any(v.unbound for v in vals)
            if all(v is first for v in vals) and not (unbound and not first.unbound):
                out[name] = first
                continue
            unified = T.unify(*(v.ty for v in vals))
            if unified is None:
                shown = ", ".join(sorted({str(v.ty) for v in vals}))
                raise self.em.fail(where, f"the variable {name!r} has types {shown} on the paths that meet here, "
                                          "which Numba cannot unify", typing=True)
            self.record(name, unified, merge=True)
            if unbound:  # held however each path left it: its uses convert it
                out[name] = Val(unified, unbound=True, elems=tuple(Val(e) for e in unified)
                                if isinstance(unified, T.nb().BaseTuple) else None)
            elif T.is_scalar(unified):
                # Where the paths bring it held differently, it is converted on them to a NumPy scalar
                # of its type (once per path taken), so that its uses need no conversion.
                py = all(v.py for v in vals) and not any(T.unliteral(v.ty) != T.unliteral(unified) for v in vals)
                out[name] = Val(unified, exact=not py, py=py)
            elif isinstance(unified, T.nb().BaseTuple):
                out[name] = Val(unified, elems=tuple(Val(e) for e in unified))
            else:
                out[name] = Val(unified)
        return out

    def edge(self, source: dict | None, target: dict | None, where: ast.AST) -> list[ast.stmt]:
        """The conversions on a path from ``source`` into the join ``target``."""
        if source is None or target is None:
            return []
        out = []
        for name, to in target.items():
            src = source.get(name)
            if src is None or src is to or src.unbound or to.unbound:
                continue
            if to.scalar and to.exact and src.scalar and self.em.needs(src, to.ty):
                value = self.em.convert(ast.Name(id=name, ctx=ast.Load()), src, to.ty)
            elif isinstance(to.ty, T.nb().BaseTuple) and src.ty != to.ty and isinstance(src.ty, T.nb().BaseTuple):
                value = self.tuple_cast(ast.Name(id=name, ctx=ast.Load()), src, to.ty)
            else:
                continue
            out.append(ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value), where))
        return out

    def tuple_cast(self, node: ast.expr, src: Val, to: Any) -> ast.expr:
        elems = src.elems or tuple(Val(e) for e in src.ty)
        keys = tuple(self.em.converter_key(v, t) if T.is_scalar(t) else None for v, t in zip(elems, to))
        return self.em.call(self.em.helper(("tuple", keys), "tuple_cast"), [node], node)

    # ------------------------------------------------------------------ blocks

    def block(self, stmts: list[ast.stmt], state: dict | None) -> tuple[list[ast.stmt], dict | None]:
        out: list[ast.stmt] = []
        for s in stmts:
            if state is None:  # unreachable: it never runs, Numba drops it
                out.append(s)
                continue
            method = getattr(self, "s_" + type(s).__name__, None)
            if method is None:
                raise self.em.fail(s, f"a {type(s).__name__} statement")
            try:
                new, state = method(s, dict(state))
            except T.TypingFailure as exc:
                raise self.em.fail(s, str(exc), typing=True) from None
            except SimulationError as exc:
                raise self.em.fail(s, str(exc)) from None
            out.extend(new)
        return out, state

    def quiet(self):
        """A context in which walks record nothing (a loop's rounds before the last)."""
        walker = self

        class _Quiet:
            def __enter__(self):
                self.saved = walker.recording
                walker.recording = False

            def __exit__(self, *exc):
                walker.recording = self.saved

        return _Quiet()

    # ------------------------------------------------------------------ simple statements

    def s_Pass(self, s, state):
        return [s], state

    def s_Expr(self, s, state):
        node, _ = self.expr(s.value, state)
        return [ast.copy_location(ast.Expr(value=node), s)], state

    def s_Raise(self, s, state):
        return [s], None

    def s_Assert(self, s, state):
        test, _ = self.condition(s.test, state)
        return [ast.copy_location(ast.Assert(test=test, msg=s.msg), s)], state

    def s_Return(self, s, state):
        if s.value is None:
            self.returns.append(Val(T.nb().none))
            return [s], None
        node, val = self.expr(s.value, state)
        self.returns.append(val)
        target = self.return_type
        if target is not None and T.is_scalar(target) and val.scalar:
            node = self.em.convert(node, val, target)
        elif target is not None and isinstance(target, T.nb().BaseTuple) and val.ty != target:
            node = self.tuple_cast(node, val, target)
        return [ast.copy_location(ast.Return(value=node), s)], None

    def s_Break(self, s, state):
        loop = self.loops[-1]
        loop.breaks.append(state)
        return self.edge(state, loop.exit, s) + [s], None

    def s_Continue(self, s, state):
        loop = self.loops[-1]
        loop.continues.append(state)
        return self.edge(state, loop.head, s) + [s], None

    # ------------------------------------------------------------------ assignments

    def s_Assign(self, s, state):
        node, val = self.expr(s.value, state)
        targets = s.targets
        if len(targets) == 1:
            return self.assign(targets[0], node, val, state, s), state
        temp = f"__pnex_sim_value_{next(_temp_names)}"
        out = [ast.copy_location(ast.Assign(targets=[ast.Name(id=temp, ctx=ast.Store())], value=node), s)]
        for target in targets:
            out += self.assign(target, ast.Name(id=temp, ctx=ast.Load()), val, state, s)
        return out, state

    def s_AnnAssign(self, s, state):
        if s.value is None:
            return [s], state
        node, val = self.expr(s.value, state)
        return self.assign(s.target, node, val, state, s), state

    def assign(self, target: ast.expr, node: ast.expr, val: Val, state: dict, s: ast.stmt) -> list[ast.stmt]:
        """``target = node`` (whose value is ``val``), ``state`` updated in place."""
        def stmt(t: ast.expr, v: ast.expr) -> ast.stmt:
            return ast.copy_location(ast.Assign(targets=[t], value=v), s)

        if isinstance(target, ast.Name):
            state[target.id] = val
            self.record(target.id, val.ty)
            return [stmt(ast.Name(id=target.id, ctx=ast.Store()), node)]
        if isinstance(target, (ast.Tuple, ast.List)):
            elems = self.unpacked(val, len(target.elts), s)
            if all(isinstance(t, ast.Name) for t in target.elts):
                for t, v in zip(target.elts, elems):
                    state[t.id] = v
                    self.record(t.id, v.ty)
                return [stmt(target, node)]
            temp = f"__pnex_sim_value_{next(_temp_names)}"
            out = [stmt(ast.Name(id=temp, ctx=ast.Store()), node)]
            for k, (t, v) in enumerate(zip(target.elts, elems)):
                item = ast.Subscript(value=ast.Name(id=temp, ctx=ast.Load()), slice=ast.Constant(value=k), ctx=ast.Load())
                out += self.assign(t, ast.copy_location(item, s), v, state, s)
            return out
        if isinstance(target, ast.Subscript):
            return [stmt(*self.store(target, node, val, state))]
        if isinstance(target, ast.Attribute):
            base_node, base = self.expr(target.value, state)
            sig = T.resolve_setattr(base.ty, target.attr, val.ty)
            value = self.em.convert(node, val, sig.args[1]) if val.scalar and T.is_scalar(sig.args[1]) else node
            new = ast.Attribute(value=base_node, attr=target.attr, ctx=ast.Store())
            return [stmt(ast.copy_location(new, target), value)]
        raise SimulationError(f"an assignment to a {type(target).__name__}")

    def unpacked(self, val: Val, count: int, where: ast.AST) -> tuple[Val, ...]:
        """The values of ``a, b, ... = val`` (Numba's ``exhaust_iter``)."""
        t = T.nb()
        if isinstance(val.ty, t.BaseTuple):
            if len(val.ty) != count:
                raise T.TypingFailure(f"cannot unpack {val.ty} into {count} values")
            return val.elems if val.elems is not None else tuple(Val(e) for e in val.ty)
        if isinstance(val.ty, t.IterableType):
            item = val.ty.iterator_type.yield_type
            return tuple(Val(item, exact=T.is_scalar(item) and isinstance(val.ty, t.Array)) for _ in range(count))
        raise T.TypingFailure(f"cannot unpack {val.ty}")

    def store(self, target: ast.Subscript, node: ast.expr, val: Val, state: dict) -> tuple[ast.expr, ast.expr]:
        """``target[index] = node``: the value converted as Numba's store converts it
        (to the signature's type, then to the array's)."""
        from .expressions import const_of

        base_node, base = self.expr(target.value, state)
        t = T.nb()
        index = const_of(target.slice)
        if index is not NOCONST and isinstance(base.ty, t.Record):
            sig = T.resolve_setitem(base.ty, T.nb().literal(index), val.ty, static=index)
            idx_node = target.slice
            dtype = sig.args[2]
        else:
            idx_node, idx = self.expr(target.slice, state)
            sig = T.resolve_setitem(base.ty, idx.ty, val.ty)
            dtype = getattr(base.ty, "dtype", None)
        value = node
        if dtype is not None and _stores_exactly(val, dtype):
            pass  # NumPy's store converts it as Numba does
        elif val.scalar and T.is_scalar(sig.args[2]):
            value = self.em.convert(node, val, sig.args[2])
            if dtype is not None and T.is_scalar(dtype) and T.unliteral(dtype) != T.unliteral(sig.args[2]):
                value = self.em.convert(value, Val(sig.args[2], exact=True), dtype)
        new = ast.copy_location(ast.Subscript(value=base_node, slice=idx_node, ctx=ast.Store()), target)
        return new, value

    def s_AugAssign(self, s, state):
        fn = INPLACE[type(s.op)]
        value_node, value = self.expr(s.value, state)
        target = s.target
        if isinstance(target, ast.Name):
            load = ast.copy_location(ast.Name(id=target.id, ctx=ast.Load()), target)
            cur_node, cur = self.expr(load, state)
            sig = T.resolve_call(fn, (cur.ty, value.ty))
            node, val = self.binop(s, fn, sig, cur_node, cur, value_node, value)
            state[target.id] = val
            self.record(target.id, val.ty)
            return [ast.copy_location(ast.Assign(targets=[ast.Name(id=target.id, ctx=ast.Store())], value=node), s)], \
                state
        if isinstance(target, ast.Subscript):
            pre: list[ast.stmt] = []
            if not _simple(target):  # the array and the index evaluated once, first, as Python does
                parts = []
                for part in (target.value, target.slice):
                    name = f"__pnex_sim_part_{next(_temp_names)}"
                    node, val = self.expr(part, state)
                    pre.append(ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=node), s))
                    state[name] = val
                    parts.append(ast.copy_location(ast.Name(id=name, ctx=ast.Load()), part))
                target = ast.copy_location(ast.Subscript(value=parts[0], slice=parts[1], ctx=ast.Store()), target)
                value_node, value = self.expr(s.value, state)
            load = ast.copy_location(ast.Subscript(value=target.value, slice=target.slice, ctx=ast.Load()), target)
            cur_node, cur = self.expr(load, state)
            sig = T.resolve_call(fn, (cur.ty, value.ty))
            node, val = self.binop(s, fn, sig, cur_node, cur, value_node, value)
            store_target, stored = self.store(target, node, val, state)
            return pre + [ast.copy_location(ast.Assign(targets=[store_target], value=stored), s)], state
        raise SimulationError(f"an augmented assignment to a {type(target).__name__}")

    # ------------------------------------------------------------------ control flow

    def s_If(self, s, state):
        test, _ = self.condition(s.test, state)
        taken = self.static_truth(s.test, state)
        if taken is True:
            body, out = self.block(s.body, dict(state))
            return [ast.copy_location(ast.If(test=test, body=body or [ast.Pass()], orelse=s.orelse), s)], out
        if taken is False:
            orelse, out = self.block(s.orelse, dict(state))
            return [ast.copy_location(ast.If(test=test, body=s.body, orelse=orelse), s)], out
        body, b_out = self.block(s.body, dict(state))
        orelse, e_out = self.block(s.orelse, dict(state))
        joined = self.join([b_out, e_out], s)
        body = body + self.edge(b_out, joined, s)
        orelse = orelse + self.edge(e_out, joined, s)
        return [ast.copy_location(ast.If(test=test, body=body or [ast.Pass()], orelse=orelse), s)], joined

    def s_For(self, s, state):
        iter_node, it = self.expr(s.iter, state)
        item = self.iteration(it)
        return self.loop(s, state, item, iter_node)

    def s_While(self, s, state):
        return self.loop(s, state, None, None)

    def iteration(self, it: Val) -> Val:
        """The value a ``for`` loop's target takes (Numba's ``getiter``/``iternext``)."""
        t = T.nb()
        if isinstance(it.ty, t.BaseTuple) and it.elems is not None and len(set(it.ty)) == 1:
            return Val(it.ty[0], exact=all(e.exact for e in it.elems))
        sig = T.resolve_call("getiter", (it.ty,))
        item = sig.return_type.yield_type
        exact = isinstance(it.ty, t.Array) and T.is_scalar(item)
        py = isinstance(it.ty, t.RangeType)  # range() of NumPy or Python ints yields Python ints
        if isinstance(item, t.BaseTuple):
            return Val(item, elems=tuple(Val(e, exact=exact and T.is_scalar(e)) for e in item))
        return Val(item, exact=exact, py=py and T.is_scalar(item))

    def loop(self, s: ast.For | ast.While, entry: dict, item: Val | None, iter_node: ast.expr | None):
        is_for = isinstance(s, ast.For)

        def walk_body(head: dict, loop: Loop) -> tuple[list, dict | None, list]:
            body_state = dict(head)
            pre: list = []
            if is_for:
                pre = self.assign(s.target, ast.Name(id="__pnex_sim_item", ctx=ast.Load()), item, body_state, s)
            else:
                self.condition(s.test, body_state)
                if self.static_truth(s.test, body_state) is False:
                    return [], None, pre
            self.loops.append(loop)
            try:
                body, end = self.block(s.body, body_state)
            finally:
                self.loops.pop()
            return body, end, pre

        head = entry
        with self.quiet():
            for _ in range(_MAX_ROUNDS):
                loop = Loop()
                _, end, _ = walk_body(head, loop)
                new_head = self.join([entry, end, *loop.continues], s)
                if same_state(new_head, head):
                    break
                head = new_head
            else:
                raise SimulationError("the types of the loop's variables never settle")
            always = not is_for and self.static_truth(s.test, head) is True
            _, normal = self.block(s.orelse, dict(head)) if not always else ([], None)
            exit_state = self.join([normal, *loop.breaks], s)
        loop = Loop(head=head, exit=exit_state)
        body, end, _ = walk_body(head, loop)
        body = body + self.edge(end, head, s)
        orelse, normal = self.block(s.orelse, dict(head)) if not always else (s.orelse, None)
        orelse = orelse + self.edge(normal, exit_state, s)
        pre = self.edge(entry, head, s)
        if is_for:
            if is_for and isinstance(s.target, ast.Name):
                self.record(s.target.id, item.ty)
            target = s.target
            iterable = iter_node
            if pre:  # the iterable is made before the conversions, as Numba makes it before the loop's head
                temp = f"__pnex_sim_iter_{next(_temp_names)}"
                pre = [ast.copy_location(ast.Assign(targets=[ast.Name(id=temp, ctx=ast.Store())], value=iter_node),
                                         s)] + pre
                iterable = ast.Name(id=temp, ctx=ast.Load())
            new = ast.For(target=target, iter=iterable, body=body or [ast.Pass()], orelse=orelse)
        else:
            test, _ = self.condition(s.test, head)
            new = ast.While(test=test, body=body or [ast.Pass()], orelse=orelse)
        return pre + [ast.copy_location(new, s)], exit_state


def _stores_exactly(val: Val, dtype: Any) -> bool:
    """Whether NumPy's store of ``val`` into an array of ``dtype`` converts it as
    Numba's does: the same type; a float into a float array (rounded to nearest); a
    Python float; a Python int (or bool) whose type's range the array's holds."""
    import numpy as np

    rep = val.rep
    if rep is None or not T.is_scalar(dtype) or T.is_bf16(dtype):
        return False
    target = np.dtype(T.runtime_dtype(dtype))
    if rep[0] == "np":
        source = np.dtype(rep[1])
        return source == target or (source.kind == "f" and target.kind == "f")
    if rep[1] == "float":
        return target.kind == "f"
    if rep[1] == "bool":
        return target.kind in "iub"
    if target.kind not in "iu":
        return False
    ty = T.unliteral(val.ty)
    info = np.iinfo(target)
    source = np.iinfo(T.runtime_dtype(ty))
    return info.min <= source.min and source.max <= info.max


def _simple(node: ast.AST) -> bool:
    """No calls: the expression may be evaluated twice."""
    return not any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Yield)) for n in ast.walk(node))
